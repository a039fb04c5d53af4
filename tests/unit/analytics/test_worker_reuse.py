"""A worker id used again for another pool: each request is charged to the pool of the worker
incarnation it ran on, not to the pool the id has last.

The local supervisor names workers by slot, and the autoscaler reuses the lowest free slot, so
``worker-1`` can be an A100 one hour and an H100 the next. Here it is an A100 (default price
1.80 $/h) from 0 to 4 s, stopped, then an H100 (3.00 $/h) from 10 to 14 s: 4 GPU-seconds each.
``q1`` (task ``ta``) ran on the A100 from 1 to 3 s, ``q2`` (task ``tb``) on the H100 from 11 to
12 s; both completed. Each pool-day's cost goes, whole, to the one request that ran on it; each
task succeeded, so each row's cost per successful task is its pool's cost.
"""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
T0 = int((_today - dt.timedelta(days=1) + dt.timedelta(hours=1)).timestamp() * 1000)
A100, H100 = "a100@m", "h100@m"


def ms(seconds: float) -> int:
    return T0 + int(round(seconds * 1000))


def _history() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for pool, gpu, start in ((A100, "a100", 0), (H100, "h100", 10)):
        for i in range(9):  # every 0.5 s for 4 s, the last one stopped
            out.append(("telemetry", events.WorkerStatus(
                event_time_ms=ms(start + i * 0.5), worker_id="worker-1", slot=1, pool=pool,
                gpu_type=gpu, state="stopped" if i == 8 else "warm", started_ms=ms(start))))
    for rid, task, start, end, cached in (("q1", "ta", 1, 3, 40), ("q2", "tb", 11, 12, 10)):
        common = {"request_id": rid, "tenant": "acme", "model": "m", "created_ms": ms(start)}
        out.append(("requests", InferenceRequest(
            event_time_ms=ms(start), task_id=task, step=1, steps_total=1, prompt_tokens=100,
            max_tokens=10, **common)))
        out += [("telemetry", m) for m in (
            events.Queued(event_time_ms=ms(start), prompt_tokens=100, max_tokens=10, **common),
            events.Started(event_time_ms=ms(start), worker_id="worker-1", **common),
            events.Completed(event_time_ms=ms(end), worker_id="worker-1", prompt_tokens=100,
                             output_tokens=10, cached_tokens=cached, e2e_s=end - start,
                             **common))]
    return out


@pytest.fixture
def source(store):
    _write(store, 1, _history())
    return StoreSource(store)


def test_each_request_is_charged_to_the_pool_its_worker_was_in_then(source):
    got = run_report(source, "cost").dicts()
    price = DEFAULT_GPU_PRICES_USD_PER_HOUR
    assert [(r["tenant"], r["pool"], r["requests"], r["successful_tasks"], r["pool_share"])
            for r in got] == [("acme", A100, 1, 1, 1.0), ("acme", H100, 1, 1, 1.0)]
    for row, gpu in zip(got, ("a100", "h100"), strict=True):
        assert row["cost_usd"] == pytest.approx(4 * price[gpu] / 3600, abs=1e-6)
        assert row["cost_per_successful_task_usd"] == pytest.approx(row["cost_usd"], abs=1e-6)


def test_cached_tokens_count_in_the_pool_their_worker_was_in_then(source):
    got = run_report(source, "cache").dicts()
    assert [(r["pool"], r["prompt_tokens"], r["cached_tokens"]) for r in got] == [
        (A100, 100, 40), (H100, 100, 10)]
