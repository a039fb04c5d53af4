"""The controllers process killed and started again on the real broker, a worker's breaker open
and a pool scaled out: the new process continues from what the old one commanded, read back
from the control topic. Before 6 Dec it announced the broken worker's breaker closed (the
routers sent it requests again) and took the pool for the workers it heard in its first
seconds."""

import asyncio

import pytest

from controllers.service import ControllersService
from infra.bus import Outbox, now_ms, reading
from schemas.commands import ScalePool, SetBreakerState
from schemas.config import GovernorConfig
from schemas.events import Failed, Started, WorkerStatus

pytestmark = pytest.mark.integration

POOL = "h100@llama-3-8b"
CONFIG = GovernorConfig.model_validate({"autoscaler": {
    "enabled": True, "pools": {POOL: {"min_replicas": 1, "max_replicas": 4}}}})


def _status(slot: int, running: int, started_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=now_ms(), worker_id=f"worker-{slot}", slot=slot, pool=POOL,
                        gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=started_ms,
                        state="warm", running=running)


async def _scenario(bootstrap, catalog) -> tuple[list, list]:
    async with reading(bootstrap, catalog, [catalog.control], "restart-test",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        stop_beats = asyncio.Event()

        async def heartbeats() -> None:  # worker-0 busy, worker-1 idle: the pool holds 2
            started_ms = now_ms() - 600_000
            while not stop_beats.is_set():
                for slot, running in ((0, 40), (1, 0)):
                    outbox.emit(catalog.telemetry, _status(slot, running, started_ms),
                                f"worker-{slot}")
                await outbox.flush()
                await asyncio.sleep(0.5)  # (a heartbeat's period)

        async def commands_until(condition, since_ms: int) -> list:
            seen: list = []
            async with asyncio.timeout(60):
                while not condition(seen):
                    seen += [item.message for item in await typed.fetch(200)
                             if item.message.event_time_ms >= since_ms]
            return seen

        def breaker(seen: list) -> list[str]:
            return [m.state for m in seen
                    if isinstance(m, SetBreakerState) and m.worker_id == "worker-1"]

        beating = asyncio.create_task(heartbeats())
        stop = asyncio.Event()
        first = asyncio.create_task(ControllersService(bootstrap, catalog, config=CONFIG).run(stop))
        started = now_ms()
        scaled = await commands_until(lambda seen: any(isinstance(m, ScalePool) for m in seen),
                                      started)
        for n in range(8):  # worker-1 fails what it runs
            t = now_ms()
            outbox.emit(catalog.telemetry, Started(event_time_ms=t, request_id=f"r{n}",
                                                   worker_id="worker-1"), f"r{n}")
            outbox.emit(catalog.telemetry, Failed(event_time_ms=t, request_id=f"r{n}",
                                                  worker_id="worker-1", reason="engine_error"),
                        f"r{n}")
        await outbox.flush()
        before = await commands_until(lambda seen: "open" in breaker(seen), started)
        first.cancel()  # killed: nothing of a graceful stop
        with pytest.raises(asyncio.CancelledError):
            await first
        restarted = now_ms()
        second = asyncio.create_task(ControllersService(bootstrap, catalog,
                                                        config=CONFIG).run(stop))
        try:
            after = await commands_until(
                lambda seen: breaker(seen) and any(isinstance(m, ScalePool) for m in seen),
                restarted)
        finally:
            stop.set()
            stop_beats.set()
            await second
            await beating
        return scaled + before, after


def test_a_restarted_controllers_process_continues_its_breakers_and_pool_sizes(
        kafka_bootstrap, catalog):
    before, after = asyncio.run(_scenario(kafka_bootstrap, catalog))
    states = [m.state for m in after
              if isinstance(m, SetBreakerState) and m.worker_id == "worker-1"]
    assert states[0] == "open", states  # (not "closed": its cooldown of 10 s is not over)
    sizes = [[m.replicas for m in seen if isinstance(m, ScalePool)] for seen in (before, after)]
    assert sizes[1][0] == sizes[0][-1], sizes
