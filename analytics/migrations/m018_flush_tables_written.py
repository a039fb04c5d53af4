"""Version 18: the sink's journal records which tables of a flush it has written.

``sink_flushes.written``: the tables with materialized views whose inserts of the flush have
returned, their views' parts committed with them; the flush's row is written again (the table
keeps a key's last row) as each one returns. A flush written again after a crash inserts nothing
more into them. It relied on the inserts' dedup tokens alone, and the store keeps the last
1,000 tokens of a table only (``non_replicated_deduplication_window``): a flush written again
after more inserts than that into its tables (the other sinks of the store writing on
meanwhile) was inserted again whole, and the rollups counted its records twice
(``analytics/journal.py``). Rows of earlier versions have none written.
"""

STATEMENTS = [
    """
ALTER TABLE sink_flushes
    ADD COLUMN IF NOT EXISTS written Array(LowCardinality(String)) AFTER finished""",
]
