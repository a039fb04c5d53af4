"""A pool's degree set live (``governor config set autoscaler.pools.<pool>.gpus``) reaches a
running controllers process started with no ``--pool-gpus``, as in a deployment whose workers an
orchestrator starts: the pool at zero, woken by requests held for want of a worker, is planned
at TP 2 (the least that holds Llama-2-70B on H100s), then at the TP 4 the setting declares."""

import asyncio
import subprocess
import sys

import pytest

from controllers.autoscaler import Autoscaler
from controllers.service import ControllersService
from infra.bus import Outbox, now_ms, reading
from schemas.commands import ScalePool
from schemas.config import ConfigSet
from schemas.events import ConfigApplied, Rejected

pytestmark = pytest.mark.integration

POOL, MODEL = "h100@llama-2-70b", "llama-2-70b"


def _config_set(bootstrap: str, namespace: str, key: str, value: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.cli", "config", "set", key, value,
                           "--bootstrap", bootstrap, "--namespace", namespace],
                          capture_output=True, text=True, timeout=60)


async def _scenario(bootstrap, catalog) -> dict:
    async with reading(bootstrap, catalog, [catalog.control, catalog.telemetry],
                       "pool-degree-test", offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        for key, value in (("autoscaler.enabled", True),
                           ("autoscaler.pools", {POOL: {"max_replicas": 4}})):
            outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(), key=key, value=value),
                        key)
        await outbox.flush()
        stop, held = asyncio.Event(), asyncio.Event()
        service = asyncio.create_task(ControllersService(bootstrap, catalog).run(stop))

        async def waiting_requests() -> None:  # requests refused for want of a worker
            n = 0
            while not held.is_set():
                for _ in range(20):
                    n += 1
                    outbox.emit(catalog.telemetry, Rejected(
                        event_time_ms=now_ms(), request_id=f"r{n}", model=MODEL,
                        reason="no_capacity", retry_after_s=1.0), f"r{n}")
                await outbox.flush()
                await asyncio.wait([asyncio.create_task(held.wait())], timeout=0.5)

        async def until(condition, seen: list) -> None:
            async with asyncio.timeout(60):
                while not condition(seen):
                    seen += [item.message for item in await typed.fetch(200)]

        def scaled(sequences: float):
            return lambda seen: any(isinstance(m, ScalePool) and m.pool == POOL and
                                    f"{sequences:.0f} sequences per h100 worker" in m.reason
                                    for m in seen)

        def applied(seen: list) -> list:
            return [m for m in seen if isinstance(m, ConfigApplied) and m.component ==
                    "controllers" and m.key == f"autoscaler.pools.{POOL}.gpus"]

        demand = asyncio.create_task(waiting_requests())
        planner = Autoscaler()
        cap2, cap4 = planner.capacity("h100", MODEL, 2), planner.capacity("h100", MODEL, 4)
        try:
            before: list = []
            await until(scaled(cap2), before)
            refused = await asyncio.to_thread(_config_set, bootstrap, catalog.namespace,
                                              f"autoscaler.pools.{POOL}.gpus", "3")
            done = await asyncio.to_thread(_config_set, bootstrap, catalog.namespace,
                                           f"autoscaler.pools.{POOL}.gpus", "4")
            # both: the plan on the control topic may be read before the ConfigApplied on
            # the telemetry topic that came first (the test failed so 2 times in 4)
            after: list = []
            await until(lambda seen: scaled(cap4)(seen) and applied(seen), after)
        finally:
            held.set()
            await demand
            stop.set()
            await service
    return {"refused": refused, "done": done, "applied": applied(after), "cap2": cap2,
            "cap4": cap4}


def test_a_pool_degree_set_live_reaches_the_running_controllers(kafka_bootstrap, catalog):
    result = asyncio.run(_scenario(kafka_bootstrap, catalog))
    assert f"{result['cap2']:.0f}" != f"{result['cap4']:.0f}"
    refused = result["refused"]
    assert refused.returncode == 2 and f"autoscaler.pools.{POOL}.gpus: tp 3 does not divide " \
        "llama-2-70b's 64 attention heads" in refused.stderr, refused.stderr
    assert result["done"].returncode == 0, result["done"].stderr
    assert len(result["applied"]) == 1
