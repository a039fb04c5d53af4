"""Thin Kafka adapters: a producer of typed messages and a consumer that dead-letters bad records.

Everything above this module deals in pydantic messages; everything below it in bytes.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.base import Message
from schemas.errors import RetryableError
from schemas.codec import DecodeError, decode, encode
from schemas.events import DeadLetter
from schemas.limits import MAX_DEAD_LETTER_RAW_BYTES, MAX_ID_CHARS
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
FETCH_RECORDS = 500  # the most records one fetch returns


def now_ms() -> int:
    """Wall-clock event time for adapters (policies get time injected instead)."""
    import time

    return int(time.time() * 1000)


def background(coro, stop: asyncio.Event) -> asyncio.Task:
    """Run ``coro`` beside a service's main loop; if it fails, log it and stop the service, so a
    broken component exits (and is noticed) instead of running on half-dead."""

    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task failed; stopping", exc_info=task.exception())
            stop.set()

    task = asyncio.create_task(coro)
    task.add_done_callback(done)
    return task


def make_producer(bootstrap: str) -> AIOKafkaProducer:
    """An idempotent producer that waits for the broker's acknowledgement."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        request_timeout_ms=15_000,
    )


def track_topics(producer: AIOKafkaProducer, topics: Iterable[str]) -> None:
    """Make ``producer`` keep the metadata (partition leaders) of ``topics`` from now on.

    aiokafka refreshes the metadata of the topics its client tracks, or of every topic while it
    tracks none, and starts tracking a topic only when a send finds it missing from the metadata.
    So a producer that learned topics A and B from a refresh of every topic (Faust forces one
    after it creates each of its topics) and then first sends to C, which that refresh did not
    hold (created a moment before, on a busy broker), tracks C alone: every later refresh holds C
    alone, A and B lose their leaders, and their batches are never sent (the sender refreshes the
    metadata in a loop) until the request timeout. That is how a streams worker once stalled for
    good. Tracking every topic a component writes, before its first send, keeps them all known.
    """
    for topic in topics:
        producer.client.add_topic(topic)


async def send(
    producer: AIOKafkaProducer, topic: str, message: Message, key: str, partition: int | None = None
) -> None:
    """Send one message and wait until the broker has it."""
    await producer.send_and_wait(topic, encode(message), key=key.encode(), partition=partition)


class Outbox:
    """Messages emitted in order and sent together; ``flush`` returns once every message emitted
    before it is acknowledged.

    Components commit their input offsets only after a flush, so what they emitted for a record
    is on the broker before the record counts as done (at-least-once). Several tasks of one
    component may share an outbox (the router's request loop, its ticks and its config reader):
    flushes take turns, so a flush that finds its messages already taken by another one still
    returns only after they are acknowledged.
    """

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._queue: list[tuple[str, bytes, bytes, int | None]] = []
        self._turn = asyncio.Lock()

    def emit(self, topic: str, message: Message, key: str, partition: int | None = None) -> None:
        self._queue.append((topic, encode(message), key.encode(), partition))

    async def flush(self) -> int:
        async with self._turn:
            queue, self._queue = self._queue, []
            deliveries = [
                await self.producer.send(topic, value, key=key, partition=partition)
                for topic, value, key, partition in queue
            ]
            if deliveries:
                await asyncio.gather(*deliveries)
            return len(deliveries)

    def __len__(self) -> int:
        return len(self._queue)


@dataclass(frozen=True)
class Decoded:
    """A record and the message it holds."""

    record: ConsumerRecord
    message: Message


