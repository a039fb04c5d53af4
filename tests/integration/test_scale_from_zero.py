"""A pool the autoscaler took to zero wakes for a request and serves it, while a request for a
model that is up is answered meanwhile: the whole control loop on the real broker (the router,
the controllers with the autoscaler on, the supervisor starting a cold worker, the worker loading
its model). Before 5 Dec the router waited with the request, every other request held up behind
it, and its 30 s wait could end before a real model had loaded."""

import asyncio

import pytest

from infra.bus import Outbox, now_ms, reading
from infra.stack import PoolSpec, Stack
from infra.supervisor import supervise
from schemas.commands import ScalePool
from schemas.config import ConfigSet
from schemas.events import TERMINAL_EVENT_TYPES, WAITING_FOR_WORKER, SignalSnapshot, WorkerStatus
from schemas.requests import InferenceRequest

pytestmark = pytest.mark.integration

ZERO, UP = "llama-3-8b", "llama-2-7b"  # a pool the autoscaler takes to zero; one kept up
SETTINGS = {"autoscaler.enabled": True, "autoscaler.idle_to_zero_s": 3.0,
            "autoscaler.pools": {f"h100@{ZERO}": {"min_replicas": 0, "max_replicas": 1},
                                 f"h100@{UP}": {"min_replicas": 1, "max_replicas": 1}}}


def _request(request_id: str, model: str) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id, model=model,
                            prompt_tokens=64, max_tokens=8, ttft_slo_s=60.0)


async def _scenario(bootstrap, catalog, stack) -> dict:
    seen: list[tuple[object, int]] = []  # (message, when it was read: now_ms)
    async with reading(bootstrap, catalog, [catalog.telemetry, catalog.control, catalog.signals],
                       "zero-test", offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        for key, value in SETTINGS.items():  # before the controllers start: in force at once
            outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(), key=key, value=value),
                        key)
        await outbox.flush()
        stack.start()
        stop = asyncio.Event()
        supervisor = asyncio.create_task(supervise(stack, bootstrap, catalog, stop))
        try:
            async def until(condition, timeout_s=120) -> None:
                async with asyncio.timeout(timeout_s):
                    while not condition():
                        seen.extend((i.message, now_ms()) for i in await typed.fetch(200))

            def stopped(slot: int) -> bool:
                return any(isinstance(m, WorkerStatus) and m.slot == slot and m.state == "stopped"
                           for m, _ in seen)

            def ended(request_id: str) -> bool:
                return any(getattr(m, "request_id", None) == request_id
                           and m.type in TERMINAL_EVENT_TYPES for m, _ in seen)

            await until(lambda: stopped(0))  # the idle pool went to zero
            sent_ms = now_ms()
            outbox.emit(catalog.requests, _request("wakes", ZERO), "wakes", 0)
            outbox.emit(catalog.requests, _request("meanwhile", UP), "meanwhile", 0)
            await outbox.flush()
            await until(lambda: ended("wakes") and ended("meanwhile"))
        finally:
            stop.set()
            await supervisor
    return {"seen": seen, "sent_ms": sent_ms}


def test_a_pool_at_zero_wakes_for_a_request_and_serves_it(kafka_bootstrap, catalog, tmp_path):
    # Speedup 20: the model's load (about 28 s of engine time) takes under 2 s.
    stack = Stack(kafka_bootstrap, catalog.namespace,
                  [PoolSpec("h100", 1, ZERO), PoolSpec("h100", 1, UP)], tmp_path, speedup=20)
    try:
        result = asyncio.run(_scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    seen, sent_ms = result["seen"], result["sent_ms"]

    def first(kind, **fields):
        return next((m, at) for m, at in seen if m.type == kind and all(
            getattr(m, k, None) == v for k, v in fields.items()))

    ends = {m.request_id: (m, at) for m, at in seen if m.type in TERMINAL_EVENT_TYPES}
    assert ends["wakes"][0].type == "completed" and ends["meanwhile"][0].type == "completed"
    # The router told the autoscaler as the request began to wait, and the autoscaler woke
    # the pool (a ScalePool to one after the request was sent).
    signal, _ = first("signal_snapshot", scope="model", key=ZERO)
    assert isinstance(signal, SignalSnapshot) and signal.values == {WAITING_FOR_WORKER: 1.0}
    woken = [m for m, at in seen if isinstance(m, ScalePool) and m.pool == f"h100@{ZERO}"
             and m.replicas == 1 and m.event_time_ms >= sent_ms]
    assert woken
    # A worker started after the request was sent loaded the model and served it (on the slot
    # the stopped one left: the same worker id); the request for the model that was up did not
    # wait behind it.
    served_by = ends["wakes"][0].worker_id
    assert any(isinstance(m, WorkerStatus) and m.worker_id == served_by and m.state == "loading"
               and m.pool == f"h100@{ZERO}" and m.started_ms >= sent_ms for m, _ in seen)
    assert ends["meanwhile"][1] < ends["wakes"][1]
