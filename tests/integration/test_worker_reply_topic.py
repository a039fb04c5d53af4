"""A request whose ``reply_to`` topic is deleted fails on its worker, and the worker serves on.

On a broker that creates no topics on use (as many managed clusters are set up), a send to a
deleted topic waits out the producer's request timeout and then fails; a worker that let it fail
stopped, and after each restart read the request again and stopped again. Its own broker here,
set up that way (the session's broker creates topics on use: Faust relies on it); a real worker
process (or, where its producer's log is read, a worker in the test's process), the test plays
the router.
"""

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import (Outbox, TopicList, TypedConsumer, Undelivered, create_topic,
                       create_topics, delete_topics, make_producer, now_ms, track_topics)
from infra.stack import PoolSpec, Stack
from schemas.codec import decode
from schemas.events import RequestEvent, WorkerStatus
from schemas.requests import Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicCatalog

pytestmark = pytest.mark.integration

#: the request timeout of the producers that test the outbox: the outbox gives a send up well
#: before it (a worker's producer waits 15 s), and a loaded machine has time to spare
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def strict_bootstrap(tmp_path_factory):
    """A broker of this module's own that creates no topic on use."""
    from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports

    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                         home=tmp_path_factory.mktemp("strict-kafka"),
                                         auto_create_topics=False))
    yield kafka.start(timeout_s=120)
    kafka.stop()


def _dispatch(request_id: str, reply_to: str | None, max_tokens: int) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=max_tokens, model="llama-3-8b",
                               reply_to=reply_to)
    return Dispatch(event_time_ms=t, request=request, worker_id="worker-0", slot=0, attempt=1)


class _Router:
    """The test's side: dispatches to the worker's partition, and its telemetry read back."""

    def __init__(self, bootstrap: str, catalog: TopicCatalog) -> None:
        self.catalog = catalog
        self.producer = make_producer(bootstrap)
        self.outbox = Outbox(self.producer)
        self.watch = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                      auto_offset_reset="earliest")
        self.typed = TypedConsumer(self.watch, catalog, self.producer, "reply-topic-test")
        self.seen: list = []

    async def start(self) -> None:
        await self.producer.start()
        await self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()
        await self.producer.stop()

    def ended(self, rid: str) -> RequestEvent | None:
        return next((m for m in self.seen if isinstance(m, RequestEvent) and m.request_id == rid
                     and m.type in ("completed", "failed")), None)

    async def until(self, condition, timeout_s=60) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.seen.extend(i.message for i in await self.typed.fetch(200))

    async def send(self, dispatch: Dispatch) -> None:
        self.outbox.emit(self.catalog.dispatch, dispatch, dispatch.request.request_id,
                         partition=0)
        await self.outbox.flush()


async def _scenario(bootstrap: str, catalog: TopicCatalog, stack: Stack) -> dict:
    replies = f"{catalog.namespace}.my-replies"
    await create_topic(bootstrap, replies)
    router = _Router(bootstrap, catalog)
    await router.start()
    answers = AIOKafkaConsumer(replies, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await answers.start()
    stack.start()
    try:
        # Long enough to be running when its topic goes (about 4 minutes at 4x).
        await router.send(_dispatch("orphaned", replies, max_tokens=60_000))
        async with asyncio.timeout(60):
            first = await answers.getone()
        await answers.stop()  # the topic is about to go
        await delete_topics(bootstrap, [replies])
        await router.until(lambda: router.ended("orphaned") is not None)
        await router.send(_dispatch("to-the-deleted-topic", replies, max_tokens=16))
        await router.send(_dispatch("to-the-default-topic", None, max_tokens=16))
        await router.until(lambda: router.ended("to-the-deleted-topic")
                           and router.ended("to-the-default-topic"))
    finally:
        await answers.stop()
        await router.stop()
    chunk = decode(catalog.spec(catalog.responses), first.value)
    return {"seen": router.seen, "replies": replies, "ended": router.ended, "chunk": chunk}


def _reply_topic_check(bootstrap: str, namespace: str, producer):
    """The check a worker in ``namespace`` gives its outbox as ``vanished``: its own
    (``WorkerService._vanished``), on ``producer``'s client as the worker sets it up in ``run``."""
    from workers.fixed_rate import FixedRateEngine
    from workers.service import REPLY_TOPICS_MAX_AGE_S, WorkerIdentity, WorkerService

    worker = WorkerService(bootstrap, TopicCatalog(namespace),
                           WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=1000))
    worker._reply_topics = TopicList(producer.client, max_age_s=REPLY_TOPICS_MAX_AGE_S)
    return worker._vanished


