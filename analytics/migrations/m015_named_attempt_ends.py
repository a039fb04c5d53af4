"""Version 15: a ``failed`` or ``cancelled`` that names its attempt ends that attempt only.

The cost report (``analytics/cost.py``) ends each attempt at its own ``requeued`` or
``completed`` (``attempt_ends``, version 10), or else at the request's first terminal event:
``failed`` and ``cancelled`` named no attempt, so they ended the one running. Since 7 Dec they
name it (``request_events.attempt``, 0 where a writer older than the field named none), and the
first of them may be a replaced attempt's, failing late (its worker only slow to heart-beat)
while the continuation runs on: it cut the continuation short at that failure, and a
continuation still running was charged as if it had ended there. Two changes to
``request_outcomes``:

- ``attempt_ends`` takes each ``failed`` and ``cancelled`` that names its attempt too, packed
  the same way (a router's ``Cancelled`` names no worker: packed with the key of ``''``, and
  the report takes it as the end of its attempt on whatever worker that ran);
- ``first_unnamed_end_ms``: the first terminal event that names no attempt (a failure or
  cancellation from a writer older than the field), in ms, ``NEVER_MS`` where there is none:
  the end of an attempt that has none of its own. An attempt without either has not ended
  yet, and runs on as one in flight does.

Rows written before this version have ``first_unnamed_end_ms`` 0 (the column's default, and
the least value, so a request with any of them has it): the report ends their attempts as
before, at the request's first terminal event. The view is recreated with the new column;
nothing is inserted while migrations run.
"""

from analytics.migrations.m011_request_facts import REQUEST_OUTCOMES_VIEW_V11

#: No such time: later than any time in ms (``first_unnamed_end_ms`` of a request without one).
NEVER_MS = "0x4000000000000000"

_ENDS = "type IN ('requeued', 'completed')) AS attempt_ends,"
if REQUEST_OUTCOMES_VIEW_V11.count(_ENDS) != 1:
    raise RuntimeError("m015 extends the attempt_ends of the request_outcomes view of m011")

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V15 = REQUEST_OUTCOMES_VIEW_V11.replace(
    _ENDS, "type IN ('requeued', 'completed')\n"
    "                      OR (type IN ('failed', 'cancelled') AND attempt > 0)) AS attempt_ends,"
    "\n       min(if(type IN ('completed', 'failed', 'rejected', 'cancelled') AND attempt = 0,"
    f"\n              toUnixTimestamp64Milli(time), toInt64({NEVER_MS}))) AS first_unnamed_end_ms,")

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS first_unnamed_end_ms SimpleAggregateFunction(min, Int64)
    AFTER attempt_ends""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V15,
]
