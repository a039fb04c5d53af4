"""Analytics: every topic in ClickHouse, each record once, and SQL over it.

- ``migrations/``: the versioned schema (tables, TTLs, rollups); ``schema.py``: what the sink
  inserts; ``rows.py``: record -> row; ``batch.py`` and ``journal.py``: exactly-once writes;
- ``sink.py`` (+ ``ranges.py``): the Kafka consumer; ``service.py``: ``governor sink``;
- ``store.py``: embedded chdb or a ClickHouse server; ``endpoint.py`` and ``guard.py``: the
  read-only SQL endpoint; ``query.py``: ``governor sql``;
- ``reports.py``, ``outcomes.py``, ``cost.py``, ``audit.py``: ``governor report``;
- ``progress.py`` and ``synthetic.py``: catching up, counting rows and test histories.
"""
