"""A second ``InferenceRequest`` under a request's id, which the router dead-letters as
``duplicate_request_id``, tells the reports nothing about the request: its facts (tenant, task,
step, SLO, deadline, prompt tokens) are the router's ``Queued``, else its first request's.

``dupt`` (acme, TTFT SLO 1 s, deadline 10 s, 100 prompt tokens) has its first token at 2 s and
completes at 5 s: in time, its SLO missed. A client then sends another request under its id and
creation (tenant evil, a one-day SLO and deadline, 400,000 prompt tokens). Before schema version
11 the rollup took the greatest or last of the values: the request counted as evil's, with its
SLO met.
"""

import pytest

import analytics.migrations as migrations
from analytics.outcomes import DEFAULTS, FINAL_SETTINGS, OUTCOMES_CTE
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.store import Store
from analytics.window import wall_clock_ms, window_parameters
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write, ms

DAY_S = 86_400
FACTS_SQL = f"""
WITH {OUTCOMES_CTE.strip()}
SELECT request_id, tenant, task, step, ttft_slo, toUnixTimestamp64Milli(deadline), prompt_tokens,
       outcome
FROM outcomes ORDER BY request_id {FINAL_SETTINGS}"""


def _request(rid: str, tenant: str, at_s: float, slo_s: float, prompt: int) -> InferenceRequest:
    return InferenceRequest(event_time_ms=ms(at_s), request_id=rid, task_id=f"task-{rid}",
                            tenant=tenant, model="m", created_ms=ms(0), ttft_slo_s=slo_s,
                            deadline_ms=ms(slo_s * 10), prompt_tokens=prompt, max_tokens=10)


def _served(rid: str) -> list[tuple[str, object]]:
    """The real request, accepted and served."""
    common = dict(request_id=rid, task_id=f"task-{rid}", tenant="acme", model="m",
                  created_ms=ms(0))
    return [("requests", _request(rid, "acme", 0, 1.0, 100)), *(("telemetry", m) for m in [
        events.Queued(event_time_ms=ms(0), prompt_tokens=100, max_tokens=10, ttft_slo_s=1.0,
                      deadline_ms=ms(10), **common),
        events.Started(event_time_ms=ms(1), worker_id="w-a", **common),
        events.FirstToken(event_time_ms=ms(2), worker_id="w-a", ttft_s=2.0, **common),
        events.Completed(event_time_ms=ms(5), worker_id="w-a", prompt_tokens=100,
                         output_tokens=10, e2e_s=5.0, **common)])]


def _duplicate(rid: str) -> list[tuple[str, object]]:
    return [("requests", _request(rid, "evil", 6, float(DAY_S), 400_000))]


def _facts(store: Store) -> list[list]:
    return store.query(FACTS_SQL, {**DEFAULTS, **window_parameters(wall_clock_ms())}).rows


SERVED = [["dupt", "acme", "task-dupt", 1, 1.0, ms(10), 100, "ok"]]


def _slo(store: Store) -> list[tuple]:
    rows = run_report(StoreSource(store), "slo", bucket="day").dicts()
    return [(r["tenant"], r["finished"], r["slo_met"]) for r in rows]


@pytest.mark.parametrize("flushes", ["one flush", "a later flush"])
def test_a_duplicate_request_does_not_change_the_request_it_duplicates(store, flushes):
    if flushes == "one flush":
        _write(store, 1, _served("dupt") + _duplicate("dupt"))
    else:
        _write(store, 1, _served("dupt"))
        _write(store, 2, _duplicate("dupt"))
    assert _facts(store) == SERVED
    assert _slo(store) == [("acme", 1, 0)]


def test_without_a_queued_the_first_request_read_says_what_was_asked(store):
    """Rejected (no Queued), then duplicated: the request read first is the request."""
    common = dict(request_id="dupt", task_id="task-dupt", tenant="acme", model="m",
                  created_ms=ms(0))
    _write(store, 1, [("requests", _request("dupt", "acme", 0, 1.0, 100)),
                      ("telemetry", events.Rejected(event_time_ms=ms(0), reason="rate_limited",
                                                    **common))])
    _write(store, 2, _duplicate("dupt"))
    rows = _facts(store)
    assert [row[:7] for row in rows] == [row[:7] for row in SERVED]
    assert rows[0][7] == "rejected"
    rejections = run_report(StoreSource(store), "rejections").dicts()
    assert [(r["tenant"], r["reason"], r["requests"]) for r in rejections] == [
        ("acme", "rate_limited", 1)]


def test_rows_written_before_version_11_read_as_before(location, monkeypatch):
    with monkeypatch.context() as patched:  # a store as version 10 left it
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:10])
        old = Store.open(location)
        _write(old, 1, _served("dupt"))
        old.close()
    store = Store.open(location)
    try:
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [
            [migrations.LATEST_VERSION]]
        assert _facts(store) == SERVED
        assert _slo(store) == [("acme", 1, 0)]
    finally:
        store.close()
