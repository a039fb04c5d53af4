"""Bad records go to the dead-letter topic with their reason; the component carries on."""

import asyncio
import json
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from controllers.router.service import RouterService
from schemas.codec import decode, encode
from schemas.events import DeadLetter, Rejected
from schemas.examples import example_request

pytestmark = pytest.mark.integration

NOT_A_DOCUMENT = b"\xff\xfe{not json"
VIOLATES_SCHEMA = json.dumps({"type": "inference_request", "request_id": "r", "prompt_tokens": -5,
                              "max_tokens": 1, "created_ms": 1, "event_time_ms": 1}).encode()
OVERSIZED_FIELD = encode(example_request()).replace(b'"tenant":"acme"', b'"tenant":"' + b"x" * 5000 + b'"')


async def _scenario(bootstrap, catalog):
    now = int(time.time() * 1000)  # (the router refuses a request created over a day ago)
    # A valid request after the bad ones: the router must still be running to answer it.
    valid = example_request("after-bad").model_copy(update={
        "deadline_ms": None, "created_ms": now, "event_time_ms": now})
    # then the same request sent again (later), another request under its id, and a last one
    again = valid.model_copy(update={"event_time_ms": now + 1})
    reused = valid.model_copy(update={"max_tokens": valid.max_tokens + 1})
    last = valid.model_copy(update={"request_id": "last"})
    records = [(b"?", NOT_A_DOCUMENT), (b"r", VIOLATES_SCHEMA), (b"req-1", OVERSIZED_FIELD),
               *((m.request_id.encode(), encode(m)) for m in (valid, again, reused, last))]
    return await _answers_after(bootstrap, catalog, records, lambda letters, answers: len(
        letters) >= 4 and {"last", "r", "req-1"} <= {a.request_id for a in answers}, 60)


