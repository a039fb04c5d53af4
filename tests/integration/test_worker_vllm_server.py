"""A worker on the vLLM adapter whose server dies: the request it runs, and one dispatched to it
after, are handed back (``Requeued``, to continue elsewhere), not failed, and its heartbeat says
``crashed``. A real worker (in this process) on a real broker and a sim-server subprocess that
is SIGKILLed; the test plays the router."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from sim_server_support import MODEL, sim_server

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from schemas.events import RequestEvent, WorkerStatus
from schemas.requests import Dispatch, InferenceRequest
from workers.service import WorkerIdentity, WorkerService
from workers.vllm_engine import VllmHttpEngine

pytestmark = pytest.mark.integration

ME = WorkerIdentity(0, "worker-0", f"h100@{MODEL}", "h100", MODEL)


def _dispatch(request_id: str, max_tokens: int) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=max_tokens, model=MODEL)
    return Dispatch(event_time_ms=t, request=request, worker_id=ME.worker_id, slot=ME.slot)


async def _scenario(bootstrap, catalog, url, server) -> list:
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)
    telemetry = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                 auto_offset_reset="earliest")
    typed = TypedConsumer(telemetry, catalog, producer, "vllm-server-test")
    await telemetry.start()
    seen: list = []

    async def until(condition, timeout_s=30) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                seen.extend(i.message for i in await typed.fetch(200))

    def event(request_id, kind):
        return next((m for m in seen if isinstance(m, RequestEvent)
                     and m.request_id == request_id and m.type == kind), None)

    async def send(dispatch: Dispatch) -> None:
        outbox.emit(catalog.dispatch, dispatch, dispatch.request.request_id, partition=ME.slot)
        await outbox.flush()

    stop = asyncio.Event()
    worker = WorkerService(bootstrap, catalog, ME, VllmHttpEngine(url))
    running = asyncio.create_task(worker.run(stop))
    try:
        await send(_dispatch("cut", 20_000))  # minutes of tokens at speedup 1
        await until(lambda: event("cut", "first_token"))  # its first chunk flushed with it
        server.kill()
        server.wait()
        await until(lambda: event("cut", "requeued") or event("cut", "failed"))
        await send(_dispatch("after", 10))
        await until(lambda: event("after", "requeued") or event("after", "failed"))
        await until(lambda: any(isinstance(m, WorkerStatus) and m.state == "crashed"
                                for m in seen))
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await telemetry.stop()
        await producer.stop()
    return seen


def test_a_worker_hands_back_what_its_dead_server_held_and_what_came_after(
        kafka_bootstrap, catalog):
    with sim_server(speedup=1) as (url, server):
        seen = asyncio.run(_scenario(kafka_bootstrap, catalog, url, server))
    events = [m for m in seen if isinstance(m, RequestEvent)]

    def kinds(request_id):
        return [m.type for m in events if m.request_id == request_id]

    assert kinds("cut") == ["started", "first_token", "requeued"]
    assert kinds("after") == ["started", "requeued"]
    cut = next(m for m in events if m.request_id == "cut" and m.type == "requeued")
    assert cut.tokens_done >= 1 and cut.attempt == 1  # continued from the tokens it sent
    assert "the engine's server" in cut.detail
