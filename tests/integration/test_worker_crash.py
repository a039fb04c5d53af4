"""Two worker processes on the real broker; one is SIGKILLed mid-stream. Its unfinished requests
are identifiable from the topics alone (no heartbeat, no terminal event), with the token offset
each client stream reached, so they can be resumed: a router core fed only what the topics carry
finds them. One of them streams to a topic of its client's own (``reply_to``), which the router
does not read: its offset comes from the worker's heartbeats."""

import asyncio
import pytest
from aiokafka import AIOKafkaConsumer

from controllers.router.core import RouterCore
from infra.bus import Outbox, TypedConsumer, create_topic, make_producer, now_ms
from infra.stack import PoolSpec, Stack
from infra.tally import RunTally
from schemas.config import GovernorConfig
from schemas.events import FirstToken, WorkerStatus
from schemas.requests import Dispatch, InferenceRequest

pytestmark = pytest.mark.integration

PER_WORKER = 4
MAX_TOKENS = 3000  # about 20 s of decode on an H100: still streaming when the kill comes


def _dispatch(i: int, slot: int, reply_to: str | None = None) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=f"crash-{slot}-{i}",
                               prompt_tokens=256, max_tokens=MAX_TOKENS if slot == 0 else 20,
                               reply_to=reply_to)
    return Dispatch(event_time_ms=t, request=request, worker_id=f"worker-{slot}", slot=slot)


def _orphans(core: RouterCore, now: int) -> dict[str, tuple[str, int]]:
    """Unfinished requests on silent workers: request -> (worker, tokens the client has)."""
    silent = core.fleet.silent(now)
    return {rid: (f.dispatch.worker_id, f.tokens_done) for rid, f in core.in_flight.items()
            if f.dispatch.worker_id in silent}


async def _scenario(bootstrap, catalog, stack):
    producer = make_producer(bootstrap)
    await producer.start()
    consumer = AIOKafkaConsumer(catalog.telemetry, catalog.responses, catalog.dispatch,
                                bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    typed = TypedConsumer(consumer, catalog, producer, "crash-test")
    finder, tally = RouterCore(GovernorConfig(worker_heartbeat_timeout_s=2.0)), RunTally(prefix="crash-")
    first_tokens: set[str] = set()
    heartbeats: set[int] = set()

    async def read_until(condition, timeout_s):
        async with asyncio.timeout(timeout_s):
            while not condition():
                for item in await typed.fetch(200):
                    finder.observe(item.message, now_ms())
                    tally.observe(item.message)
                    if isinstance(item.message, FirstToken):
                        first_tokens.add(item.message.request_id)
                    if isinstance(item.message, WorkerStatus):
                        heartbeats.add(item.message.slot)

    try:
        await read_until(lambda: heartbeats >= {0, 1}, 60)
        outbox = Outbox(producer)
        own = f"{catalog.namespace}.own-replies"
        await create_topic(bootstrap, own)
        sent = [_dispatch(i, slot, own if (slot, i) == (0, 0) else None)
                for slot in (0, 1) for i in range(PER_WORKER)]
        for d in sent:
            outbox.emit(catalog.dispatch, d, d.request.request_id, partition=d.slot)
        await outbox.flush()
        tally.sent.update(d.request.request_id for d in sent)
        on_0 = {d.request.request_id for d in sent if d.slot == 0}
        on_1 = {d.request.request_id for d in sent if d.slot == 1}
        # Kill worker 0 once each of its requests has streamed its first token (and a heartbeat
        # has told how far crash-0-0's stream to its own topic went).
        await read_until(lambda: first_tokens >= on_0 and "crash-0-0" in finder.in_flight
                         and finder.in_flight["crash-0-0"].tokens_done > 0, 60)
        stack.kill("worker-0")
        await read_until(lambda: {r for r in on_1 if r in tally.terminal} == on_1, 60)
        await read_until(lambda: bool(_orphans(finder, now_ms())), 30)
        now = now_ms()
        return _orphans(finder, now), finder.fleet.silent(now), finder, tally, on_0, on_1
    finally:
        await consumer.stop()
        await producer.stop()


def test_requests_of_a_killed_worker_are_identifiable_for_resumption(kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 2)], tmp_path,
                  engine="sim", with_router=False)
    stack.start()
    try:
        found, silent, finder, tally, on_0, on_1 = asyncio.run(
            _scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    assert set(found) == on_0
    assert all(worker == "worker-0" for worker, _ in found.values())
    # Each stream stopped part-way; the offset is where a continuation resumes (crash-0-0's, on
    # its client's own topic, as the worker's last heartbeat told it).
    assert all(0 < done < MAX_TOKENS for _, done in found.values()), found
    assert all(rid not in tally.terminal for rid in on_0)
    # (worker-1 too, were its heartbeats 2 s apart on a loaded machine: its requests are
    # finished, so none of them is counted among the orphans above either way)
    assert "worker-0" in silent
    assert {rid for rid in on_1 if tally.terminal[rid]["completed"] == 1} == on_1
    assert {rid for rid in on_1 if rid in finder.in_flight} == set()
