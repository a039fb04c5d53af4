"""The router ends the response stream of a request it ends itself, on the request's reply topic
(the adapter's rule; no broker): one lost with its worker and not continued, after the tokens
the router read; one refused; one cancelled before it was placed, unless its stream has nowhere
to go."""

import asyncio
import dataclasses

import pytest

from controllers.router import service
from controllers.router.service import RouterService
from infra.bus import Outbox, StreamPartition, now_ms, stream_partition
from schemas.codec import decode
from schemas.config import GovernorConfig
from schemas.events import WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("unit")
REPLIES = "client-7.replies"


def _status(worker: str, slot: int, t: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=t, worker_id=worker, slot=slot, pool="h100@llama-3-8b",
                        gpu_type="h100", models_loaded=["llama-3-8b"], state="warm",
                        kv_blocks_free=10_000, started_ms=t - 1)


def _request(request_id: str, reply_to: str | None = REPLIES) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                            prompt_tokens=32, max_tokens=64, reply_to=reply_to)


def _router(**options) -> RouterService:
    router = RouterService("127.0.0.1:1", CATALOG, **options)
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    router._reply_topics.exist = _exists  # (no broker to list them)
    return router


async def _exists(topic: str, fresh: bool = False) -> bool:
    return topic == REPLIES


def _sent(router: RouterService) -> list[tuple[str, object]]:
    """(topic, message) of what the router queued; a reply topic's decoded as responses."""
    return [(topic, decode(CATALOG.spec(topic if topic in CATALOG.topics() else
                                        CATALOG.responses), value))
            for topic, value, _key, _partition in router.outbox._queue]


def _lose_its_worker(router: RouterService, placed: Dispatch, monkeypatch) -> None:
    """``placed``'s worker falls silent after its first 4 tokens, the other is heard: one
    resumption tick of ``router``."""
    t = now_ms()
    router._followed(ResponseChunk(event_time_ms=t, request_id=placed.request.request_id,
                                   worker_id=placed.worker_id, token_offset=0,
                                   tokens=[1, 2, 3, 4]))
    router.outbox._queue.clear()
    later = t + 10_000  # the worker that has it silent since; the other heard
    other = 1 - placed.slot
    router._followed(_status(f"w{other}", other, later))
    monkeypatch.setattr(service, "now_ms", lambda: later)
    router._settled = router._listed = True
    stop = asyncio.Event()

    async def flush() -> int:
        stop.set()  # one tick
        return 0

    router.outbox.flush = flush
    asyncio.run(router._resume_loop(stop))


def _router_of_two_workers() -> RouterService:
    router = _router(tick_s=0.0, config=GovernorConfig(retry_budget_ratio=0.0,
                                                       retry_budget_min_per_s=0.0))
    for worker, slot in (("w0", 0), ("w1", 1)):
        router._followed(_status(worker, slot, now_ms()))
    return router


def test_a_request_lost_with_its_worker_and_not_continued_ends_its_stream_on_its_reply_topic(
        monkeypatch) -> None:
    """The resumption tick sent the end to the telemetry topic (found in review, 5 Dec)."""
    router = _router_of_two_workers()
    asyncio.run(router._on_request(_request("r1")))
    _lose_its_worker(router, router.core.in_flight["r1"].dispatch, monkeypatch)
    sent = [(topic, m.type) for topic, m in _sent(router)]
    assert sent == [(CATALOG.dispatch, "cancel_request"), (REPLIES, "chunk"),
                    (CATALOG.telemetry, "failed")]
    end = _sent(router)[1][1]
    assert (end.token_offset, end.tokens, end.finish_reason, end.worker_id) == (
        4, [], "error", "router-0")


def test_a_dispatch_replying_to_an_internal_topic_gets_no_stream_end_from_the_router(
        monkeypatch) -> None:
    """A dispatch no router placed, written to a worker's partition by another client, may
    name an internal topic; the router that ended it (under its own id, forged, or adopting it
    as an orphan) sent the end of its stream into that topic (found 6 Dec)."""
    router = _router_of_two_workers()
    forged = Dispatch(event_time_ms=now_ms(), request=_request("r1", "other.control"),
                      worker_id="w0", slot=0, router_id=router.router_id)
    router._followed(forged)
    _lose_its_worker(router, forged, monkeypatch)
    sent = [(topic, m.type) for topic, m in _sent(router)]
    assert sent == [(CATALOG.dispatch, "cancel_request"), (CATALOG.telemetry, "failed")]


