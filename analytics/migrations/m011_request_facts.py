"""Version 11: what a request asked for, from the router's ``Queued`` or the first request read.

``request_outcomes`` took a request's tenant, model, task, priority, step, steps, TTFT SLO,
deadline and prompt tokens as the greatest (or last) of all its events' values, the records
of a second ``InferenceRequest`` under its id included: one the router dead-lettered as
``duplicate_request_id`` (a client reusing the id, with the same ``created_ms``) gave the real
request its tenant, its one-day SLO and deadline and its 400,000 prompt tokens, and the reports
judged the real request by them.

``request_outcomes.request_facts`` holds those values as one tuple, taken from the ``Queued``
event (what the router accepted) where the request has one, else from the ``InferenceRequest``
read first (lowest offset: a request's records share a partition, its id being their key). Its
``rank`` orders the candidates so that the greatest tuple wins, within a block and when parts
merge: 2 for a ``Queued``, 1 for an ``InferenceRequest``, then the bitwise complement of the
record's offset (the lowest offset is the greatest). A row with neither has ``rank`` 0, as have
the rows written before this version (the column's default): the reports then read the other
columns, as before (``analytics/outcomes.py``). The columns stay as they were, for those rows.
The view is recreated with the new column; nothing is inserted while migrations run.
"""

from analytics.migrations.m010_attempt_times import REQUEST_OUTCOMES_VIEW_V10

_AFTER = "max(cached_tokens) AS cached_tokens"
if REQUEST_OUTCOMES_VIEW_V10.count(_AFTER) != 1:
    raise RuntimeError("m011 extends the request_outcomes view of m010 after cached_tokens")

#: The facts: each a column of ``request_events`` and its type in the tuple.
_FACTS = (("tenant", "String"), ("model", "String"), ("task_id", "String"),
          ("priority", "UInt8"), ("step", "UInt32"), ("steps_total", "UInt32"),
          ("ttft_slo_s", "Nullable(Float64)"), ("deadline", "Nullable(DateTime64(3))"),
          ("prompt_tokens", "UInt32"))

FACTS_TYPE = ("Tuple(rank UInt8, order UInt64, "
              + ", ".join(f"{name} {kind}" for name, kind in _FACTS) + ")")

#: The names of the facts (elements of ``request_facts`` after ``rank`` and ``order``).
FACTS = tuple(name for name, _ in _FACTS)

_FACTS_OF_EVENT = (
    "CAST(tuple(if(type = 'queued', 2, 1), bitNot(request_events.kafka_offset), "
    + ", ".join(f"request_events.{name}" for name in FACTS) + f"), '{FACTS_TYPE}')")

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V11 = REQUEST_OUTCOMES_VIEW_V10.replace(
    _AFTER, _AFTER + ",\n       maxIf(" + _FACTS_OF_EVENT
    + ", type IN ('queued', 'inference_request')) AS request_facts")

STATEMENTS = [
    f"""
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS request_facts SimpleAggregateFunction(max, {FACTS_TYPE})""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V11,
]
