"""A request no live worker serves waits ``no_worker_wait_s``, out of line: the router answers the
requests read after it meanwhile; after one wait in vain the model's later requests are refused at
once; one for a model no worker is of and no autoscaler pool names (a mistyped model name) is
refused at once, without a wait. A request that begins to wait with no live worker of its model is
told to the autoscaler at once (``WAITING_FOR_WORKER`` on the signals topic), so that a pool at
zero wakes while it waits. A request waiting for its continuation is ended by its client's cancel,
read here or forwarded to its slot by another router. A request whose ``reply_to`` names a topic
that does not exist is refused rather than handed to a worker that cannot send its chunks. The
router is real and so is the broker; the one worker is its heartbeats (and the events the test
sends)."""

import asyncio
import contextlib

import pytest
from aiokafka import AIOKafkaConsumer

from controllers.router.service import RouterService
from infra.bus import Outbox, create_topic, make_producer, now_ms, read_to_end, reading
from schemas.codec import decode
from schemas.events import WAITING_FOR_WORKER, Queued, Rejected, Requeued, WorkerStatus
from schemas.requests import CancelRequest, InferenceRequest

pytestmark = pytest.mark.integration

WAIT_S = 5.0  # a margin of seconds: a stalled router does not put two answers as far apart


def _request(request_id: str, model: str) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id, model=model,
                            prompt_tokens=32, max_tokens=4)


async def _heartbeats(outbox: Outbox, catalog, started_ms: int, state: dict | None = None,
                      slot: int = 0, model: str = "llama-3-8b") -> None:
    state = state if state is not None else {"state": "warm"}
    worker = f"w{slot}"
    while True:
        outbox.emit(catalog.telemetry, WorkerStatus(
            event_time_ms=now_ms(), worker_id=worker, slot=slot, pool=f"h100@{model}",
            gpu_type="h100", models_loaded=[model] if state["state"] == "warm" else [],
            kv_blocks_free=10_000, started_ms=started_ms, state=state["state"]),
            worker, 0)  # one partition: in order
        await outbox.flush()
        await asyncio.sleep(0.3)  # the heartbeat period, not a wait for a condition


class _LiveRouter:
    """A router on the broker, one worker heart-beating, and the telemetry as it comes: each
    message with the broker's timestamp of its record."""

    def __init__(self, bootstrap, catalog, loading_model: str | None = None,
                 **router_options) -> None:
        self.bootstrap, self.catalog = bootstrap, catalog
        self.loading_model = loading_model
        self.router = RouterService(bootstrap, catalog, recovery_window_s=0, **router_options)
        self.worker = {"state": "warm"}
        self.seen: list[tuple[object, int]] = []

    async def __aenter__(self) -> "_LiveRouter":
        self.stop = asyncio.Event()
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        self.outbox = Outbox(self.producer)
        self.beats = [asyncio.create_task(
            _heartbeats(self.outbox, self.catalog, now_ms(), self.worker))]
        if self.loading_model is not None:  # a second worker that loads for ever
            self.beats.append(asyncio.create_task(_heartbeats(
                self.outbox, self.catalog, now_ms(), {"state": "loading"}, 1, self.loading_model)))
        self.running = asyncio.create_task(self.router.run(self.stop))
        self.telemetry = AIOKafkaConsumer(self.catalog.telemetry, bootstrap_servers=self.bootstrap,
                                          auto_offset_reset="earliest")
        await self.telemetry.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.telemetry.stop()
        self.stop.set()
        await self.running
        for beats in self.beats:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        await self.producer.stop()

    async def send(self, topic, message, key, partition=0) -> None:
        self.outbox.emit(topic, message, key, partition)
        await self.outbox.flush()

    async def until(self, condition, timeout_s=60) -> None:
        spec = self.catalog.spec(self.catalog.telemetry)
        async with asyncio.timeout(timeout_s):
            while not condition():
                for records in (await self.telemetry.getmany(timeout_ms=200)).values():
                    self.seen += [(decode(spec, r.value), r.timestamp) for r in records]

    def answer(self, request_id):
        """The request's Queued or Rejected and when it was written, or None."""
        return next(((m, at) for m, at in self.seen if isinstance(m, Queued | Rejected)
                     and m.request_id == request_id), None)