@pytest.mark.parametrize("reply_to, ended_on", [(REPLIES, REPLIES), (None, CATALOG.responses)])
def test_a_refused_request_ends_its_stream_before_its_first_token(reply_to, ended_on) -> None:
    router = _router(no_worker_wait_s=0)  # no worker: refused at once
    asyncio.run(router._on_request(_request("r1", reply_to)))
    (stream, end), (telemetry, rejected) = _sent(router)
    assert (stream, end.token_offset, end.tokens, end.final, end.finish_reason) == (
        ended_on, 0, [], True, "error")
    assert (telemetry, rejected.type) == (CATALOG.telemetry, "rejected")


@pytest.mark.parametrize("reply_to", [CATALOG.dispatch, "no-such-topic"])
def test_a_request_whose_stream_has_nowhere_to_go_gets_no_end_though_cancelled_early(
        reply_to) -> None:
    """A cancel read before its request ended it before its reply topic was checked: the end
    of its stream went to one of Governor's own topics, or to a topic that does not exist
    (found in review, 5 Dec)."""
    router = _router()
    asyncio.run(router._on_request(CancelRequest(event_time_ms=now_ms(), request_id="r1",
                                                 reason="user left"), 0))
    asyncio.run(router._on_request(_request("r1", reply_to), 0))
    [(telemetry, rejected)] = _sent(router)
    assert (telemetry, rejected.type, rejected.reason) == (
        CATALOG.telemetry, "rejected", "invalid_request")
    assert "r1" not in router._early_cancels


# -- a record that is no valid request -------------------------------------------------------------
def _bad_record(fields: dict, offset: int = 0, key: bytes | None = None):
    """A bad request record, keyed by its request id (as clients key requests) unless ``key``."""
    import json

    from aiokafka import ConsumerRecord

    from schemas.codec import DecodeError
    value = json.dumps({"type": "inference_request", "event_time_ms": 1, **fields}).encode()
    key = key or str(fields.get("request_id", "")).encode()
    record = ConsumerRecord(CATALOG.requests, 0, offset, 0, 0, key, value, None, len(key),
                            len(value), [])
    return record, DecodeError("schema_violation", "prompt_tokens: Input should be greater "
                                                   "than or equal to 0")


def test_a_malformed_request_naming_a_usable_id_is_refused_to_its_client() -> None:
    """Dead-lettered, and until 5 Dec nothing more: its client waited for ever. Now its stream
    ends and it is rejected, with the fields of it that are valid; an id in use is not told."""
    router = _router()
    asyncio.run(router._on_request(_request("taken", reply_to=None)))
    router.outbox._queue.clear()
    bad = [_bad_record({"request_id": "m1", "prompt_tokens": -5, "tenant": "acme",
                        "task_id": "t9", "model": "a model", "reply_to": REPLIES}, 0),
           _bad_record({"request_id": "m2", "prompt_tokens": -5}, 1),
           _bad_record({"request_id": "m3", "reply_to": "gone.topic"}, 2),
           _bad_record({"request_id": "taken", "prompt_tokens": -5}, 3),  # another's id
           _bad_record({"request_id": "not an id"}, 4)]
    asyncio.run(router._refuse_malformed(bad))
    sent = [(topic, m.request_id, m.type) for topic, m in _sent(router)]
    assert sent == [(REPLIES, "m1", "chunk"), (CATALOG.telemetry, "m1", "rejected"),
                    (CATALOG.responses, "m2", "chunk"), (CATALOG.telemetry, "m2", "rejected"),
                    (CATALOG.telemetry, "m3", "rejected")]  # (m3's stream: nowhere to go)
    m1 = _sent(router)[1][1]
    assert (m1.reason, m1.tenant, m1.task_id, m1.model) == (
        "invalid_request", "acme", "t9", "llama-3-8b")  # (its model is no valid name)
    assert m1.detail == ("not a valid request (schema_violation: prompt_tokens: Input should be "
                         "greater than or equal to 0)")
    end = _sent(router)[0][1]
    assert (end.final, end.finish_reason, end.token_offset, end.worker_id) == (
        True, "error", 0, router.router_id)
    # its id stays taken: a corrected request under it is told to take another
    error = asyncio.run(router._on_request(_request("m2", reply_to=None)))
    assert error.reason == "duplicate_request_id" and "send this one under a new id" in error.detail
    # the task of a malformed step has failed, as for any refused step
    step = _request("s2", reply_to=None).model_copy(update={"task_id": "t9", "tenant": "acme"})
    assert router.core.route(step, now_ms()).denial.reason == "task_failed"


