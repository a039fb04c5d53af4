"""Version 12: a continuation's first token is no TTFT sample in ``request_minute``.

A worker emits a ``FirstToken`` for each attempt's first token, a continuation's too (a request
resumed on another worker after tokens were streamed), measured like any from the request's
creation. The streams and ``report slo`` take a request's first ``FirstToken`` only, but
``request_minute``'s ``ttft_digest`` took every one: a request resumed after a worker was lost
counted a second TTFT, the whole time since its creation. ``FirstToken.tokens_done`` (the
tokens streamed before the attempt, its Dispatch's ``resume_from_token``) now says which is a
continuation's, and the view leaves those out of the digest (they still count in ``events``).
Rows written before this version stay as they were; a ``FirstToken`` from a worker of before
6 Dec has no ``tokens_done`` and counts as before. The view is recreated; nothing is inserted
while migrations run.
"""

from analytics.migrations import m002_rollups

_VIEW = next(s for s in m002_rollups.STATEMENTS
             if "CREATE MATERIALIZED VIEW IF NOT EXISTS request_minute_mv" in s)
_TTFT = "(ttft_s) AS ttft_digest"
if _VIEW.count(_TTFT) != 1:
    raise RuntimeError("m012 changes the TTFT digest of the request_minute view of m002")

#: The view as this version recreates it.
REQUEST_MINUTE_VIEW_V12 = _VIEW.replace(
    _TTFT, "(if(type = 'first_token' AND tokens_done > 0, NULL, ttft_s)) AS ttft_digest")

STATEMENTS = [
    "DROP VIEW IF EXISTS request_minute_mv",
    REQUEST_MINUTE_VIEW_V12,
]
