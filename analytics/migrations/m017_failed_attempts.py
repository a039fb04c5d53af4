"""Version 17: which attempts a request's failures name, so a replaced attempt's is no outcome.

A ``failed`` of an attempt that a newer one replaced (the router resumed the request: its
worker only slow to heart-beat) is no state of the request, as the router, the streams and the
audit take it: the newer attempt goes on. The reports (``analytics/outcomes.py``) read a
request's failures from ``request_outcomes.events``, one bit for all of them, and took any as
the request's: a request whose continuation its client then cancelled was ``failed``, not
``cancelled``, and one whose continuation still ran was ``failed``, not ``unfinished`` (the cost
report charged its time as a finished request's, not in flight).

``failed_attempts`` packs each ``failed`` event's attempt and worker as ``last_attempt`` packs
a ``started`` one (the attempt 0 where a writer older than 7 Dec named none; the key of ``''``
where it names no worker), so that the reports tell a replaced attempt's failure as the audit
does: by its attempt, below the newest started one, or where it names none, by its worker, not
the newest attempt's. An array (``groupArrayArray``: merging concatenates them). Rows written
before this version have none: any failure is the request's, as before. The view is recreated
with the new column; nothing is inserted while migrations run.
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
    _AFTER, _AFTER + f"\n       groupArrayIf({_PACKED}, type = 'failed') AS failed_attempts,")

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS failed_attempts
        SimpleAggregateFunction(groupArrayArray, Array(UInt64)) AFTER last_attempt""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V17,
]
