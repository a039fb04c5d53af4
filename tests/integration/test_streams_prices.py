"""GPU prices set on the configuration topic reach the streams: those set before a worker starts
are its prices from its first heartbeat, and one set while it runs is charged from the next
interval on (an interval at its first heartbeat's price), on the real broker."""

import asyncio
import time

import pytest

from infra.bus import Outbox, make_producer
from schemas.config import ConfigSet
from schemas.events import WorkerStatus
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration


async def _set(bootstrap, catalog, key, value) -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox = Outbox(producer)
        outbox.emit(catalog.config, ConfigSet(event_time_ms=int(time.time() * 1000), key=key,
                                              value=value), key)
        await outbox.flush()
    finally:
        await producer.stop()


def _heartbeats(t0: int, seconds: range) -> list[WorkerStatus]:
    return [WorkerStatus(event_time_ms=t0 + 1000 * s, worker_id="w-h", slot=0,
                         pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                         started_ms=t0) for s in seconds]


async def _scenario(bootstrap, catalog, tmp_path) -> tuple[dict, dict]:
    t0 = int(time.time() * 1000) - 25_000
    await _set(bootstrap, catalog, "gpu_prices_usd_per_hour.h100", 7.2)
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "streams.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await produce(bootstrap, catalog, _heartbeats(t0, range(0, 11)))
            await signals.wait_until(
                lambda: signals.total("worker:w-h").get("provisioned_s") == 10.0, 60,
                "10 s provisioned at the price set before the start", [worker],
                lambda: signals.total("worker:w-h"))
            before = dict(signals.total("worker:w-h"))
            await _set(bootstrap, catalog, "gpu_prices_usd_per_hour.h100", 14.4)
            await signals.wait_until(
                lambda: signals.total("fleet:w-h").get("price_usd_per_hour") == 14.4, 60,
                "the fleet view's price after the live change", [worker],
                lambda: signals.total("fleet:w-h"))
            await produce(bootstrap, catalog, _heartbeats(t0, range(11, 21)))
            await signals.wait_until(
                lambda: signals.total("worker:w-h").get("provisioned_s") == 20.0, 60,
                "20 s provisioned", [worker], lambda: signals.total("worker:w-h"))
            return before, dict(signals.total("worker:w-h"))
    finally:
        stop(worker)


def test_prices_set_before_the_start_and_while_running_are_charged(kafka_bootstrap, catalog,
                                                                      tmp_path):
    before, after = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    assert before["spend_usd"] == pytest.approx(10 * 7.2 / 3600)
    # 0-11 s at the price in force at each interval's first heartbeat (7.2), 11-20 s at 14.4
    assert after["spend_usd"] == pytest.approx(11 * 7.2 / 3600 + 9 * 14.4 / 3600)
