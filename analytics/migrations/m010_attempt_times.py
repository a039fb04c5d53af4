"""Version 10: when each attempt of a request started and ended, for the cost report.

The cost report charged a request's GPU time from its first ``started`` (any attempt) to its
last terminal event, all of it to the pool of the worker it ended on: a request resumed on
another pool charged that pool with its first attempt's time and the requeue gap, and a
replaced attempt that completed late stretched the time. It now charges each attempt where and
while it ran (``analytics/cost.py``), from three columns of ``request_outcomes``:

- ``attempt_starts``: each ``started`` event as ``(attempt and worker, ms)``: the attempt packed
  with its worker's key as ``last_attempt`` packs them, and the event's time in ms;
- ``attempt_ends``: each ``requeued`` and ``completed`` event, the same way (an attempt's own
  end: both name the attempt and its worker);
- ``first_finished_at``: the first terminal event's time (``failed`` and ``cancelled`` name no
  attempt: they end the attempt that was running).

Arrays (``groupArrayArray``: merging concatenates them), read by the cost report from the rollup
it reads already. Grouped from ``request_events`` by request at query time, the same attempts
took 1.11 CPU-s alone on the 10M-event store of ``benchmarks.analytics_queries``, about what the
whole report took before (1.13 CPU-s; README).

Rows written before this version have none: the report charges them as before, from the first
``started`` to the last terminal event, where they ended. A request in flight across the
upgrade is charged for the attempts it started after it (as before if none). The view is
recreated with the new columns; nothing is inserted while migrations run.
"""

from analytics.migrations.m003_last_attempt import WORKER_KEY
from analytics.migrations.m006_completing_attempt import REQUEST_OUTCOMES_VIEW_V6

_AFTER_FINISHED = "AS finished_at,"
_AFTER_COMPLETING = "AS completed_attempt,"
for _anchor in (_AFTER_FINISHED, _AFTER_COMPLETING):
    if REQUEST_OUTCOMES_VIEW_V6.count(_anchor) != 1:
        raise RuntimeError(f"m010 extends the request_outcomes view of m006 after {_anchor!r}")


def _attempt_times(condition: str) -> str:
    """Each event that meets ``condition`` as ``(packed attempt, time in ms)``."""
    packed = ("bitShiftLeft(toUInt64(attempt), 48) + "
              + WORKER_KEY.format(worker="request_events.worker_id"))
    return f"groupArrayIf(({packed}, toUnixTimestamp64Milli(time)), {condition})"


#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V10 = REQUEST_OUTCOMES_VIEW_V6.replace(
    _AFTER_FINISHED, _AFTER_FINISHED + "\n       minIf(toNullable(time), type IN "
    "('completed', 'failed', 'rejected', 'cancelled')) AS first_finished_at,").replace(
    _AFTER_COMPLETING, _AFTER_COMPLETING
    + "\n       " + _attempt_times("type = 'started'") + " AS attempt_starts,"
    + "\n       " + _attempt_times("type IN ('requeued', 'completed')") + " AS attempt_ends,")

_ATTEMPT_TIMES = "SimpleAggregateFunction(groupArrayArray, Array(Tuple(UInt64, Int64)))"

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS first_finished_at
        SimpleAggregateFunction(min, Nullable(DateTime64(3))) AFTER finished_at""",
    f"""
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS attempt_starts {_ATTEMPT_TIMES} AFTER completed_attempt""",
    f"""
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS attempt_ends {_ATTEMPT_TIMES} AFTER attempt_starts""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V10,
]
