"""The autoscaler's actuator: ScalePool commands start cold workers (loading, then warm) and stop
the newest ones (they drain and stop)."""

import asyncio

import pytest

from infra.bus import Outbox, now_ms, reading
from infra.stack import PoolSpec, Stack
from infra.supervisor import supervise
from schemas.commands import ScalePool
from schemas.events import WorkerStatus

pytestmark = pytest.mark.integration


async def _scenario(bootstrap, catalog, stack):
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(stack, bootstrap, catalog, stop))
    states: dict[int, list[str]] = {}
    try:
        async with reading(bootstrap, catalog, [catalog.telemetry], "supervisor-test",
                           offset_reset="earliest") as typed:

            async def until(condition, timeout_s=90):
                async with asyncio.timeout(timeout_s):
                    while not condition():
                        for item in await typed.fetch(200):
                            if isinstance(item.message, WorkerStatus):
                                states.setdefault(item.message.slot, []).append(
                                    item.message.state)

            async def scale(replicas: int):
                outbox = Outbox(typed.producer)
                outbox.emit(catalog.control, ScalePool(
                    event_time_ms=now_ms(), command_id=f"s{replicas}", issued_by="test",
                    pool="h100@llama-3-8b", gpu_type="h100", model="llama-3-8b",
                    replicas=replicas, reason="test"), "h100@llama-3-8b")
                await outbox.flush()

            await until(lambda: "warm" in states.get(0, []))
            await scale(2)
            await until(lambda: "warm" in states.get(1, []))
            await scale(1)
            await until(lambda: "stopped" in states.get(1, []))
            return states
    finally:
        stop.set()
        await task


def test_scale_pool_starts_a_cold_worker_and_stops_it_again(kafka_bootstrap, catalog, tmp_path):
    # Speedup 20: the cold start (about 28 s of engine time) takes under 2 s.
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  speedup=20, with_router=False)
    stack.start()
    try:
        states = asyncio.run(_scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    new = states[1]
    assert new.index("loading") < new.index("warm") < new.index("stopped")
    assert "stopped" not in states[0]  # the original worker kept running
