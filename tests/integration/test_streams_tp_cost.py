"""A worker of four GPUs (tensor parallelism 4: ``gpus`` on its heartbeat) is charged four GPUs'
price and counts four GPUs' hours in the live signals, beside a one-GPU worker whose heartbeats
say no count, on the real broker."""

import asyncio
import time

import pytest

from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from schemas.events import WorkerStatus
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration


def _heartbeats(t0: int, worker_id: str, model: str, gpus: int) -> list[WorkerStatus]:
    return [WorkerStatus(event_time_ms=t0 + 1000 * s, worker_id=worker_id, slot=0,
                         pool=f"h100@{model}", gpu_type="h100", gpus=gpus, models_loaded=[model],
                         started_ms=t0) for s in range(11)]


async def _scenario(bootstrap, catalog, tmp_path) -> dict[str, dict]:
    t0 = int(time.time() * 1000) - 25_000
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "streams.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await produce(bootstrap, catalog, _heartbeats(t0, "w-tp4", "llama-2-70b", 4)
                          + _heartbeats(t0, "w-tp1", "llama-3-8b", 1))
            for w in ("w-tp4", "w-tp1"):
                await signals.wait_until(
                    lambda w=w: signals.total(f"worker:{w}").get("provisioned_s") == 10.0, 60,
                    f"10 s provisioned on {w}", [worker], lambda w=w: signals.total(f"worker:{w}"))
            await signals.wait_until(
                lambda: "price_usd_per_hour" in signals.total("fleet:w-tp4"), 60,
                "the fleet view of w-tp4", [worker], lambda: signals.total("fleet:w-tp4"))
            return {key: dict(signals.total(key))
                    for key in ("worker:w-tp4", "worker:w-tp1", "fleet:w-tp4")}
    finally:
        stop(worker)


def test_a_tp4_worker_is_charged_four_gpus(kafka_bootstrap, catalog, tmp_path):
    totals = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    price = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"]
    four, one = totals["worker:w-tp4"], totals["worker:w-tp1"]
    assert four["spend_usd"] == pytest.approx(4 * 10 * price / 3600)
    assert one["spend_usd"] == pytest.approx(10 * price / 3600)
    assert (four["gpu_hours"], one["gpu_hours"]) == pytest.approx((40 / 3600, 10 / 3600))
    assert totals["fleet:w-tp4"]["price_usd_per_hour"] == pytest.approx(4 * price)