async def _scenario(bootstrap, catalog) -> dict:
    async with _LiveRouter(bootstrap, catalog, loading_model="llama-2-7b",
                           no_worker_wait_s=WAIT_S) as live:
        await live.send(catalog.requests, _request("probe", "llama-3-8b"), "probe")
        await live.until(lambda: live.answer("probe") is not None)  # up, and hears the worker
        await live.until(lambda: any(m.type == "worker_status" and m.worker_id == "w1"
                                     for m, _ in live.seen))  # (the router reads it too)
        batch = [_request("good-1", "llama-3-8b"), _request("slow-1", "llama-2-7b"),
                 _request("slow-2", "llama-2-7b"), _request("typo-1", "llama-3-8B"),
                 _request("good-2", "llama-3-8b")]
        for request in batch:  # one partition: the router reads them in this order
            live.outbox.emit(catalog.requests, request, request.request_id, 0)
        await live.outbox.flush()
        await live.until(lambda: all(live.answer(r.request_id) for r in batch))
        waiting = []  # what the router told the autoscaler (on the signals topic)
        async with reading(bootstrap, catalog, [catalog.signals], "test",
                           offset_reset="earliest") as typed:
            await read_to_end(typed, catalog.signals, lambda item: waiting.append(
                (item.message, item.record.timestamp)))
        return {r.request_id: live.answer(r.request_id) for r in batch} | {"waiting": waiting}


def test_a_request_for_a_model_no_worker_serves_holds_up_nothing(kafka_bootstrap, catalog):
    answers = asyncio.run(_scenario(kafka_bootstrap, catalog))
    (good1, good1_at), (slow1, slow1_at) = answers["good-1"], answers["slow-1"]
    (slow2, slow2_at), (typo1, typo1_at) = answers["slow-2"], answers["typo-1"]
    good2, good2_at = answers["good-2"]
    assert isinstance(good1, Queued) and isinstance(good2, Queued)
    # slow-1 and slow-2 waited with no live worker of their model: the autoscaler was told as
    # each wait began (it wakes a pool at zero), not when it ended in a refusal.
    assert {(s.scope, s.key) for s, _ in answers["waiting"]} == {("model", "llama-2-7b")}
    assert sum(s.values[WAITING_FOR_WORKER] for s, _ in answers["waiting"]) == 2.0
    signal_at = answers["waiting"][0][1]
    assert signal_at - good1_at < 1000 and slow1_at - signal_at >= (WAIT_S - 0.5) * 1000
    # A model a worker loads: waited for, in vain here (it loads for ever).
    assert isinstance(slow1, Rejected) and slow1.reason == "no_capacity"
    # (what its worker does instead is said: before 6 Dec only "no live worker serves ...")
    assert slow1.detail == "no live worker serves llama-2-7b (w1 loading)"
    assert slow1.retry_after_s == 5.0
    # good-1, read before slow-1, and good-2, read after it, were answered before its wait ended
    assert slow1_at - good1_at >= (WAIT_S - 0.5) * 1000
    assert slow1_at - good2_at >= (WAIT_S - 0.5) * 1000
    # slow-2 did not wait again once slow-1 had waited in vain.
    assert isinstance(slow2, Rejected) and slow2.reason == "no_capacity"
    assert f"none came while an earlier request waited {WAIT_S:g}s" in slow2.detail
    assert slow2_at - slow1_at < (WAIT_S - 0.5) * 1000
    # A model no worker is of and no pool names: refused without a wait.
    assert isinstance(typo1, Rejected) and typo1.reason == "no_capacity"
    assert typo1.detail.startswith("no worker serves llama-3-8B, none has lately, and no autoscaler "
                                   "pool names it: not waited for (the fleet's models: ")
    assert "llama-2-7b, llama-3-8b" in typo1.detail
    assert typo1.retry_after_s is None  # (no retry helps: it said 5 s before 6 Dec)
    assert slow1_at - typo1_at >= (WAIT_S - 0.5) * 1000


