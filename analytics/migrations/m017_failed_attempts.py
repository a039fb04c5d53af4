"""Version 17: which attempts a request's failures name, so a replaced attempt's is no outcome.

A ``failed`` of an attempt that a newer one replaced (the router resumed the request: its
worker only slow to heart-beat) is no state of the request, as the router, the streams and the
audit take it: the newer attempt goes on. The reports (``analytics/outcomes.py``) read a
request's failures from ``request_outcomes.events``, one bit for all of them, and took any as
the request's: a request whose continuation its client then cancelled was ``failed``, not
``cancelled``, and one whose continuation still ran was ``failed``, not ``unfinished`` (the cost
report charged its time as a finished request's, not in flight).

``failed_attempts`` holds each ``failed`` event's attempt and worker, packed as ``last_attempt``
packs a ``started`` one (the attempt 0 where a writer older than 7 Dec named none; the key of
``''`` where it names no worker), with its reason, so that the reports tell a replaced
attempt's failure as the audit does (by its attempt, below the newest started one, or where it
names none, by its worker, not the newest attempt's) and give a failed request the reason of a
failure of its own (``reason``, the greatest of all its failures', may be a replaced
attempt's). An array (``groupArrayArray``: merging concatenates them). ``failures_named``: 1
in every row this version writes, 0 (the column's default) in rows written before it, so the
least of a request's is 0 where any of its events was stored before this version: its
failures are then judged as before (any failure is the request's, ``reason`` its reason),
since ``failed_attempts`` lacks those stored before. The view is recreated with the new
columns; nothing is inserted while migrations run.
"""

from analytics.migrations.m003_last_attempt import WORKER_KEY
from analytics.migrations.m016_request_ttft import REQUEST_OUTCOMES_VIEW_V16

_AFTER = "AS last_attempt,"
if REQUEST_OUTCOMES_VIEW_V16.count(_AFTER) != 1:
    raise RuntimeError("m017 extends the request_outcomes view of m016 after last_attempt")

_PACKED = ("bitShiftLeft(toUInt64(attempt), 48) + "
           + WORKER_KEY.format(worker="request_events.worker_id"))

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V17 = REQUEST_OUTCOMES_VIEW_V16.replace(
    _AFTER, _AFTER + f"\n       groupArrayIf(({_PACKED}, request_events.reason), type = 'failed')"
    " AS failed_attempts,\n       toUInt8(1) AS failures_named,")

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS failed_attempts
        SimpleAggregateFunction(groupArrayArray, Array(Tuple(UInt64, String)))
        AFTER last_attempt""",
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS failures_named SimpleAggregateFunction(min, UInt8)
        AFTER failed_attempts""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V17,
]