def _with_a_worker(bootstrap: str, tmp_path, scenario) -> dict:
    """``scenario(bootstrap, catalog, stack)`` run in a namespace of its own with one simulated
    worker process (at 4x) that the scenario starts."""
    catalog = TopicCatalog(f"t-{uuid.uuid4().hex[:10]}")
    asyncio.run(create_topics(bootstrap, catalog))
    stack = Stack(bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  engine="sim", with_router=False, speedup=4.0)
    try:
        return asyncio.run(scenario(bootstrap, catalog, stack))
    finally:
        stack.stop()


def test_a_worker_fails_a_request_whose_reply_topic_is_gone_and_serves_on(strict_bootstrap,
                                                                         tmp_path):
    result = _with_a_worker(strict_bootstrap, tmp_path, _scenario)
    seen, ended, replies = result["seen"], result["ended"], result["replies"]
    assert isinstance(result["chunk"], ResponseChunk)
    assert result["chunk"].request_id == "orphaned"  # it was answered there until the deletion
    gone = f"reply_to topic {replies!r} no longer exists: the answer has nowhere to go"
    for rid in ("orphaned", "to-the-deleted-topic"):
        assert (ended(rid).type, ended(rid).reason, ended(rid).detail) == (
            "failed", "invalid_request", gone), rid
    assert ended("to-the-default-topic").type == "completed"
    starts = [m.request_id for m in seen if isinstance(m, RequestEvent) and m.type == "started"]
    assert starts == ["orphaned", "to-the-default-topic"]  # each once; the refused one never
    incarnations = {m.started_ms for m in seen if isinstance(m, WorkerStatus)}
    assert len(incarnations) == 1  # the worker never stopped


async def _refusing_scenario(bootstrap: str, catalog: TopicCatalog, stack: Stack) -> dict:
    # A client's topic that takes no record of a chunk's size (its own max.message.bytes).
    replies = f"{catalog.namespace}.tiny-replies"
    await create_topic(bootstrap, replies, {"max.message.bytes": "64"})
    router = _Router(bootstrap, catalog)
    await router.start()
    stack.start()
    try:
        await router.send(_dispatch("refused", replies, max_tokens=60_000))
        await router.until(lambda: router.ended("refused") is not None)
        await router.send(_dispatch("after-it", None, max_tokens=16))
        await router.until(lambda: router.ended("after-it") is not None)
    finally:
        await router.stop()
    return {"seen": router.seen, "replies": replies, "ended": router.ended}


def test_a_reply_topic_that_refuses_the_workers_writes_fails_its_request_not_the_worker(
        strict_bootstrap, tmp_path):
    """The router checks only that a reply topic exists. One that refuses the worker's writes
    (a record size limit, an ACL, too few in-sync replicas) used to stop the worker at its
    flush, and every worker the request was continued on after it."""
    result = _with_a_worker(strict_bootstrap, tmp_path, _refusing_scenario)
    seen, ended, replies = result["seen"], result["ended"], result["replies"]
    refused = ended("refused")
    assert (refused.type, refused.reason) == ("failed", "invalid_request")
    assert refused.detail.startswith(f"reply_to topic {replies!r} refused this worker's writes")
    assert ended("after-it").type == "completed"
    incarnations = {m.started_ms for m in seen if isinstance(m, WorkerStatus)}
    assert len(incarnations) == 1  # the worker never stopped


