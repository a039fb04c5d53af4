"""A worker answers every recall, takes back a continuation of a request it handed back, and
hands back what it no longer serves: the router waits for a ``Requeued`` after a recall, and a
request nobody answers is never resumed (DESIGN: every accepted request reaches exactly one
terminal state). A real worker process on a real broker; the test plays the router."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from infra.stack import PoolSpec, Stack
from schemas import commands
from schemas.events import RequestEvent, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest

pytestmark = pytest.mark.integration

#: A request that still runs when the test, having read that it started, acts on it (a recall,
#: a restart): about 7.6 s of decode at 4x. (At 1,500 or 2,000 tokens, 2.9 or 3.8 s: a test or
#: broker stalled that long by a loaded machine acted on a request completed already.)
LONG_TOKENS = 4_000


def _dispatch(request_id: str, attempt: int = 1, resume: int = 0, max_tokens: int = 16,
              model: str = "llama-3-8b") -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=max_tokens, model=model)
    return Dispatch(event_time_ms=t, request=request, worker_id="worker-0", slot=0,
                    attempt=attempt, resume_from_token=resume)


def _recall(request_id: str, attempt: int = 1) -> CancelRequest:
    return CancelRequest(event_time_ms=now_ms(), request_id=request_id, attempt=attempt,
                         reason="recalled: overdue")


class _Telemetry:
    """What the worker publishes, read as it comes."""

    def __init__(self, bootstrap, catalog, producer) -> None:
        self.consumer = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                         auto_offset_reset="earliest")
        self.typed = TypedConsumer(self.consumer, catalog, producer, "handback-test")
        self.seen: list = []

    def events(self, request_id, kind, attempt=None) -> list:
        return [m for m in self.seen if isinstance(m, RequestEvent) and m.request_id == request_id
                and m.type == kind and (attempt is None or m.attempt == attempt)]

    async def until(self, condition, timeout_s=60) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.seen.extend(i.message for i in await self.typed.fetch(200))


async def _scenario(bootstrap, catalog, stack) -> list:
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)

    async def send(topic, message, key, partition=0):
        outbox.emit(topic, message, key, partition=partition)
        await outbox.flush()

    # Waiting on the slot when the worker starts, so read in one fetch: a dispatch and its recall.
    outbox.emit(catalog.dispatch, _dispatch("recalled-unread"), "recalled-unread", partition=0)
    outbox.emit(catalog.dispatch, _recall("recalled-unread"), "recalled-unread", partition=0)
    await outbox.flush()
    stack.start()
    watch = _Telemetry(bootstrap, catalog, producer)
    await watch.consumer.start()
    until, seen = watch.until, watch.seen

    def event(request_id, kind, attempt=None):
        return next(iter(watch.events(request_id, kind, attempt)), None)

    try:
        await until(lambda: event("recalled-unread", "requeued"))
        # Recalled while it runs, then continued on the same worker (the only one that can).
        await send(catalog.dispatch, _dispatch("again", max_tokens=LONG_TOKENS), "again")
        await until(lambda: event("again", "started", 1))
        await send(catalog.dispatch, _recall("again"), "again")
        await until(lambda: event("again", "requeued", 1))
        done = event("again", "requeued", 1).tokens_done
        await send(catalog.dispatch, _dispatch("again", 2, done, max_tokens=LONG_TOKENS), "again")
        await until(lambda: event("again", "completed", 2))
        # A model switch, then a dispatch for the model it no longer serves.
        await send(catalog.control, commands.LoadModel(
            event_time_ms=now_ms(), command_id="switch", worker_id="worker-0",
            model="llama-2-7b"), "worker-0", partition=None)
        await until(lambda: any(isinstance(m, WorkerStatus)
                                and m.models_loaded == ["llama-2-7b"] for m in seen))
        await send(catalog.dispatch, _dispatch("old-model"), "old-model")
        await until(lambda: event("old-model", "requeued"))
    finally:
        await watch.consumer.stop()
        await producer.stop()
    return seen


def _on_one_worker(bootstrap, catalog, tmp_path, scenario, *, started: bool) -> list:
    """``scenario`` run against one simulated worker on slot 0 (started first, or by the
    scenario itself); the worker is stopped after it."""
    stack = Stack(bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  engine="sim", with_router=False, speedup=4.0)
    if started:
        stack.start()
    try:
        return asyncio.run(scenario(bootstrap, catalog, stack))
    finally:
        stack.stop()


def test_a_worker_answers_recalls_takes_continuations_back_and_returns_other_models_work(
        kafka_bootstrap, catalog, tmp_path):
    seen = _on_one_worker(kafka_bootstrap, catalog, tmp_path, _scenario, started=False)
    events = [m for m in seen if isinstance(m, RequestEvent)]

    def kinds(request_id):
        return [(m.type, getattr(m, "attempt", None)) for m in events
                if m.request_id == request_id and m.type != "first_token"]

    assert kinds("recalled-unread") == [("requeued", 1)]  # never started, answered all the same
    unread = next(m for m in events if m.request_id == "recalled-unread")
    assert unread.tokens_done == 0 and unread.detail == "recalled: overdue"
    assert kinds("again") == [("started", 1), ("requeued", 1), ("started", 2), ("completed", 2)]
    completed = next(m for m in events if m.request_id == "again" and m.type == "completed")
    assert completed.output_tokens == LONG_TOKENS
    assert kinds("old-model") == [("requeued", 1)]
    assert "serves llama-2-7b now" in next(m for m in events if m.request_id == "old-model").detail
    # given back for what the worker does, not for its engine failing: no breaker counts these
    assert not any(m.engine_failed for m in events if m.type == "requeued")


async def _restart_scenario(bootstrap, catalog, stack) -> list:
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)
    watch = _Telemetry(bootstrap, catalog, producer)
    await watch.consumer.start()
    until, seen = watch.until, watch.seen

    def count(request_id, kind):
        return len(watch.events(request_id, kind))

    try:
        # A long request, then a short one that completes while the long one still runs: the
        # worker's commit cannot pass the long one, so a successor reads both again.
        for message in (_dispatch("long", max_tokens=LONG_TOKENS),
                        _dispatch("short", max_tokens=8)):
            outbox.emit(catalog.dispatch, message, message.request.request_id, partition=0)
        await outbox.flush()
        await until(lambda: count("short", "completed") == 1 and count("long", "started") == 1)
        stack.restart("worker-0")  # a crash, and the slot taken over
        await until(lambda: count("long", "completed") == 1)  # run again from the start
    finally:
        await watch.consumer.stop()
        await producer.stop()
    return seen


def test_a_worker_taking_a_slot_over_does_not_run_again_what_finished_there(
        kafka_bootstrap, catalog, tmp_path):
    seen = _on_one_worker(kafka_bootstrap, catalog, tmp_path, _restart_scenario, started=True)
    short = [m.type for m in seen if isinstance(m, RequestEvent) and m.request_id == "short"]
    assert short.count("started") == 1 and short.count("completed") == 1, short
    assert [m.type for m in seen if isinstance(m, RequestEvent) and m.request_id == "long"
            and m.type == "started"] == ["started", "started"]  # the lost one is run again

