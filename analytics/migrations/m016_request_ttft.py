"""Version 16: a request's TTFT in ``request_outcomes`` is its first token's, no continuation's.

``request_outcomes.ttft_s`` was the least ``ttft_s`` of all of a request's ``FirstToken``
events, a continuation's too (its request resumed on another worker after tokens were
streamed). Version 12 left a continuation's out of ``request_minute`` only: ``report slo`` still
took one as the request's TTFT sample where the first attempt's ``FirstToken`` was lost (its
worker gone before it was sent: the continuation's, seconds after the creation, weighed on the
p99), and judged the request's SLO by it where it read less than the first attempt's (its worker's
clock behind the first one's). The streams take a request's first token (``tokens_done`` 0)
as its TTFT, and a continuation's only to judge the SLO of a request without one.

``ttft_s`` now leaves out a continuation's first token (``tokens_done`` above 0), and the new
``continuation_ttft_s`` holds the least of those: the report takes ``ttft_s`` as the request's
TTFT sample and judges its SLO by it, or else by ``continuation_ttft_s``, or else by its end, as
the streams do. Rows written before this version keep ``ttft_s`` as it was, with no
``continuation_ttft_s``: they are read as before. The view is recreated with the new column;
nothing is inserted while migrations run.
"""

from analytics.migrations.m015_named_attempt_ends import REQUEST_OUTCOMES_VIEW_V15

_TTFT = "min(ttft_s) AS ttft_s,"
if REQUEST_OUTCOMES_VIEW_V15.count(_TTFT) != 1:
    raise RuntimeError("m016 changes the ttft_s of the request_outcomes view of m015")

_CONTINUATION = "type = 'first_token' AND tokens_done > 0"

#: The view as this version recreates it.
REQUEST_OUTCOMES_VIEW_V16 = REQUEST_OUTCOMES_VIEW_V15.replace(
    _TTFT, f"min(if({_CONTINUATION}, NULL, request_events.ttft_s)) AS ttft_s,"
    f"\n       minIf(request_events.ttft_s, {_CONTINUATION}) AS continuation_ttft_s,")

STATEMENTS = [
    """
ALTER TABLE request_outcomes
    ADD COLUMN IF NOT EXISTS continuation_ttft_s SimpleAggregateFunction(min, Nullable(Float64))
    AFTER ttft_s""",
    "DROP VIEW IF EXISTS request_outcomes_mv",  # nothing is inserted while migrations run
    REQUEST_OUTCOMES_VIEW_V16,
]
