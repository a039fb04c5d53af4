"""A request completed without a first token (an empty answer: the worker sends no
``FirstToken``) meets its TTFT target by its end, as the streams judge it (``ttft = e2e``):
before 6 Dec ``report slo`` counted it a miss (its TTFT was NULL)."""

import datetime as dt

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).timestamp() * 1000)


def _request(rid: str, e2e_s: float) -> list[tuple[str, object]]:
    common = {"request_id": rid, "tenant": "acme", "model": "m", "created_ms": T0}
    return [("requests", InferenceRequest(event_time_ms=T0, prompt_tokens=100, max_tokens=10,
                                          ttft_slo_s=1.0, **common)),
            *(("telemetry", m) for m in (
                events.Queued(event_time_ms=T0, prompt_tokens=100, max_tokens=10,
                              ttft_slo_s=1.0, **common),
                events.Started(event_time_ms=T0, worker_id="w1", **common),
                events.Completed(event_time_ms=T0 + int(e2e_s * 1000), worker_id="w1",
                                 prompt_tokens=100, output_tokens=0, e2e_s=e2e_s, **common)))]


def test_an_answer_without_a_first_token_is_judged_by_its_end(store):
    _write(store, 1, _request("quick", 0.5) + _request("slow", 1.5))
    [row] = run_report(StoreSource(store), "slo").dicts()
    assert (row["finished"], row["slo_met"], row["ttft_p50_s"]) == (2, 1, None)