@pytest.mark.parametrize("raw", [b"\xff{not json", b"[1, 2]", b'{"type": "cancel_request", '
                                 b'"request_id": "c1"}', b'{"request_id": "has space", '
                                 b'"prompt_tokens": 1}', b'{"request_id": "c2", "reason": "x"}'])
def test_what_names_no_usable_request_id_is_not_answered(raw: bytes) -> None:
    """(The last: no type, and nothing of a request: a cancel that lost its type, sent before
    its request, would have taken its id.)"""
    from schemas.requests import salvage_identity

    assert salvage_identity(raw) is None


def test_a_malformed_record_keyed_other_than_by_its_id_is_only_dead_lettered() -> None:
    """Keyed otherwise it may sit on another router's partition than a live request of its id,
    which that router would end on reading this one's refusal (found in review, 5 Dec)."""
    router = _router()
    asyncio.run(router._refuse_malformed([
        _bad_record({"request_id": "k1", "prompt_tokens": -5}, 0, key=b"same"),
        _bad_record({"request_id": "k2", "prompt_tokens": -5}, 1, key=None)]))
    assert [m.request_id for _, m in _sent(router)] == ["k2", "k2"]  # (its end and its refusal)
    assert "k1" not in router._seen


def test_a_malformed_request_whose_reply_to_is_no_topic_name_gets_no_stream_end() -> None:
    """Its stream has nowhere to go, as for a valid request whose reply_to is refused; it was
    sent to the responses topic."""
    router = _router()
    asyncio.run(router._refuse_malformed([
        _bad_record({"request_id": "n1", "prompt_tokens": -5, "reply_to": "no topic"}, 0),
        _bad_record({"request_id": "n2", "prompt_tokens": -5, "reply_to": ".."}, 1),
        _bad_record({"request_id": "n3", "prompt_tokens": -5, "reply_to": None}, 2)]))
    assert [(topic, m.request_id, m.type) for topic, m in _sent(router)] == [
        (CATALOG.telemetry, "n1", "rejected"), (CATALOG.telemetry, "n2", "rejected"),
        (CATALOG.responses, "n3", "chunk"), (CATALOG.telemetry, "n3", "rejected")]


@pytest.mark.parametrize("raw", [b"[" * 5000, b'{"request_id": "deep", "a": ' + b"[" * 5000
                                 + b"]" * 5000 + b"}"])
def test_a_record_nested_past_the_json_parsers_depth_is_dead_lettered_not_a_crash(raw) -> None:
    """The codec refuses it ('recursion limit exceeded'); salvaging its identity parsed it again
    with ``json.loads``, whose RecursionError is no ValueError: it escaped the router's loop,
    which stopped, and read the record again (uncommitted) at every restart."""
    from schemas.codec import DecodeError
    from schemas.requests import salvage_identity

    assert salvage_identity(raw) is None
    router = _router()
    record, _ = _bad_record({"request_id": "x"})
    record = dataclasses.replace(record, value=raw)
    asyncio.run(router._refuse_malformed([(record, DecodeError("undecodable", "too deep"))]))
    assert _sent(router) == []