class TypedConsumer:
    """Decodes and validates records; an unusable one goes to the dead-letter topic with why.

    The consumer carries on after a bad record: it never crashes on input.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        catalog: TopicCatalog,
        producer: AIOKafkaProducer,
        name: str,
    ) -> None:
        self.consumer = consumer
        self.catalog = catalog
        self.producer = producer
        self.name = name[:MAX_ID_CHARS]
        self.dead_lettered = 0
        #: (partition, offset) of the records dead-lettered since ``take_dead_lettered``: done
        #: with, for a reader that tracks its offsets itself
        self._dead: list[tuple[int, int]] = []

    async def fetch(self, timeout_ms: int = 200) -> list[Decoded]:
        """The valid messages of one fetch (possibly none after ``timeout_ms``)."""
        return await self.decoded(await self.consumer.getmany(timeout_ms=timeout_ms,
                                                              max_records=FETCH_RECORDS))

    async def decoded(self, fetched: dict[TopicPartition, list[ConsumerRecord]]
                      ) -> list[Decoded]:
        """The valid messages of what ``getmany`` returned."""
        good: list[Decoded] = []
        for records in fetched.values():
            for record in records:
                message = await self.decode(record)
                if message is not None:
                    good.append(Decoded(record, message))
        return good

    def take_dead_lettered(self) -> list[tuple[int, int]]:
        """The (partition, offset) of the records dead-lettered since the last call."""
        dead, self._dead = self._dead, []
        return dead

    async def batches(self, timeout_ms: int = 200) -> AsyncIterator[list[Decoded]]:
        """Yield the valid messages of each fetch (possibly empty, so callers can tick)."""
        while True:
            yield await self.fetch(timeout_ms)

    async def decode(self, record: ConsumerRecord) -> Message | None:
        try:
            return decode(self.catalog.spec(record.topic), record.value)
        except DecodeError as exc:
            await self.dead_letter(record, exc)
            return None

    async def dead_letter(self, record: ConsumerRecord, exc: DecodeError) -> None:
        raw = record.value or b""
        letter = DeadLetter(
            event_time_ms=now_ms(),
            source_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            consumer=self.name,
            reason=exc.reason,
            error=exc.detail,
            key=record.key[:1024] if record.key else None,
            raw=raw[:MAX_DEAD_LETTER_RAW_BYTES],
            raw_size=len(raw),
        )
        await send(self.producer, self.catalog.deadletter, letter, key=record.topic)
        self.dead_lettered += 1
        self._dead.append((record.partition, record.offset))
        logger.warning(
            "%s: dead-lettered %s[%d]@%d: %s",
            self.name, record.topic, record.partition, record.offset, exc,
        )


@asynccontextmanager
async def reading(bootstrap: str, catalog: TopicCatalog, topics: Iterable[str], name: str, *,
                  offset_reset: str = "latest") -> AsyncIterator[TypedConsumer]:
    """A started, group-less reader of ``topics`` that decodes into typed messages, with a
    started producer (``.producer``) for its dead letters and the caller's own sends; both are
    stopped on exit."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap,
                                auto_offset_reset=offset_reset)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await consumer.start()
        try:
            yield TypedConsumer(consumer, catalog, producer, name)
        finally:
            await consumer.stop()
    finally:
        await producer.stop()


def partitions(catalog: TopicCatalog, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics``, as the catalog declares them."""
    return [TopicPartition(t, p) for t in topics for p in range(catalog.spec(t).partitions)]


async def read_back(consumer: AIOKafkaConsumer, topic: str, since_ms: int,
                    until: dict[TopicPartition, int]) -> AsyncIterator[ConsumerRecord]:
    """The records of ``topic`` stamped at or after ``since_ms``, up to the offsets ``until``
    (exclusive). ``consumer``: a started consumer outside any group; this replaces its
    assignment."""
    parts = [tp for tp in until if tp.topic == topic]
    found = await consumer.offsets_for_times({tp: since_ms for tp in parts})
    left = {tp: found[tp].offset for tp in parts
            if found.get(tp) is not None and found[tp].offset < until[tp]}
    consumer.assign(list(left))
    for tp, offset in left.items():
        consumer.seek(tp, offset)
    while left:
        fetched = await consumer.getmany(*left, timeout_ms=500)
        for tp, records in fetched.items():
            for record in records:
                if record.offset < until[tp]:
                    yield record
        for tp in list(left):
            if await consumer.position(tp) >= until[tp]:
                del left[tp]


class BusError(RetryableError):
    """The broker refused or could not be reached."""


async def missing_topics(bootstrap: str, catalog: TopicCatalog) -> list[str]:
    """The catalog's topics the broker does not have."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    return [name for name in catalog.topics() if name not in existing]


async def create_topics(bootstrap: str, catalog: TopicCatalog) -> list[str]:
    """Create every topic of the catalog that does not exist yet; return those created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(name, spec.partitions, 1, topic_configs=spec.config())
            for name, spec in catalog.topics().items()
            if name not in existing
        ]
        if wanted:
            response = await admin.create_topics(wanted, timeout_ms=15_000)
            for topic, code, *message in response.topic_errors:
                # 36 is TOPIC_ALREADY_EXISTS: another process raced us, which is fine.
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise BusError(f"could not create topic {topic}: error {code} {message}")
        await _wait_for_leaders(admin, list(catalog.topics()))
        return [t.name for t in wanted]
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str], timeout_s: float = 30) -> None:
    """Return once every partition of ``topics`` has a leader, so first reads do not fail."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await admin.describe_topics(topics)
        ready = all(
            t["error_code"] == 0 and t["partitions"]
            and all(p["leader"] >= 0 for p in t["partitions"])
            for t in described
        )
        if ready:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise BusError(f"topics have no leader after {timeout_s}s: {topics}")
        await asyncio.sleep(0.1)  # polling the broker's metadata until the condition holds


async def namespace_topics(bootstrap: str, namespace: str) -> list[str]:
    """The topics on the broker whose names start with ``namespace.``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if t.startswith(f"{namespace}.")]
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: Iterable[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        await admin.delete_topics(list(names), timeout_ms=15_000)
    finally:
        await admin.close()
