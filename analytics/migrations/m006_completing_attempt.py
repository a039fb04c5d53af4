"""Version 6: the worker of a request's newest completing attempt.

A request whose replaced attempt (its worker only slow to heart-beat) completed as well as the
attempt that replaced it has two ``completed`` events. The reports charged it to ``worker_id``,
the greater of the two workers' ids, which could name the replaced attempt's worker and so the
wrong pool. A reader takes the newest attempt's answer (README, "Reading a response stream"),
and the reports now charge that attempt's worker: ``request_outcomes.completed_attempt`` packs
the attempt and the worker's key of each ``completed`` event as ``last_attempt`` does for
``started`` ones, so its maximum names the newest completing attempt's worker (0 in rows written
before this version: they fall back to ``worker_id``, as before).
"""

from analytics.migrations.m003_last_attempt import packed_attempt
from analytics.migrations.m005_first_completion import REQUEST_OUTCOMES_VIEW_V5

_AFTER = "AS completed_at,"
if REQUEST_OUTCOMES_VIEW_V5.count(_AFTER) != 1:
    raise RuntimeError("m006 extends the request_outcomes view of m005 after completed_at")

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V6 = REQUEST_OUTCOMES_VIEW_V5.replace(
    _AFTER, _AFTER + "\n       " + packed_attempt("completed") + " AS completed_attempt,")

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS completed_attempt SimpleAggregateFunction(max, UInt64)
    AFTER completed_at""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V6,
]
