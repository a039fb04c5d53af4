"""Version 5: when a request first completed.

A request's outcome compared ``finished_at``, the time of its *last* terminal event, with its
deadline. A request can have two: an attempt the router replaced (its worker was slow to
heart-beat, not dead) may still complete, or fail, after the attempt that replaced it has
completed in time; the request was then counted late and its task failed, though the client had
its answer by the deadline. ``request_outcomes.completed_at`` keeps the first ``completed``
event's time, and the reports judge the deadline by it (rows written before this version have
none: they fall back to ``finished_at``, as before).
"""

from analytics.migrations.m004_created_order import REQUEST_OUTCOMES_VIEW_V4

_AFTER = "maxIf(toNullable(time), type IN"
if REQUEST_OUTCOMES_VIEW_V4.count(_AFTER) != 1:
    raise RuntimeError("m005 extends the request_outcomes view of m004 after finished_at")
_LINE_END = REQUEST_OUTCOMES_VIEW_V4.index("AS finished_at,", REQUEST_OUTCOMES_VIEW_V4.index(_AFTER))
_CUT = _LINE_END + len("AS finished_at,")

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V5 = (REQUEST_OUTCOMES_VIEW_V4[:_CUT]
                            + "\n       minIf(toNullable(time), type = 'completed') AS completed_at,"
                            + REQUEST_OUTCOMES_VIEW_V4[_CUT:])

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS completed_at SimpleAggregateFunction(min, Nullable(DateTime64(3)))
    AFTER finished_at""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V5,
]
