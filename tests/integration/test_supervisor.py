"""The autoscaler's actuator: ScalePool commands start cold workers (loading, then warm) and stop
the newest ones (they drain and stop); a pool of a model the configuration declares runs it."""

import asyncio

import pytest

from infra.bus import Outbox, now_ms, reading
from infra.stack import PoolSpec, Stack
from infra.supervisor import supervise
from schemas.commands import ScalePool
from schemas.config import ConfigSet
from schemas.events import WorkerStatus
from workers.sim import models

pytestmark = pytest.mark.integration

LLAMA_2_13B = {"params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40,
               "head_dim": 128, "hidden_size": 5120, "intermediate_size": 13824,
               "vocab_size": 32000}


async def _scenario(bootstrap, catalog, stack, declared: str | None = None):
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(stack, bootstrap, catalog, stop))
    states: dict[int, list[str]] = {}
    pools: dict[int, str] = {}  # slot -> the pool its heartbeats name
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
                                pools[item.message.slot] = item.message.pool

            async def scale(replicas: int, model: str = "llama-3-8b"):
                outbox = Outbox(typed.producer)
                outbox.emit(catalog.control, ScalePool(
                    event_time_ms=now_ms(), command_id=f"s{replicas}", issued_by="test",
                    pool=f"h100@{model}", gpu_type="h100", model=model,
                    replicas=replicas, reason="test"), f"h100@{model}")
                await outbox.flush()

            await until(lambda: "warm" in states.get(0, []))
            if declared is not None:  # a second pool, of a model declared by its shape
                outbox = Outbox(typed.producer)
                outbox.emit(catalog.config, ConfigSet(
                    event_time_ms=now_ms(), key=f"models.{declared}", value=LLAMA_2_13B),
                    f"models.{declared}")
                await outbox.flush()
                await scale(1, declared)
                await until(lambda: "warm" in states.get(1, []))
                return pools
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


def test_a_pool_of_a_model_declared_in_the_configuration_gets_a_worker_that_runs_it(
        kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  speedup=20, with_router=False)
    stack.start()
    try:
        pools = asyncio.run(_scenario(kafka_bootstrap, catalog, stack, declared="llama-2-13b-t"))
        assert stack.workers_of("h100@llama-2-13b-t") == [1]
    finally:
        stack.stop()
        models.configure_models({})  # (the supervisor declared it in this process)
    assert pools == {0: "h100@llama-3-8b", 1: "h100@llama-2-13b-t"}  # warm, serving it