def test_a_send_to_a_topic_gone_before_it_started_is_given_up_within_the_patience(
        strict_bootstrap) -> None:
    """A topic deleted between a worker's listing and its first send to it: the producer waits
    for the topic's metadata until its request timeout (15 s), and the flush with it. Given
    ``vanished`` (the worker's check), the outbox gives that send up once the topic is known
    gone, sends the rest, and the producer serves on."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    live, missing = f"{namespace}.live", f"{namespace}.deleted"

    async def scenario() -> tuple[set[str], float, Exception | None, int, int]:
        await create_topic(strict_bootstrap, live)
        producer = make_producer(strict_bootstrap, request_timeout_ms=REQUEST_TIMEOUT_S * 1000)
        await producer.start()
        # created after the producer started: unknown to it, as a reply topic not sent to yet
        await create_topic(strict_bootstrap, missing)
        check = _reply_topic_check(strict_bootstrap, namespace, producer)
        asked: list[set[str]] = []

        async def vanished(topics: set[str]) -> set[str]:
            asked.append(topics)
            return await check(topics)

        try:
            listed = await check({missing})  # the worker's listing: there
            await delete_topics(strict_bootstrap, [missing])
            await _until_unlisted(strict_bootstrap, missing)
            outbox = Outbox(producer, vanished=vanished, patience_s=0.5)
            for topic, key in ((missing, "a"), (live, "b"), (missing, "c")):
                outbox.emit(topic, _dispatch(key, None, 1), key)
            start = asyncio.get_running_loop().time()
            try:
                await outbox.flush()
                refused = None
            except Undelivered as exc:
                refused = exc
                outbox.forgive(exc.topics)  # dealt with: reported no more
            took = asyncio.get_running_loop().time() - start
            outbox.emit(live, _dispatch("d", None, 1), "d")  # the producer still works
            after = await asyncio.wait_for(outbox.flush(), timeout=10)
            return listed, took, refused, after, len(asked)
        finally:
            await producer.stop()

    listed, took, refused, after, asks = asyncio.run(scenario())
    assert listed == set()  # not gone when the worker listed it
    assert isinstance(refused, Undelivered)
    assert [(t, k) for t, k, _ in refused.failed] == [(missing, "a"), (missing, "c")]
    assert took < REQUEST_TIMEOUT_S / 2  # the producer's own wait is its request timeout
    assert asks >= 1 and after == 1


def test_the_producer_gives_up_messages_to_a_topic_the_outbox_knows_is_gone(
        strict_bootstrap, caplog) -> None:
    """A topic deleted after the producer learned its leader: the message to it is queued, and
    aiokafka retries it until its request timeout (15 s), asking for metadata in a tight loop,
    with ``producer.flush`` waiting all that time, and asks for the topic at every metadata
    refresh after. Once the outbox knows the topic is gone (from the worker's check), the
    producer gives the message up (its flush returns at once), no longer asks for the topic, and
    sends on."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    doomed, live = f"{namespace}.doomed", f"{namespace}.live"

    async def scenario() -> tuple[set[str], Exception | None, float, int]:
        await create_topic(strict_bootstrap, doomed)
        await create_topic(strict_bootstrap, live)
        producer = make_producer(strict_bootstrap, request_timeout_ms=REQUEST_TIMEOUT_S * 1000)
        await producer.start()
        track_topics(producer, [doomed, live])  # as a worker tracks its topics
        vanished = _reply_topic_check(strict_bootstrap, namespace, producer)

        try:
            outbox = Outbox(producer, vanished=vanished, patience_s=0.5)
            outbox.emit(doomed, _dispatch("a", None, 1), "a")
            await outbox.flush()  # the producer now knows the topic's leader
            listed = await vanished({doomed, live})  # the worker's listing: both there
            await delete_topics(strict_bootstrap, [doomed])
            await _until_unlisted(strict_bootstrap, doomed)
            outbox.emit(doomed, _dispatch("b", None, 1), "b")
            start = asyncio.get_running_loop().time()
            try:
                await outbox.flush()
                refused = None
            except Undelivered as exc:
                refused = exc
                outbox.forgive(exc.topics)  # dealt with: reported no more
            await asyncio.wait_for(producer.flush(), timeout=2 * REQUEST_TIMEOUT_S)
            held_s = asyncio.get_running_loop().time() - start  # both flushes: the outbox's too
            # a metadata update under way may still ask for the topic; the one after may not
            await asyncio.wait_for(producer.client.force_metadata_update(), timeout=10)
            caplog.clear()
            await asyncio.wait_for(producer.client.force_metadata_update(), timeout=10)
            outbox.emit(live, _dispatch("c", None, 1), "c")
            return listed, refused, held_s, await asyncio.wait_for(outbox.flush(), timeout=10)
        finally:
            await producer.stop()

    caplog.set_level(logging.WARNING, logger="aiokafka")
    listed, refused, held_s, after = asyncio.run(scenario())
    assert listed == set()  # not gone before the deletion
    assert isinstance(refused, Undelivered) and refused.topics == {doomed}
    assert held_s < REQUEST_TIMEOUT_S / 2  # aiokafka alone holds it for its request timeout
    assert after == 1
    asked_for = [r.getMessage() for r in caplog.records if doomed in r.getMessage()]
    assert asked_for == []  # aiokafka alone logs it "not found in cluster metadata" each time


def test_a_reply_topic_a_worker_finds_gone_by_listing_is_forgotten_by_its_producer(
        strict_bootstrap, caplog) -> None:
    """A reply topic the worker has sent to, deleted while no send to it is under way: the
    worker's topic list finds it gone (a dispatch replying there fails before it starts, no
    send fails), and its producer stops asking for the topic's metadata, which aiokafka alone
    does at every refresh, logging it missing each time. The worker runs in this process, so
    its producer's log is at hand."""
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    catalog = TopicCatalog(f"t-{uuid.uuid4().hex[:10]}")
    replies = f"{catalog.namespace}.my-replies"
    worker = WorkerService(strict_bootstrap, catalog,
                           WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=1000), drain_timeout_s=1)

    async def scenario() -> list:
        await create_topics(strict_bootstrap, catalog)
        await create_topic(strict_bootstrap, replies)
        router = _Router(strict_bootstrap, catalog)
        await router.start()
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))

        async def served(dispatch: Dispatch) -> None:
            await router.send(dispatch)
            await router.until(lambda: router.ended(dispatch.request.request_id) is not None)

        try:
            await served(_dispatch("answered", replies, max_tokens=8))
            await delete_topics(strict_bootstrap, [replies])
            await _until_unlisted(strict_bootstrap, replies)
            worker._reply_topics.max_age_s = 0  # its next check lists the topics (else in 30 s)
            await served(_dispatch("refused", replies, max_tokens=8))
            client = worker.producer.client
            # a metadata update under way may still ask for the topic; the one after may not
            await asyncio.wait_for(client.force_metadata_update(), timeout=10)
            caplog.clear()
            await asyncio.wait_for(client.force_metadata_update(), timeout=10)
        finally:
            stop.set()
            await running
            await router.stop()
        return router.seen

    caplog.set_level(logging.WARNING, logger="aiokafka")
    seen = asyncio.run(scenario())
    events = [(m.request_id, m.type, getattr(m, "reason", None)) for m in seen
              if isinstance(m, RequestEvent) and m.type in ("started", "completed", "failed")]
    assert events == [("answered", "started", None), ("answered", "completed", None),
                      ("refused", "failed", "invalid_request")]  # refused before it started
    asked_for = [r.getMessage() for r in caplog.records if replies in r.getMessage()]
    assert asked_for == []  # aiokafka alone logs it "not found in cluster metadata" each time


