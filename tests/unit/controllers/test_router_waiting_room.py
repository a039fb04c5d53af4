"""Requests waiting for a worker of their model wait out of line: the router answers the requests
read after them meanwhile, places each model's in the order they were read, commits each
partition no further than its first request still waiting, and leaves them unanswered (read
again) when its partitions move (the adapter's rule; no broker)."""

import asyncio
import time

from aiokafka import TopicPartition

from controllers.router.service import RouterService, _queued
from controllers.router.waiting import Waiting, WaitingRoom
from infra.bus import Outbox, now_ms
from schemas.codec import decode
from schemas.events import WAITING_FOR_WORKER, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("unit")


def _request(request_id: str, model: str) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id, model=model,
                            prompt_tokens=32, max_tokens=4)


def _status(worker: str, slot: int, model: str, state: str) -> WorkerStatus:
    t = now_ms()
    return WorkerStatus(event_time_ms=t, worker_id=worker, slot=slot, pool=f"h100@{model}",
                        gpu_type="h100", models_loaded=[model] if state == "warm" else [],
                        state=state, kv_blocks_free=10_000, started_ms=t - 1)


def _router(**options) -> RouterService:
    """A router hearing a warm worker of llama-3-8b and one of llama-2-7b still loading."""
    router = RouterService("127.0.0.1:1", CATALOG, **options)
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    router._followed(_status("w0", 0, "llama-3-8b", "warm"), 0)
    router._followed(_status("w1", 1, "llama-2-7b", "loading"), 0)
    return router


def _sent(router: RouterService) -> list[tuple[str, object]]:
    """What the router queued, decoded, and the queue emptied; then the Queued of the requests
    it placed (sent once their Dispatch is on the broker)."""
    out = [(topic, decode(CATALOG.spec(topic), value))
           for topic, value, _key, _partition in router.outbox._queue]
    router.outbox._queue.clear()
    out += [(CATALOG.telemetry, queued) for queued in router._placed]
    router._placed.clear()
    return out


def _answers(sent) -> list[tuple[str, str]]:
    return [(m.type, m.request_id) for _, m in sent if m.type in ("queued", "rejected", "cancelled")]


def test_a_waiting_request_holds_up_neither_the_requests_read_after_it_nor_their_commits():
    router = _router()
    tp0, tp1 = TopicPartition(CATALOG.requests, 0), TopicPartition(CATALOG.requests, 1)

    async def read(request, partition, offset):
        await router._on_request(request, partition, offset)
        tp = TopicPartition(CATALOG.requests, partition)
        router._read_to[tp] = max(router._read_to.get(tp, 0), offset + 1)  # (as the loop does)

    asyncio.run(read(_request("slow-1", "llama-2-7b"), 0, 10))
    asyncio.run(read(_request("good-1", "llama-3-8b"), 0, 11))
    asyncio.run(read(_request("slow-2", "llama-2-7b"), 1, 5))
    asyncio.run(read(_request("good-2", "llama-3-8b"), 1, 6))
    router._tell_waiting()  # (as the batch loop does, with its answers)
    sent = _sent(router)
    assert _answers(sent) == [("queued", "good-1"), ("queued", "good-2")]
    # the autoscaler is told that two began to wait (no live worker of llama-2-7b): one signal
    signals = [m for topic, m in sent if topic == CATALOG.signals]
    assert [(s.key, s.values) for s in signals] == [("llama-2-7b", {WAITING_FOR_WORKER: 2.0})]
    assert len(router.waiting) == 2
    assert router.metrics.registry.get_sample_value("governor_router_requests_waiting") == 2
    # each partition is committed up to its first request still waiting
    assert router._commit_points() == {tp0: 10, tp1: 5}
    router._committed.update({tp0: 10, tp1: 5})
    router._retry_waiting()  # still loading: both wait on
    assert _sent(router) == [] and router._commit_points() == {}

    router._followed(_status("w1", 1, "llama-2-7b", "warm"), 0)
    router._retry_waiting()
    assert _answers(_sent(router)) == [("queued", "slow-1"), ("queued", "slow-2")]  # in order
    assert len(router.waiting) == 0
    assert router._commit_points() == {tp0: 12, tp1: 7}


def test_a_models_later_request_waits_behind_its_earlier_one_even_if_a_worker_could_take_it():
    """Placed in the order they were read: a request read after one of its model still waiting
    is not routed past it."""
    router = _router()
    asyncio.run(router._on_request(_request("first", "llama-2-7b"), 0, 1))
    router._followed(_status("w1", 1, "llama-2-7b", "warm"), 0)  # warm before the next is read
    asyncio.run(router._on_request(_request("second", "llama-2-7b"), 0, 2))
    assert _answers(_sent(router)) == []
    router._retry_waiting()
    assert _answers(_sent(router)) == [("queued", "first"), ("queued", "second")]