@pytest.mark.parametrize("heard", ["_followed", "_recovered"])
def test_a_malformed_ids_refusal_heard_from_telemetry_keeps_it_taken(heard) -> None:
    """A router that took the partition over (a rebalance), or the refusing router restarted
    (its read-back), knows the malformed record only by its ``Rejected``: a corrected request
    under its id was taken for a redelivery of the refused one and dropped, its client told
    nothing, where the refusing router would have dead-lettered it (take another id)."""
    from schemas.events import Rejected

    router = _router()
    getattr(router, heard)(Rejected(
        event_time_ms=now_ms(), request_id="m1", reason="invalid_request",
        detail="not a valid request (schema_violation: prompt_tokens: Field required)"))
    error = asyncio.run(router._on_request(_request("m1", reply_to=None)))
    assert error is not None and error.reason == "duplicate_request_id"
    # a request refused for itself (not for its record) read again is a redelivery, as before
    getattr(router, heard)(Rejected(event_time_ms=now_ms(), request_id="r2",
                                    reason="invalid_request", detail="reply_to ..."))
    assert asyncio.run(router._on_request(_request("r2", reply_to=None))) is None


def test_a_valid_request_fetched_before_a_malformed_record_of_its_id_keeps_the_id() -> None:
    """Bad records are refused before the valid ones of their fetch are handled: the one read
    after a valid request under its id took that id (the request then dead-lettered as a
    duplicate, its client told it was invalid). Read after it, as fetched apart, it is not."""
    from infra.bus import Decoded

    def fetched(offset: int) -> Decoded:
        record, _ = _bad_record({"request_id": "dup"}, offset)
        return Decoded(record, _request("dup", reply_to=None))

    router = _router()
    asyncio.run(router._refuse_malformed([_bad_record({"request_id": "dup"}, 1)], [fetched(0)]))
    assert _sent(router) == [] and "dup" not in router._seen
    asyncio.run(router._refuse_malformed([_bad_record({"request_id": "dup"}, 1)], [fetched(2)]))
    assert [m.type for _, m in _sent(router)] == ["chunk", "rejected"]  # (read first: refused)


def test_a_malformed_steps_task_is_not_taken_for_the_default_tenants() -> None:
    """A task is a tenant's (the router and the streams key tasks by tenant and task_id). A
    malformed step whose tenant is no valid name was refused as the ``default`` tenant's, with
    its task_id: it failed the default tenant's task of that id."""
    from schemas.requests import salvage_identity

    bad = _bad_record({"request_id": "m1", "tenant": "acme corp", "task_id": "t1"}, 0)
    assert salvage_identity(bad[0].value) == {"request_id": "m1"}
    router = _router()
    asyncio.run(router._refuse_malformed([bad]))
    step = _request("s2", reply_to=None).model_copy(update={"task_id": "t1"})
    assert router.core.route(step, now_ms()).denial is None


def test_a_stream_is_pinned_where_its_key_hashes_and_the_routers_end_goes_there(
        monkeypatch) -> None:
    """The dispatch pins the stream to the partition its request id hashes to among those its
    reply topic has as the router last heard; the end the router sends on a lost worker's
    behalf goes there too. Before, the end went where the key hashed among the partitions the
    router's producer knew then: another partition than the worker's chunks, once partitions
    were added to the topic."""
    router = _router_of_two_workers()
    router._reply_topics.partitions = lambda topic: 5 if topic == REPLIES else None
    asyncio.run(router._on_request(_request("r1")))
    placed = router.core.in_flight["r1"].dispatch
    assert placed.stream_partition == stream_partition("r1", 5)
    _lose_its_worker(router, placed, monkeypatch)
    (end_partition,) = [partition for topic, _, _, partition in router.outbox._queue
                        if topic == REPLIES]
    assert end_partition == placed.stream_partition and isinstance(end_partition, StreamPartition)


def test_a_stream_of_a_topic_the_router_knows_nothing_of_is_left_to_its_key() -> None:
    router = _router_of_two_workers()  # (no broker: it knows no topic's partitions)
    asyncio.run(router._on_request(_request("r1")))
    assert router.core.in_flight["r1"].dispatch.stream_partition is None