def test_a_reply_topic_created_after_the_worker_started_leaves_its_own_topics_known(
        strict_bootstrap) -> None:
    """The worker's first send to a topic its producer did not know made aiokafka track that
    topic alone: every later metadata refresh held it alone, the worker's own topics lost their
    leaders, and a message queued for one of them waited out the request timeout (the flush
    with it, and the heartbeats). The worker tracks every topic it writes from the start."""
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    catalog = TopicCatalog(f"t-{uuid.uuid4().hex[:10]}")
    replies = f"{catalog.namespace}.late-replies"
    worker = WorkerService(strict_bootstrap, catalog,
                           WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=1000), drain_timeout_s=1)

    async def scenario() -> dict[str, bool]:
        await create_topics(strict_bootstrap, catalog)
        router = _Router(strict_bootstrap, catalog)
        await router.start()
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        try:
            await router.until(lambda: any(isinstance(m, WorkerStatus) for m in router.seen))
            await create_topic(strict_bootstrap, replies)  # after the worker's producer started
            await router.send(_dispatch("late", replies, max_tokens=8))
            await router.until(lambda: router.ended("late") is not None)
            client = worker.producer.client
            for _ in range(2):  # (one under way may predate the send)
                await asyncio.wait_for(client.force_metadata_update(), timeout=10)
            known = {topic: bool(client.cluster.partitions_for_topic(topic))
                     for topic in (catalog.dispatch, catalog.kv, catalog.deadletter, replies)}
        finally:
            stop.set()
            await running
            await router.stop()
        return known

    known = asyncio.run(scenario())
    assert known == dict.fromkeys(known, True)


