"""Version 4: ``request_outcomes`` ordered by when each request was created.

Before this version the rollup was ordered by a hash of the request id alone, so every part's key
range covered the whole table and ``FINAL`` had to merge every row of every part, whether or not
a request had rows in two of them. Ordered by ``(created, request_key)``, a part holds the
requests created in the time it covers; parts overlap only where their requests' lives did, and
``FINAL`` merges only those ranges. On the 10M-event store of ``benchmarks.analytics_queries``
as inserted, a ``FINAL`` read of the rollup's string and time columns took 0.33 s before and
0.07 s after (0.05 s without ``FINAL``), and the cost report, which reads it twice, 1.57 s
before and 0.51-0.62 s after (README).

Every row of one request must carry the same key, so the key is the request's own
``created_ms``, which every lifecycle event carries from this version on (``RequestEvent``). An
event without it, as producers before this version wrote them, keys on 0: the rows of a request
whose events all lack it still merge (as before this version, without the speed), but a request
with events of both kinds has two rows, which the reports count as two. That happens only to
requests in flight across the upgrade from an earlier version (its messages' schemas forbid
unknown fields, so Governor's components are upgraded together).

The table cannot be re-keyed in place: the migration copies the rows into a new table, each
with its request's ``created`` from ``request_events`` (0 when those rows have expired), and
exchanges the two tables. A migration interrupted half-way runs again from its first statement:
the copy is skipped once the table has been exchanged (copying twice would do no harm either,
as every column keeps a maximum, minimum or ``any``), and so is the exchange.
"""

from analytics.migrations import m002_rollups
from analytics.migrations.m003_last_attempt import REQUEST_OUTCOMES_VIEW_V3

_UNKEYED = "toDateTime64(0, 3)"

_COLUMNS = ("request_key, request_id, tenant, model, task_id, task_key, priority, step, "
            "steps_total, ttft_slo_s, first_seen, events, deadline, started_at, finished_at, "
            "reason, worker_id, last_worker_id, last_attempt, ttft_s, e2e_s, prompt_tokens, "
            "output_tokens, cached_tokens")

#: Nonzero once ``request_outcomes`` is the table this version creates.
EXCHANGED = """
SELECT count() FROM system.columns
WHERE database = currentDatabase() AND table = 'request_outcomes' AND name = 'created'"""

_KEY = "SELECT cityHash64(request_events.request_id) AS request_key,"
if _KEY not in REQUEST_OUTCOMES_VIEW_V3 or "GROUP BY request_key" not in REQUEST_OUTCOMES_VIEW_V3:
    raise RuntimeError("m004 re-keys the request_outcomes view of m003")

REQUEST_OUTCOMES_VIEW_V4 = REQUEST_OUTCOMES_VIEW_V3.replace(
    _KEY, f"SELECT ifNull(request_events.created, {_UNKEYED}) AS created,\n"
          "       cityHash64(request_events.request_id) AS request_key,").replace(
    "GROUP BY request_key", "GROUP BY created, request_key")

_TABLE_V2 = next(s for s in m002_rollups.STATEMENTS
                 if "CREATE TABLE IF NOT EXISTS request_outcomes (" in s)
_EDITS = (  # version 2's table, keyed by creation, with version 3's column
    ("CREATE TABLE IF NOT EXISTS request_outcomes (",
     "CREATE TABLE IF NOT EXISTS request_outcomes_v4 (\n    created DateTime64(3),"),
    ("    last_worker_id SimpleAggregateFunction(max, LowCardinality(String)),\n",
     "    last_worker_id SimpleAggregateFunction(max, LowCardinality(String)),\n"
     "    last_attempt SimpleAggregateFunction(max, UInt64),\n"),
    ("ORDER BY request_key\n", "ORDER BY (created, request_key)\n"),
)
CREATE_TABLE = _TABLE_V2
for _old, _new in _EDITS:
    if _old not in CREATE_TABLE:
        raise RuntimeError(f"m004 expects {_old!r} in the request_outcomes table of m002")
    CREATE_TABLE = CREATE_TABLE.replace(_old, _new)

COPY = f"""
INSERT INTO request_outcomes_v4 (created, {_COLUMNS})
SELECT ifNull(known.first_created, {_UNKEYED}), {', '.join(f'o.{c}' for c in _COLUMNS.split(', '))}
FROM request_outcomes AS o
LEFT JOIN (SELECT cityHash64(request_id) AS request_key, min(created) AS first_created
           FROM request_events
           WHERE created IS NOT NULL AND type != 'cancel_request'
           GROUP BY request_key) AS known ON o.request_key = known.request_key"""

STATEMENTS = [
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    CREATE_TABLE,
    (EXCHANGED, COPY),
    (EXCHANGED, "EXCHANGE TABLES request_outcomes AND request_outcomes_v4"),
    "DROP TABLE IF EXISTS request_outcomes_v4",
    REQUEST_OUTCOMES_VIEW_V4,
]
