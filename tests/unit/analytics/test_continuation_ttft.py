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
from streams.signals.requests import RequestBook
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



def _served(rid: str, first: float | None, again: float | None, slo_s: float
            ) -> list[tuple[str, object]]:
    """Started on w-a, which reports its first token ``first`` s after the request's creation
    (None: that ``FirstToken`` was lost, its worker gone before it was sent) and completes it
    a second later; or, ``again`` given, streams 18 tokens and is lost: w-b resumes the request
    from token 18, reports that attempt's first token ``again`` s after the creation (by its
    own clock) and completes it a second later."""
    def ms(s: float) -> int:
        return T0 + int(s * 1000)

    common = dict(request_id=rid, tenant="acme", model="m", created_ms=ms(0))
    asked = dict(prompt_tokens=10, max_tokens=32, ttft_slo_s=slo_s, **common)
    attempts = [events.Started(event_time_ms=ms(0.1), worker_id="w-a", **common)]
    if first is not None:
        attempts.append(events.FirstToken(event_time_ms=ms(first), worker_id="w-a",
                                          ttft_s=first, **common))
    end, on = (first or 0) + 1, dict(worker_id="w-a")
    if again is not None:
        end, on = again + 1, dict(worker_id="w-b", attempt=2)
        attempts += [
            events.Requeued(event_time_ms=ms(again - 0.5), worker_id="w-a", tokens_done=18,
                            **common),
            events.Started(event_time_ms=ms(again - 0.4), **on, **common),
            events.FirstToken(event_time_ms=ms(again), ttft_s=again, tokens_done=18, **on,
                              **common)]
    return [("requests", InferenceRequest(event_time_ms=ms(0), **asked)), *(
        ("telemetry", m) for m in [
            events.Queued(event_time_ms=ms(0), **asked), *attempts,
            events.Completed(event_time_ms=ms(end), prompt_tokens=10, output_tokens=32,
                             e2e_s=end, **on, **common)])]


def _as_the_streams_judge(history: list[tuple[str, object]]) -> tuple[list[float], int]:
    """The live signals' TTFT samples and the requests that met their SLO (``fleet:all``)."""
    book, samples, met = RequestBook({}), [], 0
    for _, message in history:
        for out in book.apply(message):
            if out.route == "scope" and out.key == "fleet:all":
                samples += [out.payload["v"]] if out.payload["k"] == "f" else []
                met += out.payload["slo"] if out.payload["k"] == "c" else 0
    return samples, met


def _slo(store: Store) -> tuple[list[float], int]:
    """``report slo``'s TTFT p50 and p99, and the requests that met their SLO."""
    [row] = run_report(StoreSource(store), "slo", bucket="day").dicts()
    return [row["ttft_p50_s"], row["ttft_p99_s"]], row["slo_met"]


def test_report_slo_takes_no_continuations_first_token_for_a_lost_one(store):
    """``r-lost``'s first attempt streamed tokens but its ``FirstToken`` was lost: the streams
    take no TTFT sample of it (its continuation's, 6 s after its creation, is none), only
    ``r-plain``'s 0.5 s, and judge its SLO (7 s) by the continuation's first token. ``report
    slo`` took the least ``ttft_s`` of a request's first tokens, the continuation's too: a p99
    of 6 s, where the streams' is 0.5 s (``r-lost``'s client had tokens well before 6 s)."""
    history = _served("r-lost", None, 6.0, slo_s=7.0) + _served("r-plain", 0.5, None, 7.0)
    assert _as_the_streams_judge(history) == ([0.5], 2)
    _write(store, 1, history)
    assert _slo(store) == ([0.5, 0.5], 2)


def test_report_slo_judges_a_request_by_its_first_token_not_an_earlier_continuations(store):
    """``r-skewed``'s first token came 2 s after its creation, past its 1.8 s target; it was
    resumed on w-b, whose clock runs behind: its continuation's first token reads 1.5 s. The
    streams take 2 s, a miss; ``report slo`` took the least, 1.5 s, and counted it met."""
    history = _served("r-skewed", 2.0, 1.5, slo_s=1.8)
    assert _as_the_streams_judge(history) == ([2.0], 0)
    _write(store, 1, history)
    assert _slo(store) == ([2.0, 2.0], 0)


def test_version_16_applies_to_a_store_with_history(location, monkeypatch):
    """A request written before version 16 keeps the least of its first tokens as its TTFT, a
    continuation's too (read as before); one written after has its continuation's apart."""
    with monkeypatch.context() as patched:  # a store as version 15 left it
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:15])
        old = Store.open(location)
        _write(old, 1, _served("r-before", None, 6.0, slo_s=7.0))
        old.close()
    store = Store.open(location)
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        _write(store, 2, _served("r-after", None, 6.0, slo_s=7.0))
        assert store.query("SELECT request_id, ttft_s, continuation_ttft_s "
                           "FROM request_outcomes FINAL ORDER BY request_id").rows == [
            ["r-after", None, 6.0], ["r-before", 6.0, None]]
        assert _slo(store) == ([6.0, 6.0], 2)  # a sample of the one before; both met by 6 s
    finally:
        store.close()