async def _answers_after(bootstrap, catalog, records: list[tuple[bytes, bytes]], done,
                         timeout_s: float = 30):
    """``records`` (key, value: a client keys a request by its id) on partition 0 of the
    requests topic, then a router started: the dead letters and the lifecycle events read until
    ``done(letters, answers)`` (the router must still run)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    for key, raw in records:
        await producer.send_and_wait(catalog.requests, raw, key=key, partition=0)
    await producer.stop()
    stop = asyncio.Event()
    router = RouterService(bootstrap, catalog, no_worker_wait_s=0.2)
    running = asyncio.create_task(router.run(stop))
    consumer = AIOKafkaConsumer(catalog.deadletter, catalog.telemetry, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    letters, answers = [], []
    try:
        async with asyncio.timeout(timeout_s):
            while not done(letters, answers):
                assert not running.done(), running.exception()
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    for r in batch:
                        message = decode(catalog.spec(r.topic), r.value)
                        (letters if isinstance(message, DeadLetter) else answers).append(message)
    finally:
        await consumer.stop()
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
    return letters, answers


def _answered(request_id: str):
    return lambda letters, answers: request_id in {a.request_id for a in answers}


def test_bad_records_are_dead_lettered_with_reasons_and_the_router_carries_on(kafka_bootstrap, catalog):
    letters, answers = asyncio.run(_scenario(kafka_bootstrap, catalog))
    by_offset = sorted(letters, key=lambda d: d.offset)
    assert [d.reason for d in by_offset] == ["undecodable", "schema_violation", "oversized_field",
                                             "duplicate_request_id"]
    assert by_offset[0].raw == NOT_A_DOCUMENT and by_offset[0].raw_size == len(NOT_A_DOCUMENT)
    assert "prompt_tokens" in by_offset[1].error
    assert "tenant" in by_offset[2].error and "64" in by_offset[2].error
    assert all(d.source_topic == catalog.requests and d.partition == 0 for d in letters)
    assert [d.offset for d in by_offset] == [0, 1, 2, 5]
    # another request under the id of one answered is set aside, saying so; read again, the
    # same request is dropped
    assert "'after-bad' is already in use by another request (max_tokens differ)" in \
        by_offset[3].error
    # The valid requests that followed were handled: no worker is up, so each is rejected with a
    # reason, once. The bad records that name a valid request id are refused to their clients
    # (until 5 Dec they heard nothing), saying why.
    rejected = {a.request_id: a for a in answers if isinstance(a, Rejected)}
    assert sorted((a.request_id, a.reason) for a in rejected.values()) == [
        ("after-bad", "no_capacity"), ("last", "no_capacity"), ("r", "invalid_request"),
        ("req-1", "invalid_request")]  # (each on its key's partition of the telemetry topic)
    assert rejected["r"].detail.startswith("not a valid request (schema_violation: ")
    assert "prompt_tokens" in rejected["r"].detail
    assert rejected["req-1"].tenant == "default" and "oversized_field" in rejected["req-1"].detail




async def _committed_after_a_bad_last_record(bootstrap, topic, group_id, component) -> int:
    """A bad record last on partition 0 of ``topic``, ``component`` (``run(stop)``) started: the
    offset its group commits there once it has moved past the record's dead letter (a restart
    reads from there: below 1, it would dead-letter the record again; None: nothing committed
    within 30 s)."""
    from aiokafka import TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    await producer.send_and_wait(topic, NOT_A_DOCUMENT, key=b"k", partition=0)
    await producer.stop()
    stop = asyncio.Event()
    running = asyncio.create_task(component.run(stop))
    group = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                             enable_auto_commit=False)
    await group.start()
    committed = None
    try:
        async with asyncio.timeout(30):
            while committed is None or committed < 1:
                committed = await group.committed(TopicPartition(topic, 0))
                await asyncio.sleep(0.1)
    except TimeoutError:
        pass
    finally:
        await group.stop()
        stop.set()
        await running
    return committed


def test_a_router_commits_past_a_bad_last_request(kafka_bootstrap, catalog):
    router = RouterService(kafka_bootstrap, catalog, no_worker_wait_s=0.2, recovery_window_s=0)
    assert asyncio.run(_committed_after_a_bad_last_record(
        kafka_bootstrap, catalog.requests, f"{catalog.namespace}.router", router)) == 1
    # counted, by topic and reason (until 6 Dec only logged)
    assert router.metrics.registry.get_sample_value("governor_dead_letters_total", {
        "topic": catalog.requests, "reason": "undecodable"}) == 1


def test_a_worker_commits_past_a_bad_last_dispatch(kafka_bootstrap, catalog):
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    worker = WorkerService(kafka_bootstrap, catalog,
                           WorkerIdentity(0, "w0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=100), drain_timeout_s=1)
    assert asyncio.run(_committed_after_a_bad_last_record(
        kafka_bootstrap, catalog.dispatch, f"{catalog.namespace}.worker-0", worker)) == 1
    assert worker.metrics.registry.get_sample_value("governor_dead_letters_total", {
        "topic": catalog.dispatch, "reason": "undecodable"}) == 1


def test_a_bad_dispatch_does_not_commit_past_a_dispatch_still_running(kafka_bootstrap, catalog):
    """A fetch of a quick dispatch, a long one and a bad record: the commit moves past the quick
    one once it completes, not past the long one while it runs (the bad record's offset, taken
    before the others, had made the worker take them for redeliveries, untracked: a crash then
    lost the long request)."""
    from aiokafka import TopicPartition

    from infra.bus import now_ms
    from schemas.requests import Dispatch, InferenceRequest
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    worker = WorkerService(kafka_bootstrap, catalog,
                           WorkerIdentity(0, "w0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=100), drain_timeout_s=1)

    def dispatch(rid: str, max_tokens: int) -> bytes:
        t = now_ms()
        request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid,
                                   prompt_tokens=16, max_tokens=max_tokens, model="llama-3-8b")
        return encode(Dispatch(event_time_ms=t, request=request, worker_id="w0", slot=0,
                               attempt=1))

    async def scenario() -> tuple[int, list[str]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        for raw in (dispatch("quick", 4), dispatch("long", 100_000), NOT_A_DOCUMENT):
            await producer.send_and_wait(catalog.dispatch, raw, key=b"k", partition=0)
        await producer.stop()
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        group = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap,
                                 group_id=f"{catalog.namespace}.worker-0", enable_auto_commit=False)
        await group.start()
        committed = None
        try:
            async with asyncio.timeout(30):
                while committed is None or committed < 1:  # the quick one completed
                    committed = await group.committed(TopicPartition(catalog.dispatch, 0))
                    await asyncio.sleep(0.1)
            still = list(worker._running)
        finally:
            await group.stop()
            stop.set()
            await running
        return committed, still

    committed, still_running = asyncio.run(scenario())
    assert still_running == ["long"]
    assert committed == 1  # the long one's offset: read again after a crash


def _valid(request_id: str) -> tuple[bytes, bytes]:
    """A valid request record, keyed by its id."""
    now = int(time.time() * 1000)
    return request_id.encode(), encode(example_request(request_id).model_copy(update={
        "deadline_ms": None, "created_ms": now, "event_time_ms": now}))


def test_a_record_nested_too_deep_to_parse_stops_no_router(kafka_bootstrap, catalog):
    letters, answers = asyncio.run(_answers_after(
        kafka_bootstrap, catalog, [(b"deep", b"[" * 5000), _valid("last")],
        done=_answered("last")))
    assert [d.reason for d in letters] == ["undecodable"]


def test_a_malformed_record_after_a_valid_request_of_its_id_in_one_fetch_takes_nothing(
        kafka_bootstrap, catalog):
    """Read one fetch after another, the valid request is answered and the malformed record
    under its id only dead-lettered (the id is in use); in one fetch the malformed records were
    refused before the valid requests were handled: the client's request was dead-lettered as
    a duplicate and the client told its request was invalid."""
    malformed = json.dumps({"type": "inference_request", "request_id": "dup",
                            "prompt_tokens": -5, "max_tokens": 1, "created_ms": 1,
                            "event_time_ms": 1}).encode()
    letters, answers = asyncio.run(_answers_after(
        kafka_bootstrap, catalog, [_valid("dup"), (b"dup", malformed), _valid("last")],
        done=_answered("last")))
    assert [(d.offset, d.reason) for d in letters] == [(1, "schema_violation")]
    assert [(a.request_id, a.reason) for a in answers if isinstance(a, Rejected)] == [
        ("dup", "no_capacity"), ("last", "no_capacity")]


def test_a_request_keyed_by_another_id_is_dead_lettered_naming_the_key(kafka_bootstrap, catalog):
    """A request lands on its key's partition: keyed otherwise than by its request_id, another
    router of the group may hold a request under its id (the same request sent under two keys
    was placed once by each of two routers: two Queued, two dispatches)."""
    _, mis_keyed = _valid("mis-keyed")
    letters, answers = asyncio.run(_answers_after(
        kafka_bootstrap, catalog, [(b"another-id", mis_keyed), _valid("last")],
        done=_answered("last")))
    assert [(d.offset, d.reason, d.key) for d in letters] == [
        (0, "schema_violation", b"another-id")]
    assert "key: 'another-id' is not the request_id 'mis-keyed'" in letters[0].error
    assert [a.request_id for a in answers] == ["last"]


def test_a_dispatch_on_another_slots_partition_is_dead_lettered_not_run(kafka_bootstrap, catalog):
    """A dispatch is written to its slot's partition, where the router also sends its recall:
    one read elsewhere is no router's (a Dispatch for slot 0 by router 'router' to worker
    'nobody', keyed onto partition 13 of a live stack: the router took it in flight, adopted
    it as an orphan 60 s later and had worker-0 serve a request no client sent, its recalls
    going to partition 0). The worker dead-letters it and runs the next one."""
    from infra.bus import now_ms
    from schemas.events import Completed, Started
    from schemas.requests import Dispatch, InferenceRequest
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    def dispatch(rid: str, slot: int) -> bytes:
        t = now_ms()
        request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid,
                                   prompt_tokens=16, max_tokens=4, model="llama-3-8b")
        return encode(Dispatch(event_time_ms=t, request=request, worker_id="nobody", slot=slot))

    async def scenario():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        for rid, slot in (("elsewhere", 5), ("here", 0)):
            await producer.send_and_wait(catalog.dispatch, dispatch(rid, slot), key=rid.encode(),
                                         partition=0)
        await producer.stop()
        worker = WorkerService(kafka_bootstrap, catalog,
                               WorkerIdentity(0, "w0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                               FixedRateEngine(decode_tokens_per_s=100), drain_timeout_s=1)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        consumer = AIOKafkaConsumer(catalog.deadletter, catalog.telemetry,
                                    bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        seen = []
        try:
            async with asyncio.timeout(60):
                while not any(isinstance(m, Completed) for m in seen):
                    assert not running.done(), running.exception()
                    for batch in (await consumer.getmany(timeout_ms=200)).values():
                        seen += [decode(catalog.spec(r.topic), r.value) for r in batch]
        finally:
            await consumer.stop()
            stop.set()
            await running
        return seen

    seen = asyncio.run(scenario())
    letters = [m for m in seen if isinstance(m, DeadLetter)]
    assert [(d.consumer, d.offset, d.reason) for d in letters] == [("w0", 0, "schema_violation")]
    assert "slot: 5 is not the partition it was read from (0)" in letters[0].error
    assert [m.request_id for m in seen if isinstance(m, (Started, Completed))] == ["here", "here"]