def test_a_request_waited_for_in_vain_is_refused_and_its_models_later_ones_at_once():
    router = _router(no_worker_wait_s=20.0)
    asyncio.run(router._on_request(_request("slow-1", "llama-2-7b"), 0, 1))
    asyncio.run(router._on_request(_request("slow-2", "llama-2-7b"), 0, 2))
    router._retry_waiting()
    assert _answers(_sent(router)) == []
    router._retry_waiting(now=time.monotonic() + 20.0)  # their waits are over
    rejected = [m for _, m in _sent(router) if m.type == "rejected"]
    assert [(m.request_id, m.reason, m.retry_after_s) for m in rejected] == [
        ("slow-1", "no_capacity", 5.0), ("slow-2", "no_capacity", 5.0)]
    assert rejected[0].detail == "no live worker serves llama-2-7b (w1 loading)"
    assert "none came while an earlier request waited 20s" in rejected[1].detail
    asyncio.run(router._on_request(_request("slow-3", "llama-2-7b"), 0, 3))  # not waited for
    (rejected,) = [m for _, m in _sent(router) if m.type == "rejected"]
    assert rejected.request_id == "slow-3" and "none came" in rejected.detail
    assert len(router.waiting) == 0


def test_a_client_cancel_ends_a_request_waiting_for_a_worker():
    router = _router()
    asyncio.run(router._on_request(_request("slow", "llama-2-7b"), 0, 1))
    asyncio.run(router._on_request(CancelRequest(event_time_ms=now_ms(), request_id="slow",
                                                 reason="user left"), 0, 2))
    (cancelled,) = [m for _, m in _sent(router) if m.type == "cancelled"]
    assert (cancelled.request_id, cancelled.reason) == ("slow", "user left")
    assert cancelled.model == "llama-2-7b" and len(router.waiting) == 0
    router._followed(_status("w1", 1, "llama-2-7b", "warm"), 0)
    router._retry_waiting()
    assert _answers(_sent(router)) == []  # not placed after all


class _Acks:
    """A producer that acknowledges every send at once and keeps what was sent."""

    client = None

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int | None]] = []

    async def send(self, topic, value, key=None, partition=None):
        self.sent.append((topic, value, partition))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def test_a_rebalance_sends_the_waiting_requests_back_to_their_partitions_to_be_read_again():
    """Sent again to the end of its partition, a waiting request is read again by the
    partition's next owner; the requests answered after it are committed, not read again."""
    router = _router()
    acks = _Acks()
    router.outbox = Outbox(acks)
    tp0 = TopicPartition(CATALOG.requests, 0)
    asyncio.run(router._on_request(_request("slow", "llama-2-7b"), 0, 1))
    asyncio.run(router._on_request(_request("good", "llama-3-8b"), 0, 2))
    router._read_to[tp0] = 3
    assert router._commit_points() == {tp0: 1}
    asyncio.run(router.outbox.flush())  # (as the batch loop does)
    asyncio.run(router._send_queued())
    acks.sent.clear()
    asyncio.run(router._hand_over())
    assert len(router.waiting) == 0 and router._commit_points() == {}
    ((topic, value, partition),) = acks.sent
    assert (topic, partition) == (CATALOG.requests, 0)
    assert decode(CATALOG.spec(topic), value).request_id == "slow"
    assert "slow" not in router._seen and "good" in router._seen  # read again, it is new
    router._followed(_status("w1", 1, "llama-2-7b", "warm"), 0)
    acks.sent.clear()
    asyncio.run(router._on_request(_request("slow", "llama-2-7b"), 0, 3))
    asyncio.run(router.outbox.flush())
    asyncio.run(router._send_queued())  # (its Dispatch is on the broker)
    assert [decode(CATALOG.spec(t), v).type for t, v, _ in acks.sent] == ["dispatch", "queued"]


def test_the_waiting_room_keeps_each_partitions_first_offset_and_each_models_count():
    room = WaitingRoom()
    for rid, model, partition, offset in (("a", "m1", 0, 7), ("b", "m2", 0, 3), ("c", "m1", 2, 9)):
        room.add(Waiting(_request(rid, model), give_up=0.0, partition=partition, offset=offset))
    assert room.first_offsets() == {0: 3, 2: 9}
    assert room.holds("m1") and room.holds("m2") and "b" in room
    room.remove("b")
    assert room.first_offsets() == {0: 7, 2: 9} and not room.holds("m2")
    room.remove("a")
    assert room.holds("m1")  # c still waits
    assert [w.request.request_id for w in room.clear()] == ["c"]
    assert len(room) == 0 and not room.holds("m1") and room.remove("c") is None


def test_with_no_wait_a_request_no_worker_can_take_is_refused_at_once():
    router = _router(no_worker_wait_s=0.0)
    asyncio.run(router._on_request(_request("slow", "llama-2-7b"), 0, 1))
    (rejected,) = [m for _, m in _sent(router) if m.type == "rejected"]
    assert (rejected.request_id, rejected.reason) == ("slow", "no_capacity")
    assert len(router.waiting) == 0