async def _cancel_scenario(bootstrap, catalog, forwarded: bool = False) -> list:
    """``forwarded``: the cancel comes as another router that read it forwards it, to the
    request's slot on the dispatch topic, not on the request topic."""
    async with _LiveRouter(bootstrap, catalog) as live:
        def has(kind):
            return any(m.type == kind and getattr(m, "request_id", None) == "waits"
                       for m, _ in live.seen)

        await live.send(catalog.requests, _request("waits", "llama-3-8b"), "waits")
        await live.until(lambda: has("queued"))
        # The worker drains and hands it back; with no worker to continue it on, the request
        # waits for one, and its client leaves.
        live.worker["state"] = "draining"
        await live.until(lambda: any(m.type == "worker_status" and m.state == "draining"
                                     for m, _ in live.seen))
        await live.send(catalog.telemetry, Requeued(  # behind the draining heartbeat, as a worker
            event_time_ms=now_ms(), request_id="waits", worker_id="w0", attempt=1,
            tokens_done=2, detail="shutting down"), "waits")
        await live.until(lambda: has("requeued"))
        cancel = CancelRequest(event_time_ms=now_ms(), request_id="waits", reason="user left")
        if forwarded:
            await live.send(catalog.dispatch, cancel, "waits", partition=0)  # w0's slot
        else:
            await live.send(catalog.requests, cancel, "waits")
        await live.until(lambda: has("cancelled"))
        return [m for m, _ in live.seen]


@pytest.mark.parametrize("forwarded", [False, True],
                         ids=["read here", "forwarded by another router"])
def test_a_client_cancel_ends_a_request_waiting_for_its_continuation(kafka_bootstrap, catalog,
                                                                     forwarded):
    seen = asyncio.run(_cancel_scenario(kafka_bootstrap, catalog, forwarded))
    ended = [m for m in seen if getattr(m, "request_id", None) == "waits"
             and m.type in ("cancelled", "completed", "failed")]
    assert [(m.type, m.reason) for m in ended] == [("cancelled", "user left")]


async def _reply_to_scenario(bootstrap, catalog) -> dict:
    missing, replies = f"{catalog.namespace}.no-such-topic", f"{catalog.namespace}.my-replies"
    await create_topic(bootstrap, replies)
    async with _LiveRouter(bootstrap, catalog) as live:
        for rid, topic in (("to-missing", missing), ("to-missing-again", missing),
                           ("to-replies", replies)):
            request = _request(rid, "llama-3-8b").model_copy(update={"reply_to": topic})
            await live.send(catalog.requests, request, rid)
            await live.until(lambda rid=rid: live.answer(rid) is not None)
        answers = {rid: live.answer(rid)[0]
                   for rid in ("to-missing", "to-missing-again", "to-replies")}
    async with reading(bootstrap, catalog, [], "reply-to-test") as typed:  # nothing created it
        listed = await typed.consumer.topics()
    return {"answers": answers, "missing": missing, "created": missing in listed}


def test_a_request_whose_reply_to_topic_does_not_exist_is_refused(kafka_bootstrap, catalog):
    seen = asyncio.run(_reply_to_scenario(kafka_bootstrap, catalog))
    answers, missing = seen["answers"], seen["missing"]
    for rid in ("to-missing", "to-missing-again"):  # the second: from the miss, or asked again
        assert isinstance(answers[rid], Rejected) and answers[rid].reason == "invalid_request"
        assert answers[rid].detail == (f"reply_to topic {missing!r} does not exist; create it "
                                       "before sending requests that name it")
    assert isinstance(answers["to-replies"], Queued)  # one that exists is placed
    assert not seen["created"]  # the check did not create it either


async def _full_scenario(bootstrap, catalog) -> dict:
    async with _LiveRouter(bootstrap, catalog, loading_model="llama-2-7b",
                           no_worker_wait_s=WAIT_S) as live:
        await live.send(catalog.requests, _request("probe", "llama-3-8b"), "probe")
        await live.until(lambda: live.answer("probe") is not None)
        await live.until(lambda: any(m.type == "worker_status" and m.worker_id == "w1"
                                     for m, _ in live.seen))
        await live.send(catalog.requests, _request("slow", "llama-2-7b"), "slow")
        await live.until(lambda: len(live.router.waiting) == 1)  # (the router runs in here)
        await live.send(catalog.requests, _request("good", "llama-3-8b"), "good")
        await live.until(lambda: live.answer("slow") and live.answer("good"))
        return {rid: live.answer(rid) for rid in ("slow", "good")}


def test_a_router_whose_waiting_room_is_full_reads_no_more_until_one_is_answered(
        kafka_bootstrap, catalog, monkeypatch):
    from controllers.router import service

    monkeypatch.setattr(service, "_WAITING_MAX", 1)
    answers = asyncio.run(_full_scenario(kafka_bootstrap, catalog))
    (slow, slow_at), (good, good_at) = answers["slow"], answers["good"]
    assert isinstance(slow, Rejected) and isinstance(good, Queued)
    assert good_at >= slow_at  # read only once slow's wait had ended and made room