async def _until_unlisted(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        async with asyncio.timeout(30):
            while topic in await admin.list_topics():
                await asyncio.sleep(0.05)  # polls until the broker no longer lists it
    finally:
        await admin.close()


def test_a_detached_send_to_a_topic_gone_is_given_up_within_the_patience(strict_bootstrap,
                                                                        caplog) -> None:
    """The router's ends of streams go to clients' reply topics detached (a flush waits for
    none of them). One to a topic deleted after the producer learned its leader was retried by
    aiokafka until its request timeout, asking for metadata in a tight loop, and the topic was
    asked for at every metadata refresh after, for as long as the router ran. Told which
    topics are gone (``vanished``), the outbox gives it up after its patience and has the
    producer forget the topic, as for the worker's replies."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    doomed, live = f"{namespace}.doomed", f"{namespace}.live"

    async def scenario() -> tuple[float, int]:
        await create_topic(strict_bootstrap, doomed)
        await create_topic(strict_bootstrap, live)
        producer = make_producer(strict_bootstrap, request_timeout_ms=REQUEST_TIMEOUT_S * 1000)
        await producer.start()
        track_topics(producer, [doomed, live])
        topics = TopicList(producer.client)

        async def vanished(names: set[str]) -> set[str]:
            return {name for name in names - {live} if not await topics.exist(name, fresh=True)}

        try:
            detaching = set()
            outbox = Outbox(producer, vanished=vanished, patience_s=0.5,
                            detached=lambda topic: topic in detaching)
            outbox.emit(doomed, _dispatch("a", None, 1), "a")
            await outbox.flush()  # (not detached: delivered) its leader is known now
            detaching.add(doomed)
            await delete_topics(strict_bootstrap, [doomed])
            await _until_unlisted(strict_bootstrap, doomed)
            start = asyncio.get_running_loop().time()
            outbox.emit(doomed, _dispatch("b", None, 1), "b")
            await outbox.flush()  # (detached: returns at once)
            await asyncio.wait_for(producer.flush(), timeout=2 * REQUEST_TIMEOUT_S)
            held_s = asyncio.get_running_loop().time() - start
            await asyncio.wait_for(producer.client.force_metadata_update(), timeout=10)
            caplog.clear()
            await asyncio.wait_for(producer.client.force_metadata_update(), timeout=10)
            outbox.emit(live, _dispatch("c", None, 1), "c")
            return held_s, await asyncio.wait_for(outbox.flush(), timeout=10)
        finally:
            await producer.stop()

    caplog.set_level(logging.WARNING)
    held_s, after = asyncio.run(scenario())
    assert held_s < REQUEST_TIMEOUT_S / 2  # aiokafka alone holds it for its request timeout
    assert after == 1
    asked_for = [r.getMessage() for r in caplog.records
                 if r.name.startswith("aiokafka") and doomed in r.getMessage()]
    assert asked_for == []  # aiokafka alone logs it "not found in cluster metadata" each time
