"""The streams charge a finished task its own share of its worker's time, never that of a
request still running beside it (which the cost report shows as ``(in flight)``,
``tests/unit/analytics/test_in_flight_cost.py``): an attempt is charged once it ends."""

import pytest

from schemas.events import Completed, Queued, Started, WorkerStatus
from streams.pipeline import Pipeline

T = 1_700_000_000_000
H100_S = 3.00 / 3600  # config's default price, per GPU-second


def _request(rid: str) -> dict:
    return dict(request_id=rid, tenant="acme", created_ms=T + 1000)


def test_a_finished_task_is_charged_its_share_and_not_the_running_requests():
    """``done`` and ``running`` share the H100 from 1 s; ``done`` completes at 5 s (4 s at half
    the GPU: 2 GPU-seconds); ``running`` runs on to the last heartbeat at 10 s, uncharged."""
    pipeline = Pipeline()
    for rid in ("done", "running"):
        pipeline.send(Queued(event_time_ms=T + 1000, prompt_tokens=10, max_tokens=10,
                             **_request(rid)),
                      Started(event_time_ms=T + 1000, worker_id="w-h", **_request(rid)))
    for second in range(11):
        pipeline.send(WorkerStatus(
            event_time_ms=T + second * 1000, worker_id="w-h", slot=0, pool="h100@m",
            gpu_type="h100", started_ms=T, running=(second >= 1) + (second >= 1 and second < 5)))
        if second == 5:
            pipeline.send(Completed(event_time_ms=T + 5000, worker_id="w-h", prompt_tokens=10,
                                    output_tokens=10, e2e_s=4.0, **_request("done")))
    fleet = pipeline.values("fleet:all")
    assert (fleet["tasks_closed"], fleet["tasks_succeeded"]) == (1, 1)
    assert fleet["task_cost_usd"] == pytest.approx(2 * H100_S)
    assert fleet["attributed_usd"] == pytest.approx(2 * H100_S)
    assert fleet["spend_usd"] == pytest.approx(10 * H100_S)
