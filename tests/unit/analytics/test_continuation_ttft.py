"""A continuation's ``FirstToken`` (its request resumed on another worker after tokens were
streamed) is no TTFT sample in ``request_minute``, as it is none for the streams and ``report
slo``.

``r-resumed`` has its first token after 0.2 s on ``w-a``, which is lost after 18 tokens; ``w-b``
resumes it from token 18 and reports that attempt's first token 3.6 s after the request's
creation. ``r-lost-early`` loses ``w-a`` before any token; ``w-b`` starts it again from token 0:
its first token, after 1.0 s, is the request's. Before schema version 12 the minute's digest
held 0.2, 3.6 and 1.0: its p99 was 3.6 s where no client waited more than 1.0 s.
"""

import datetime as dt

import pytest

import analytics.migrations as migrations
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.store import Store
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

_now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
T0 = int((_now - dt.timedelta(hours=2)).timestamp() * 1000)  # the start of a minute
MINUTE_TTFT_SQL = """
SELECT toFloat64(q[1]), toFloat64(q[3]) FROM (
    SELECT minute, quantilesTDigestMerge(0.5, 0.9, 0.99)(ttft_digest) AS q FROM request_minute
    WHERE type = 'first_token' GROUP BY minute)
ORDER BY minute"""


def _resumed(rid: str, first_s: float, streamed: int, again_s: float,
             minute: int = 0) -> list[tuple[str, object]]:
    """Started on w-a, lost after ``streamed`` tokens, resumed on w-b from that token; created
    at the start of ``minute``."""
    def ms(s: float) -> int:
        return T0 + int((minute * 60 + s) * 1000)

    common = dict(request_id=rid, tenant="acme", model="m", created_ms=ms(0))
    attempt_1 = [events.Started(event_time_ms=ms(0.1), worker_id="w-a", **common)]
    if streamed:
        attempt_1.append(events.FirstToken(event_time_ms=ms(first_s), worker_id="w-a",
                                           ttft_s=first_s, **common))
    return [("requests", InferenceRequest(event_time_ms=ms(0), prompt_tokens=10, max_tokens=32,
                                          **common)), *(("telemetry", m) for m in [
        events.Queued(event_time_ms=ms(0), prompt_tokens=10, max_tokens=32, **common),
        *attempt_1,
        events.Requeued(event_time_ms=ms(again_s - 0.5), worker_id="w-a", tokens_done=streamed,
                        **common),
        events.Started(event_time_ms=ms(again_s - 0.4), worker_id="w-b", attempt=2, **common),
        events.FirstToken(event_time_ms=ms(again_s), worker_id="w-b", attempt=2,
                          ttft_s=again_s, tokens_done=streamed, **common),
        events.Completed(event_time_ms=ms(again_s + 1), worker_id="w-b", attempt=2,
                         prompt_tokens=10, output_tokens=32, e2e_s=again_s + 1, **common)])]


def _requests() -> list[tuple[str, object]]:
    return _resumed("r-resumed", 0.2, 18, 3.6) + _resumed("r-lost-early", 0.0, 0, 1.0)


def _minute_ttft(store: Store) -> list[tuple[float, float]]:
    """Each minute's TTFT p50 and p99."""
    return [tuple(row) for row in store.query(MINUTE_TTFT_SQL).rows]


def test_a_continuations_first_token_is_no_ttft_sample(store):
    _write(store, 1, _requests())
    [row] = run_report(StoreSource(store), "slo", bucket="day").dicts()
    assert row["ttft_p99_s"] == pytest.approx(1.0, abs=0.01)
    [(_, p99)] = _minute_ttft(store)
    assert p99 == pytest.approx(1.0, abs=0.01)
    assert store.query("SELECT sum(events) FROM request_minute WHERE type = 'first_token'"
                       ).rows == [[3]]


def test_version_12_applies_to_a_store_with_history(location, monkeypatch):
    with monkeypatch.context() as patched:  # a store as version 11 left it
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:11])
        old = Store.open(location)
        _write(old, 1, _resumed("r-before", 0.2, 18, 3.6))
        old.close()
    store = Store.open(location)
    try:
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [
            [migrations.LATEST_VERSION]]
        _write(store, 2, _resumed("r-after", 0.2, 18, 3.6, minute=2))
        # written before: its continuation's sample stays; after: it is left out
        assert _minute_ttft(store) == [pytest.approx((0.2, 3.6), abs=0.01),
                                       pytest.approx((0.2, 0.2), abs=0.01)]
    finally:
        store.close()