def test_a_cancel_read_before_its_request_ends_it_when_it_comes():
    """Sent after its request but read first (the request sent back to the end of its partition
    by a router that let it go, or a client that sent them out of order): it used to be dropped,
    and the request served."""
    router = _router()
    cancel = CancelRequest(event_time_ms=now_ms(), request_id="early", reason="user left")
    asyncio.run(router._on_request(cancel, 0, 1))
    assert _sent(router) == []
    asyncio.run(router._on_request(_request("early", "llama-3-8b"), 0, 2))
    (stream, end), (telemetry, cancelled) = _sent(router)
    assert (stream, end.token_offset, end.final, end.finish_reason) == (
        CATALOG.responses, 0, True, "abort")  # its stream ends, before its first token
    assert (telemetry, cancelled.type, cancelled.request_id, cancelled.reason) == (
        CATALOG.telemetry, "cancelled", "early", "user left")
    asyncio.run(router._on_request(_request("early", "llama-3-8b"), 0, 3))  # redelivered
    assert _sent(router) == [] and "early" not in router.core.in_flight


def test_a_rebalance_hands_on_the_recent_cancels_read_before_their_requests():
    """Kept only in this router's memory, a cancel whose request the partition's next owner
    reads would be lost: it is sent again to the end of its partition (if sent in the last five
    minutes; an older one's request is not coming)."""
    router = _router()
    acks = _Acks()
    router.outbox = Outbox(acks)
    recent = CancelRequest(event_time_ms=now_ms(), request_id="soon", reason="user left")
    old = CancelRequest(event_time_ms=now_ms() - 301_000, request_id="never", reason="gone")
    asyncio.run(router._on_request(recent, 2, 7))
    asyncio.run(router._on_request(old, 1, 3))
    asyncio.run(router._hand_over())
    sent = [(t, decode(CATALOG.spec(t), v), p) for t, v, p in acks.sent]
    assert [(t, m.request_id, m.reason, p) for t, m, p in sent] == [
        (CATALOG.requests, "soon", "user left", 2)]
    assert not router._early_cancels


def test_a_model_waited_for_in_vain_is_waited_for_again_once_its_pool_is_sized_up():
    """Its cap raised from 0, the autoscaler commands a worker: refusing the model's requests at
    once until one is placed (as after a wait in vain) refused every request while it loaded."""
    from schemas.commands import ScalePool

    def scale(replicas: int) -> ScalePool:
        return ScalePool(event_time_ms=now_ms(), command_id=f"s{replicas}", issued_by="autoscaler",
                         pool="h100@llama-2-7b", gpu_type="h100", model="llama-2-7b",
                         replicas=replicas, reason="test")

    router = _router(no_worker_wait_s=20.0)
    asyncio.run(router._on_request(_request("first", "llama-2-7b"), 0, 1))
    router._retry_waiting(now=time.monotonic() + 20.0)  # waited in vain
    assert "llama-2-7b" in router._unserved
    router._followed(scale(0))  # (restated at zero: still refused at once)
    asyncio.run(router._on_request(_request("second", "llama-2-7b"), 0, 2))
    assert len(router.waiting) == 0
    router._followed(scale(1))
    asyncio.run(router._on_request(_request("third", "llama-2-7b"), 0, 3))
    assert "third" in router.waiting
    router._followed(scale(1))  # restated: no change
    assert "third" in router.waiting


def test_a_refusal_for_no_live_worker_says_what_the_models_workers_do_instead():
    # (a vLLM worker whose server is gone heart-beats crashed: before 6 Dec the client was told
    # only "no live worker serves llama-2-7b")
    router = _router(no_worker_wait_s=20.0)
    router._followed(_status("w2", 2, "llama-2-7b", "crashed"), 0)
    quiet = _status("w3", 3, "llama-2-7b", "warm")
    router._followed(quiet.model_copy(update={"event_time_ms": now_ms() - 12_000}), 0)
    asyncio.run(router._on_request(_request("slow-1", "llama-2-7b"), 0, 1))
    router._retry_waiting(now=time.monotonic() + 20.0)
    [rejected] = [m for _, m in _sent(router) if m.type == "rejected"]
    assert rejected.detail == ("no live worker serves llama-2-7b (w1 loading, w2 crashed, "
                               "w3 silent for 12s)")


def test_a_request_another_router_placed_without_its_queued_is_sent_it_when_read_again():
    # (a router sends a Queued once its Dispatch is acknowledged: one that stopped between the
    # two left its request placed without one, and the partition's next router dropped the
    # redelivery as placed: the request ended with no Queued, the audit's
    # terminal_without_queued)
    router = _router()
    placed_ms = now_ms() - 500
    requests = {rid: _request(rid, "llama-3-8b") for rid in ("lost", "heard")}
    for request in requests.values():
        router._followed(Dispatch(event_time_ms=placed_ms, request=request, worker_id="w0",
                                  slot=0, router_id="router-gone"), 0)
    router._followed(_queued(requests["heard"]), 0)  # (its router sent this one)
    _sent(router)
    for offset, rid in enumerate(("lost", "heard", "lost")):  # read again here
        asyncio.run(router._on_request(requests[rid], 0, offset))
    queued = [m for _, m in _sent(router) if m.type == "queued"]
    assert [(m.request_id, m.event_time_ms) for m in queued] == [("lost", placed_ms)]  # once
