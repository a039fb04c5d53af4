"""Thin Kafka adapters: a producer of typed messages and a consumer that dead-letters bad records.

Everything above this module deals in pydantic messages; everything below it in bytes.
"""

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import (AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord,
                     TopicPartition)
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import (IllegalStateError, KafkaError, RequestTimedOutError,
                             TopicAlreadyExistsError, UnknownTopicOrPartitionError, for_code)
from aiokafka.partitioner import murmur2

from schemas.base import Message
from schemas.errors import RetryableError, TerminalError, one_line
from schemas.codec import DecodeError, decode, encode
from schemas.events import DeadLetter
from schemas.limits import MAX_DEAD_LETTER_RAW_BYTES, MAX_ID_CHARS
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
FETCH_RECORDS = 500  # the most records one fetch returns
_REMEMBERED_MISSES = 1_024  # topic names remembered as missing (asked again after a second)


def now_ms() -> int:
    """Wall-clock event time for adapters (policies get time injected instead)."""
    import time

    return int(time.time() * 1000)


def background(coro, stop: asyncio.Event) -> asyncio.Task:
    """Run ``coro`` beside a service's main loop; if it fails, log it and stop the service, so a
    broken component exits (and is noticed) instead of running on half-dead."""

    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, KafkaError):  # the broker: said in one line (it is re-raised)
                logger.error("background task failed; stopping: %s", one_line(exc))
            else:  # a bug: with its traceback
                logger.error("background task failed; stopping", exc_info=exc)
            stop.set()

    task = asyncio.create_task(coro)
    task.add_done_callback(done)
    return task


#: How often a producer asks the broker for the partitions of the topics it writes. A partition
#: added to one (``kafka-topics --alter --partitions``) takes the keys that hash to it from the
#: producer's next ask on; at aiokafka's default (5 minutes) it took none for that long. A
#: metadata request is small next to a worker's heartbeats (two a second).
PRODUCER_METADATA_MS = 10_000


def stream_partition(request_id: str, partitions: int) -> int:
    """The partition of a request's response stream on a topic of ``partitions`` partitions:
    where the producers' default partitioner puts the key ``request_id`` among that many.

    The router fixes ``partitions`` when it places the request (``Dispatch.stream_partition``)
    and every writer of the stream writes there: a worker's chunks and end, a continuation's on
    another worker, the router's end on a worker's behalf. Left to the key, a stream that runs
    while partitions are added to its topic is split: a producer that learns of them (every
    ``PRODUCER_METADATA_MS``) hashes the key among more partitions from then on, and its later
    chunks land on another partition than the first, where a reader meets them out of order.
    The same hash as the key's, so a stream pinned before any partition is added lands where
    it always did."""
    return (murmur2(request_id.encode()) & 0x7FFFFFFF) % partitions


class StreamPartition(int):
    """A stream's pinned partition (``Dispatch.stream_partition``) as its writers give it to
    ``Outbox.emit``: where the topic has no such partition even after a metadata refresh (a
    dispatch written by hand, not by a router), the record goes where its key hashes, as a
    stream with no pin does. Undelivered, it would stop the worker or router writing it (a
    record of one of its own topics), again at every restart."""


def make_producer(bootstrap: str, *, request_timeout_ms: int = 15_000) -> AIOKafkaProducer:
    """An idempotent producer that waits for the broker's acknowledgement, and learns of
    partitions added to its topics within ``PRODUCER_METADATA_MS``."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        request_timeout_ms=request_timeout_ms,
        metadata_max_age_ms=PRODUCER_METADATA_MS,
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


def forget_topic(producer: AIOKafkaProducer, topic: str) -> int:
    """Make ``producer`` give up a topic that no longer exists: the batches it still holds for
    it, and the topic's metadata; how many batches.

    Alone, aiokafka retries the batches until the request timeout (15 s), and while the topic
    has no leader its sender asks the broker for metadata in a tight loop (a few thousand
    requests a second for one message: ``python -m benchmarks.deleted_topic``), and
    ``producer.flush`` and ``stop`` wait all that time; and it keeps asking for the topic's
    metadata on every refresh, logging it missing each time, for as long as it runs. aiokafka
    has no call for either. Marked expired, the batches are failed by the sender itself on its
    next pass (its own bookkeeping, its own error); a batch in flight (or waiting out a retry
    backoff) is marked too: it comes back to the front of its queue, where an unmarked one would
    shield those behind it. The marks and the tracked topics are attributes of aiokafka 0.14
    (pinned); nothing is done where they are missing."""
    accumulator = getattr(producer, "_message_accumulator", None)
    queued = getattr(accumulator, "_batches", None)
    in_flight = getattr(accumulator, "_pending_batches", None)
    expired = 0
    if isinstance(queued, dict) and isinstance(in_flight, set):
        for batch in [b for queue in queued.values() for b in queue] + list(in_flight):
            if batch.tp.topic == topic and hasattr(batch, "_ttl"):
                batch._ttl = -1.0
                expired += 1
    tracked = getattr(getattr(producer, "client", None), "_topics", None)
    # (never the last one: a client tracking none asks for every topic)
    if isinstance(tracked, set) and topic in tracked and len(tracked) > 1:
        producer.client.set_topics(tracked - {topic})
    return expired


def _retrieved(ack: asyncio.Future) -> None:
    """Take the outcome of an acknowledgement nobody waits for any more (else asyncio logs it)."""
    if not ack.cancelled():
        ack.exception()


class Undelivered(KafkaError):
    """Messages of a flush the broker did not take; the others were delivered."""

    def __init__(self, failed: list[tuple[str, str, KafkaError]]) -> None:
        self.failed = failed  # (topic, key, why) of each
        topic, key, why = failed[0]
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        super().__init__(f"could not deliver to {topic} (key {key!r}): {why!r}{more}")

    @property
    def topics(self) -> set[str]:
        return {topic for topic, _, _ in self.failed}


class Outbox:
    """Messages emitted in order and sent together; ``flush`` returns once every message emitted
    before it is acknowledged.

    Components commit their input offsets only after a flush, so what they emitted for a record
    is on the broker before the record counts as done (at-least-once). Several tasks of one
    component may share an outbox (the router's request loop, its ticks and its config reader):
    flushes take turns, so a flush that finds its messages already taken by another one still
    returns only after they are acknowledged.
    """

    def __init__(self, producer: AIOKafkaProducer,
                 vanished: Callable[[set[str]], Awaitable[set[str]]] | None = None,
                 patience_s: float = 1.0,
                 observe: Callable[[Message], None] | None = None,
                 detached: Callable[[str], bool] = lambda topic: False) -> None:
        """``vanished``: which of the topics given no longer exist. Asked of the topics of the
        messages still unacknowledged after ``patience_s``, and of a topic the producer has no
        metadata for when a send to it has not started after ``patience_s``: those to a deleted
        topic count as undelivered at once (the producer gives up on them only at its request
        timeout, and a send waiting for a topic's metadata holds up the whole flush).
        ``observe``: told of each message as it is emitted (a process's metrics).
        ``detached``: whether a topic's messages are sent on their own, in the background: a
        flush neither waits for them nor reports their failures, which are logged (the
        router's ends of streams to its clients' reply topics: one client's topic, gone or
        unwell, must hold up no placement)."""
        self.producer = producer
        self.detached = detached
        self._detached: set[asyncio.Task] = set()  # sends of detached messages under way
        self.vanished = vanished
        self.observe = observe
        self.patience_s = patience_s
        self._queue: list[tuple[str, bytes, bytes, int | None]] = []
        self._turn = asyncio.Lock()
        self._emitted = 0  # messages emitted so far: the queue holds the last len(_queue) of them
        #: (message number, topic, key, why) of the messages refused, until ``forgive``: every
        #: flush called after a refused message's emission reports it, whichever flush sent it
        #: (several tasks share an outbox: the one that emitted it must hear of it)
        self._failures: list[tuple[int, str, str, KafkaError]] = []

    def emit(self, topic: str, message: Message, key: str, partition: int | None = None) -> None:
        self._queue.append((topic, encode(message), key.encode(), partition))
        self._emitted += 1
        if self.observe is not None:
            self.observe(message)

    async def flush(self) -> int:
        """Send what was emitted; how many messages the broker took. Raises ``Undelivered``,
        once every send has ended, when it refused some of the messages emitted before this
        call, whichever flush sent them, and on every later flush until ``forgive``."""
        upto = self._emitted
        async with self._turn:
            delivered = await self._send_queue()
            owed = [(topic, key, why) for n, topic, key, why in self._failures if n <= upto]
            if owed:
                raise Undelivered(owed)
            return delivered

    def forgive(self, topics: set[str]) -> None:
        """Stop reporting the refusals of messages to ``topics``: their emitter has dealt with
        them (a worker that failed the requests whose reply topic was deleted)."""
        self._failures = [f for f in self._failures if f[1] not in topics]

    async def _send_queue(self) -> int:
        """Send the queue and wait for its acknowledgements; record what the broker refused.
        A send cut short (cancelled) puts the messages it had not sent back in front."""
        queue, self._queue = self._queue, []
        first = self._emitted - len(queue) + 1  # the number of queue[0]
        pending: dict[asyncio.Future, tuple[int, str, str]] = {}  # ack -> number, topic, key
        failed: list[tuple[int, str, str, KafkaError]] = []
        refused: dict[str, KafkaError] = {}  # topic -> why a send to it did not start
        sent, delivered = 0, 0
        try:
            for sent, (topic, value, key, partition) in enumerate(queue):
                if self.detached(topic):
                    self._send_detached(topic, value, key, partition)
                    continue
                try:
                    if topic in refused:  # not once more per message: each waits the timeout
                        raise refused[topic]
                    ack = await self._send(topic, value, key, partition)
                    pending[ack] = (first + sent, topic, key.decode())
                except KafkaError as exc:  # no metadata for the topic within the timeout
                    refused[topic] = exc
                    failed.append((first + sent, topic, key.decode(), exc))
                except Exception as exc:  # (aiokafka asserts a partition the topic lacks)
                    failed.append((first + sent, topic, key.decode(),
                                   KafkaError(f"{type(exc).__name__}: {exc}")))
            sent = len(queue)
            patience = self.patience_s if self.vanished is not None else None
            while pending:
                done, _ = await asyncio.wait(pending, timeout=patience)
                for ack in done:
                    n, topic, key = pending.pop(ack)
                    why = ack.exception()
                    if why is None:
                        delivered += 1
                    else:
                        failed.append((n, topic, key, why if isinstance(why, KafkaError)
                                       else KafkaError(f"{type(why).__name__}: {why}")))
                if not done:
                    gone = await self.vanished({topic for _, topic, _ in pending.values()})
                    for ack, (n, topic, key) in list(pending.items()):
                        if topic in gone:
                            del pending[ack]
                            ack.add_done_callback(_retrieved)
                            failed.append((n, topic, key, UnknownTopicOrPartitionError(
                                f"topic {topic} no longer exists")))
                    for topic in gone:
                        forget_topic(self.producer, topic)
        finally:
            if sent < len(queue):  # cut short before sending these: they wait for the next flush
                self._queue[:0] = queue[sent:]
            for ack in pending:  # (cut short waiting for them: nobody else takes their outcome)
                ack.add_done_callback(_retrieved)
            self._failures += failed
        return delivered

    def _send_detached(self, topic: str, value: bytes, key: bytes,
                       partition: int | None) -> None:
        async def send() -> None:
            try:
                ack = await self._send(topic, value, key, partition)
                # given ``vanished``: a topic gone is given up after ``patience_s``, and
                # forgotten (aiokafka alone retries until its request timeout, asking for the
                # topic's metadata in a tight loop, then asks for it at every refresh)
                while self.vanished is not None and \
                        not (await asyncio.wait({ack}, timeout=self.patience_s))[0]:
                    if topic in await self.vanished({topic}):
                        forget_topic(self.producer, topic)
                await ack
            except Exception as exc:  # (a KafkaError, or the producer stopped meanwhile)
                logger.warning("%s to %s was not delivered: %s", key.decode(errors="replace"),
                               topic, exc or type(exc).__name__)

        task = asyncio.ensure_future(send())
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    async def _send(self, topic: str, value: bytes, key: bytes,
                    partition: int | None) -> asyncio.Future:
        """The producer's send: its acknowledgement. One to a partition the producer has not
        heard of, which aiokafka refuses (added to the topic since its last metadata refresh:
        another component learned of it first and pinned a stream there), is tried once more
        after the producer has asked the broker for its metadata; then a ``StreamPartition``
        the topic still lacks is left to the key."""
        try:
            return await self._send_once(topic, value, key, partition)
        except AssertionError:  # (aiokafka's "Unrecognized partition", before it queues it)
            if partition is None:
                raise
        await self.producer.client.force_metadata_update()
        try:
            return await self._send_once(topic, value, key, partition)
        except AssertionError:
            if not isinstance(partition, StreamPartition):
                raise
        logger.warning("%s has no partition %d to hold the stream of %s: sent where its key "
                       "hashes", topic, partition, key.decode(errors="replace"))
        return await self._send_once(topic, value, key, None)

    async def _send_once(self, topic: str, value: bytes, key: bytes,
                         partition: int | None) -> asyncio.Future:
        """One to a topic the producer knows nothing of waits for the topic's metadata; given
        ``vanished``, it is given up, after ``patience_s``, if the topic no longer exists (else
        it waits on)."""
        send = self.producer.send(topic, value, key=key, partition=partition)
        if self.vanished is None or self.producer.client.cluster.partitions_for_topic(topic):
            return await send
        started = asyncio.ensure_future(send)
        try:
            while not (await asyncio.wait({started}, timeout=self.patience_s))[0]:
                if topic in await self.vanished({topic}) and not started.done():
                    forget_topic(self.producer, topic)
                    raise UnknownTopicOrPartitionError(f"topic {topic} no longer exists")
            return started.result()  # (started while ``vanished`` was asked: its ack decides)
        finally:
            started.cancel()  # given up (or this flush cancelled) before the send started

    def __len__(self) -> int:
        return len(self._queue)


class TopicList:
    """Whether topics exist, as the broker last listed them. Asked for reply topics: a send to a
    topic that does not exist waits out the producer's request timeout and then fails, on a
    broker that creates no topics on use.

    The list is one metadata request for every topic (which creates none, unlike a request for
    one name on a broker that creates topics on use). A name not in it is asked again at most
    once a second; with ``max_age_s``, a name in it is asked again once the list is older than
    that, to notice a topic deleted since. So a component asks the broker at most about once a
    second however many names it checks. Where the broker does not answer, a name counts as
    existing (the send decides)."""

    def __init__(self, client: AIOKafkaClient | None, *, max_age_s: float = math.inf) -> None:
        self.client = client  # None: nothing to ask (a component not running): every name passes
        self.max_age_s = max_age_s
        self._topics: set[str] = set()
        self._listing: ClusterMetadata | None = None  # the broker's last answer
        self._listed = -math.inf  # when the broker last listed them (monotonic seconds)
        self._missed: dict[str, float] = {}  # name -> when the broker last did not list it

    async def exist(self, topic: str, *, fresh: bool = False) -> bool:
        """``fresh``: from a list at most a second old, whatever ``max_age_s`` (a send there has
        just failed, or none went there yet)."""
        if self.client is None:
            return True
        now = time.monotonic()
        if topic in self._topics and now - self._listed < (1.0 if fresh else self.max_age_s):
            return True
        if now - self._missed.get(topic, -math.inf) < 1.0:
            return False
        try:
            self._listing = await self.client.fetch_all_metadata()
        except KafkaError as exc:
            logger.warning("could not list the topics to check %r: %s", topic, exc)
            return True
        self._topics, self._listed = self._listing.topics(), now
        if topic in self._topics:
            return True
        if len(self._missed) >= _REMEMBERED_MISSES:
            self._missed.clear()
        self._missed[topic] = now
        return False

    def partitions(self, topic: str) -> int | None:
        """How many partitions ``topic`` has as the client last heard: from its own metadata
        (refreshed for the topics it writes), else from the broker's last listing (``exist``);
        None where neither holds it."""
        if self.client is None:
            return None
        for metadata in (self.client.cluster, self._listing):
            known = metadata.partitions_for_topic(topic) if metadata is not None else None
            if known:
                return len(known)
        return None


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
        counted: Callable[[DeadLetter], None] | None = None,
    ) -> None:
        """``counted``: told of each dead letter once the broker has it (a process's
        metrics)."""
        self.consumer = consumer
        self.catalog = catalog
        self.producer = producer
        self.name = name[:MAX_ID_CHARS]
        self.counted = counted
        self.dead_lettered = 0
        #: (partition, offset) of the records dead-lettered since ``take_dead_lettered``: done
        #: with, for a reader that tracks its offsets itself
        self._dead: list[tuple[int, int]] = []

    async def fetch(self, timeout_ms: int = 200, *, dead_letter: bool = True) -> list[Decoded]:
        """The valid messages of one fetch (possibly none after ``timeout_ms``). Not
        ``dead_letter``: a bad record is passed over unsent, for a reader that reads it again
        later (a worker taking no work, which reads its partition again on waking)."""
        return await self.decoded(await self.consumer.getmany(timeout_ms=timeout_ms,
                                                              max_records=FETCH_RECORDS),
                                  dead_letter=dead_letter)

    async def decoded(self, fetched: dict[TopicPartition, list[ConsumerRecord]], *,
                      dead_letter: bool = True) -> list[Decoded]:
        """The valid messages of what ``getmany`` returned."""
        good, bad = self.split(fetched)
        if bad and dead_letter:
            await self.dead_letter(bad)
        return good

    def split(self, fetched: dict[TopicPartition, list[ConsumerRecord]]
              ) -> tuple[list[Decoded], list[tuple[ConsumerRecord, DecodeError]]]:
        """What ``getmany`` returned: its valid messages, and its bad records with why."""
        good: list[Decoded] = []
        bad: list[tuple[ConsumerRecord, DecodeError]] = []
        for records in fetched.values():
            for record in records:
                try:
                    message = decode(self.catalog.spec(record.topic), record.value)
                except DecodeError as exc:
                    bad.append((record, exc))
                    continue
                misplaced = self.catalog.misplaced(record.topic, record.partition, message,
                                                   record.key)
                if misplaced is None:
                    good.append(Decoded(record, message))
                else:
                    bad.append((record, DecodeError("schema_violation", misplaced)))
        return good, bad

    def take_dead_lettered(self) -> list[tuple[int, int]]:
        """The (partition, offset) of the records dead-lettered since the last call."""
        dead, self._dead = self._dead, []
        return dead

    async def batches(self, timeout_ms: int = 200) -> AsyncIterator[list[Decoded]]:
        """Yield the valid messages of each fetch (possibly empty, so callers can tick)."""
        while True:
            yield await self.fetch(timeout_ms)

    async def dead_letter(self, bad: list[tuple[ConsumerRecord, DecodeError]]) -> None:
        """Send a dead letter for each record, saying why, and wait until the broker has them
        (sent together and acknowledged together, not one round trip each)."""
        acks, letters = [], []
        for record, exc in bad:
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
            letters.append(letter)
            acks.append(await self.producer.send(self.catalog.deadletter, encode(letter),
                                                 key=record.topic.encode()))
        await asyncio.gather(*acks)
        if self.counted is not None:
            for letter in letters:
                self.counted(letter)
        for record, exc in bad:
            self.dead_lettered += 1
            self._dead.append((record.partition, record.offset))
            logger.warning("%s: dead-lettered %s[%d]@%d: %s",
                           self.name, record.topic, record.partition, record.offset, exc)


@asynccontextmanager
async def reading(bootstrap: str, catalog: TopicCatalog, topics: Iterable[str], name: str, *,
                  offset_reset: str = "latest") -> AsyncIterator[TypedConsumer]:
    """A started, group-less reader of ``topics`` that decodes into typed messages, with a
    started producer (``.producer``) for its dead letters and the caller's own sends; both are
    stopped on exit."""
    async def started() -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap,
                                    auto_offset_reset=offset_reset)
        await consumer.start()
        return consumer

    async with _typed_reader(bootstrap, catalog, name, started) as typed:
        yield typed


@asynccontextmanager
async def reading_config(bootstrap: str, catalog: TopicCatalog, name: str, *,
                         running: bool = False, seen: Callable[[int], None] | None = None
                         ) -> AsyncIterator[tuple[TypedConsumer, "ConfigPartition"]]:
    """``reading`` the configuration topic's one partition from its beginning
    (``ConfigPartition.start``: a ``ConfigTopicSplit`` where it has more), and its reader.
    ``running``: the component runs already (its reading started again after a broker error):
    a topic split meanwhile is read all the same, the split logged as ``watch`` does (a
    component that stopped following would go on silently with what it had)."""
    readers: list[ConfigPartition] = []

    async def started() -> AIOKafkaConsumer:
        reader = await ConfigPartition.start(bootstrap, catalog, name, refuse=not running,
                                             seen=seen)
        if reader.split is not None:
            reader.say_split()
        readers.append(reader)
        return reader.consumer

    async with _typed_reader(bootstrap, catalog, name, started) as typed:
        yield typed, readers[0]


@asynccontextmanager
async def _typed_reader(bootstrap: str, catalog: TopicCatalog, name: str,
                        started: Callable[[], Awaitable[AIOKafkaConsumer]]
                        ) -> AsyncIterator[TypedConsumer]:
    """The consumer ``started`` gives, decoding, with a started producer; both stopped on exit."""
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        consumer = await started()
        try:
            yield TypedConsumer(consumer, catalog, producer, name)
        finally:
            await consumer.stop()
    finally:
        await producer.stop()


@asynccontextmanager
async def from_now(bootstrap: str, catalog: TopicCatalog,
                   topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    """A started ``follower`` of every partition of ``topic`` (``partitions_of``), positioned
    at their ends as of now: every record written after it is yielded is read (those of a
    partition added since, where the reader takes them on: ``take_on_added``). Stopped on
    exit."""
    consumer = follower(bootstrap)
    await consumer.start()
    try:
        await assign_at_ends(consumer, catalog, [topic])
        yield consumer
    finally:
        await consumer.stop()


#: How often a follower asks the broker for its topics' partitions (``take_on_added``): well
#: within a worker's heartbeat timeout (3 s), so that a worker whose heartbeats go to a
#: partition added meanwhile is read before it could be judged silent.
FOLLOW_METADATA_MS = 1_000


#: How often a member of a consumer group that subscribes to topics (the routers' on the
#: request topic, the analytics sinks' on the namespace's) asks the broker for their partitions.
#: The group's leader has it rejoin when it sees partitions added, and only then are they
#: assigned and read: at aiokafka's default (5 minutes) a request a client wrote to a partition
#: added to the request topic waited that long unanswered. Each member asks, as any may lead.
GROUP_METADATA_MS = 2_000


def follower(bootstrap: str) -> AIOKafkaConsumer:
    """A consumer outside any group that follows topics by assignment. An idle partition's
    fetch is answered every 0.1 s, not 0.5 s (``HeardUntil`` hears as of the fetch before the
    latest; and a broker answers an offset lookup only behind a fetch waiting for data); its
    topics' partitions are asked for every ``FOLLOW_METADATA_MS`` (``take_on_added``)."""
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                            fetch_max_wait_ms=100, metadata_max_age_ms=FOLLOW_METADATA_MS)


def partitions_of(consumer: AIOKafkaConsumer, catalog: TopicCatalog,
                  topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` as the broker has them (a started consumer has their
    metadata); as the catalog declares them where it has not said yet."""
    return [TopicPartition(t, p) for t in topics
            for p in sorted(consumer.partitions_for_topic(t) or range(catalog.spec(t).partitions))]


async def listed_partition_count(consumer: AIOKafkaConsumer, catalog: TopicCatalog,
                                 topic: str, timeout_s: float = 5.0) -> int:
    """How many partitions ``topic`` has, as the broker lists them when asked now: a group
    member's metadata may predate a partition its group's leader has just assigned. As the
    consumer last heard (or the catalog declares) where the broker does not answer within
    ``timeout_s``."""
    try:
        # (aiokafka has no public call for a fresh listing; its client's is what ``topics()`` uses)
        cluster = await asyncio.wait_for(consumer._client.fetch_all_metadata(), timeout_s)
        listed = cluster.partitions_for_topic(topic)
    except (KafkaError, asyncio.TimeoutError) as exc:
        logger.warning("could not list the partitions of %s (%s): counted as last heard",
                       topic, exc)
        listed = None
    return len(listed or partitions_of(consumer, catalog, [topic]))


async def assign_at_ends(consumer: AIOKafkaConsumer, catalog: TopicCatalog,
                         topics: Iterable[str]) -> list[TopicPartition]:
    """Assign ``consumer`` (started, outside any group) every partition of ``topics``, at their
    ends as of now (resolved now, not at the first fetch); the partitions."""
    parts = partitions_of(consumer, catalog, topics)
    consumer.assign(parts)
    await consumer.seek_to_end(*parts)
    for tp in parts:
        await consumer.position(tp)
    return parts


async def take_on_added(consumer: AIOKafkaConsumer,
                        heard: "HeardUntil | None" = None) -> list[TopicPartition]:
    """Assign ``consumer`` (outside any group) the partitions added to the topics it is
    assigned since it was, as its metadata last listed them (a ``follower``'s is asked for
    every ``FOLLOW_METADATA_MS``): each is read from its beginning (every record written there
    is new), the others go on from their positions. ``heard`` takes on those of its topic,
    each holding its view where it stands until read to its end. Returns the partitions added.
    The seek waits for each added partition's leader to give its earliest offset (up to the
    consumer's request timeout, 40 s), the caller's loop with it: 64-81 ms on a one-node broker;
    longer while a cluster elects the leader (README, "Partitions added while the stack runs").
    """
    assigned = consumer.assignment()
    added = [TopicPartition(topic, p) for topic in sorted({tp.topic for tp in assigned})
             for p in sorted(consumer.partitions_for_topic(topic) or ())
             if TopicPartition(topic, p) not in assigned]
    if not added:
        return []
    positions = {tp: await consumer.position(tp) for tp in assigned}
    consumer.assign([*assigned, *added])  # (aiokafka assigns anew: each position is lost)
    for tp, offset in positions.items():
        consumer.seek(tp, offset)
    await consumer.seek_to_beginning(*added)
    if heard is not None:
        heard.add(added)
    logger.info("partitions added since they were assigned, read from their beginning: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in added))
    return added


#: The configuration topic's one partition. Its records are applied in the order they were
#: written (a setting, then a change of it), which records on two partitions do not have: its
#: readers read this one alone, and refuse to start where the topic has more
#: (``ConfigPartition.start``).
CONFIG_PARTITION = 0

#: How often a reader of the configuration topic asks the broker for its partitions: one
#: added while it runs is said within this (``ConfigPartition.watch``), not 5 minutes after.
CONFIG_METADATA_MS = 10_000


class ConfigTopicSplit(TerminalError):
    """The configuration topic has more than one partition."""


def config_topic_split(catalog: TopicCatalog, count: int | None,
                       bootstrap: str | None = None) -> str | None:
    """What is wrong with a configuration topic of ``count`` partitions (None: not listed),
    with the fix (its commands with the ``--bootstrap`` the user gave, if any); None where it
    has one. Kafka cannot remove a partition: the topic is made again, and what was in force
    set again."""
    if count is None or count <= 1:
        return None
    on, ns = on_broker(bootstrap), catalog.namespace
    return (f"topic {catalog.config} has {count} partitions, not 1: records on two partitions "
            "have no order between them, so which setting is in force is not defined (Kafka "
            f"cannot remove partitions); note the settings in force (`governor config get{on} "
            f"--namespace {ns}` reads partition {CONFIG_PARTITION}, as the running components "
            f"do), make the topic again (`governor topics delete{on} --namespace {ns} config`, "
            f"then `governor topics create{on} --namespace {ns}`) and set them again "
            "(`governor config set`)")


class ConfigPartition:
    """A reader's consumer (outside any group) of the configuration topic's one partition
    (``CONFIG_PARTITION``), from its beginning. One added while it runs is not read (its
    records have no order with the others'): ``watch`` logs it as an error, once, and ``split``
    says it. ``seen``: told the topic's partition count at the start and at each ``watch``
    (the ``governor_config_topic_partitions`` gauge, ``controllers.metrics``)."""

    def __init__(self, consumer: AIOKafkaConsumer, catalog: TopicCatalog, name: str,
                 seen: Callable[[int], None] | None = None, bootstrap: str | None = None) -> None:
        self.consumer, self.catalog, self.name, self.seen = consumer, catalog, name, seen
        self.bootstrap = bootstrap  # (the split's fix names it: ``config_topic_split``)
        self.split: str | None = None

    @classmethod
    async def start(cls, bootstrap: str, catalog: TopicCatalog, name: str, *,
                    refuse: bool = True,
                    seen: Callable[[int], None] | None = None) -> "ConfigPartition":
        """A started reader; a ``ConfigTopicSplit`` (naming ``name``, the reader) where the
        topic has more than one partition, its consumer stopped. ``refuse=False``: the reader
        all the same, ``split`` saying it (``governor config get`` shows what the running
        components have in force). A start that fails or is cancelled (a caller's time limit: a
        worker's bounded read of the declared models) stops its consumer: it was left open."""
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False,
                                    metadata_max_age_ms=CONFIG_METADATA_MS)
        try:
            await consumer.start()
            first = TopicPartition(catalog.config, CONFIG_PARTITION)
            consumer.assign([first])
            # (its earliest offset asked of its leader: the topic's metadata, every partition,
            # is had then; a consumer just started has none)
            await consumer.seek_to_beginning(first)
            reader = cls(consumer, catalog, name, seen, bootstrap)
            reader.split = reader._problem()
            if reader.split is not None and refuse:
                raise ConfigTopicSplit(f"{name}: {reader.split}")
        except BaseException:
            await consumer.stop()
            raise
        return reader

    def _problem(self) -> str | None:
        partitions = self.consumer.partitions_for_topic(self.catalog.config)
        count = None if partitions is None else len(partitions)
        if count is not None and self.seen is not None:
            self.seen(count)
        return config_topic_split(self.catalog, count, self.bootstrap)

    def watch(self) -> None:
        """As its metadata lists the topic now (asked for every ``CONFIG_METADATA_MS``): a
        partition added since it started is logged as an error, once; the count goes to
        ``seen`` each time."""
        problem = self._problem()
        if self.split is None and problem is not None:
            self.split = problem
            self.say_split()

    def say_split(self) -> None:
        """The split, as an error: the reader goes on with the first partition alone."""
        logger.error("%s: %s; reading partition %d alone meanwhile", self.name, self.split,
                     CONFIG_PARTITION)


def partitions(catalog: TopicCatalog, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics``, as the catalog declares them."""
    return [TopicPartition(t, p) for t in topics for p in range(catalog.spec(t).partitions)]


class FetchAnswers:
    """Until when (the reader's clock) a consumer has read every record of a partition at its
    end, from when its fetches were answered (aiokafka's ``last_poll_timestamp``), as seen at
    each look: the rule the liveness views (``HeardUntil``) and the streams' idle sweeps
    (``streams.app``) share."""

    def __init__(self) -> None:
        #: each partition's fetch answered before its latest, and its latest (as of a look)
        self._answered: dict[TopicPartition, tuple[int | None, int | None]] = {}

    async def read_to_end_at(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
        """Where the consumer's position has reached the end its latest fetch of ``tp`` found:
        when the fetch before that one was answered (the latest was asked for after it, so it
        found every record stored by then; the time it was answered is when the reader's loop
        took it, late when the loop stood still). Not when the reader looks: a partition not
        fetched since (its records held while the reader works, the consumer paused, its
        fetches failing) may hold records not read yet. None where the position is short of
        that end, or the partition was not fetched twice since it was assigned (aiokafka
        forgets its end and its fetches then)."""
        end = consumer.highwater(tp)
        before, latest = self._answered.get(tp, (None, None))
        polled = None if end is None else consumer.last_poll_timestamp(tp)
        if polled != latest:
            before, latest = self._answered[tp] = (latest, polled)
        position = None if end is None else await consumer.position(tp)
        return None if position is None or position < end else before


class HeardUntil:
    """Until when (the reader's clock) a reader has read every record of some partitions. Each
    is heard until ``since_ms`` to begin with: the reader starts at the ends it had then, or has
    read back to them; a partition not fetched yet holds the view there. One read to the end its
    latest fetch found counts as heard until the fetch before was answered
    (``FetchAnswers``). One read behind counts until its newest record read (its timestamp, the
    producer's clock). An empty partition is at its end at its second fetch. The reader's view
    of them is as of the earliest (``FleetView.heard_until_ms``).
    """

    def __init__(self, partitions: list[TopicPartition], since_ms: int) -> None:
        self.partitions = list(partitions)
        self._topics = {tp.topic for tp in partitions}
        self._heard = {tp.partition: since_ms for tp in partitions}
        self._fetches = FetchAnswers()

    def add(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions added to the topic since (``take_on_added``), read from their beginning:
        each holds the view where it stands now until it is read to its end."""
        held = min(self._heard.values(), default=0)
        for tp in partitions:
            if tp.topic in self._topics and tp.partition not in self._heard:
                self.partitions.append(tp)
                self._heard[tp.partition] = held

    async def update(self, consumer: AIOKafkaConsumer, records: Iterable[ConsumerRecord]) -> int:
        """After a fetch that gave ``records``: the time heard until."""
        newest: dict[int, int] = {}
        for record in records:
            if record.topic in self._topics:
                newest[record.partition] = max(newest.get(record.partition, 0), record.timestamp)
        for tp in self.partitions:
            at_end = await self._fetches.read_to_end_at(consumer, tp)
            heard = newest.get(tp.partition, 0) if at_end is None else at_end
            self._heard[tp.partition] = max(self._heard[tp.partition], heard)
        return min(self._heard.values())


async def handle_each(items: Iterable[Decoded], handle: Callable[[Decoded], None]) -> None:
    """``handle`` each of ``items``, the event loop running its other tasks between two: a
    configuration record takes milliseconds with many tenants configured, and a fetch holds up
    to ``FETCH_RECORDS`` of them (a restore, a script setting each tenant), which in one go
    would hold up admission, placement and heartbeats for seconds
    (``python -m benchmarks.router_config_stall``)."""
    for item in items:
        handle(item)
        await asyncio.sleep(0)


async def read_to_end(typed: TypedConsumer, topic: str, handle: Callable[[Decoded], None],
                      timeout_s: float = 30.0) -> bool:
    """Fetch ``topic`` with ``typed`` (its consumer subscribed to it) and ``handle`` each message
    until the consumer's position has passed every partition's end offset as of the call: what
    a component reads before it starts working (its configuration). False when ``timeout_s``
    passed first (the caller goes on, and keeps reading)."""
    consumer, loop = typed.consumer, asyncio.get_running_loop()
    ends = await consumer.end_offsets(partitions(typed.catalog, [topic]))
    deadline = loop.time() + timeout_s
    while True:
        try:
            if all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                return True
        except IllegalStateError:
            pass  # not assigned its partitions yet
        if loop.time() > deadline:
            return False
        await handle_each(await typed.fetch(100), handle)


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


async def topic_partitions(bootstrap: str, catalog: TopicCatalog) -> dict[str, int]:
    """How many partitions each of the catalog's topics the broker has holds."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if name in catalog.topics()]
        described = await admin.describe_topics(names) if names else []
    finally:
        await admin.close()
    return {topic["topic"]: len(topic["partitions"]) for topic in described}


async def missing_topics(bootstrap: str, catalog: TopicCatalog) -> list[str]:
    """The catalog's topics the broker does not have."""
    existing = await topic_partitions(bootstrap, catalog)
    return [name for name in catalog.topics() if name not in existing]


def misshapen_topics(catalog: TopicCatalog, partitions: dict[str, int]) -> dict[str, str]:
    """Each topic of ``partitions`` (``topic_partitions``) whose count is not the catalog's ->
    ``NAME has N partitions, not M`` (a topic a broker auto-created has 1)."""
    return {name: f"{name} has {count} partitions, not {catalog.spec(name).partitions}"
            for name, count in partitions.items() if count != catalog.spec(name).partitions}


def on_broker(bootstrap: str | None) -> str:
    """The `` --bootstrap ADDRESS`` of a command a message tells the user to run, where the user
    named a broker (none: the command's default is the user's too), so that it reaches the
    same broker as printed."""
    return f" --bootstrap {bootstrap}" if bootstrap else ""


def make_again(namespace: str, names: Iterable[str], bootstrap: str | None = None) -> str:
    """The commands that make topics of ``namespace`` again with the catalog's partitions (Kafka
    cannot remove a partition), as the errors and warnings on such topics name them; with the
    ``--bootstrap`` the user gave, if any, so that they reach the same broker."""
    on = on_broker(bootstrap)
    return (f"`governor topics delete{on} --namespace {namespace} {' '.join(names)}` (their "
            f"records go with them) then `governor topics create{on} --namespace {namespace}`")


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
            _refused(await admin.create_topics(wanted, timeout_ms=15_000))
        await wait_for_leaders(admin, list(catalog.topics()))
        return [t.name for t in wanted]
    finally:
        await admin.close()


#: A topic-level override (as DescribeConfigs names a value's source): what AlterConfigs replaces.
_DYNAMIC_TOPIC_CONFIG = 1


async def _topic_overrides(admin: AIOKafkaAdminClient, names: list[str]
                           ) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """For each topic of ``names``: every config value it has, and its topic-level overrides."""
    out = {}
    for response in await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]):
        for code, message, _, name, entries in response.resources:
            if code:
                raise BusError(f"could not describe the configs of topic {name}: error {code} "
                               f"{message}")
            out[name] = ({e[0]: e[1] for e in entries},
                         {e[0]: e[1] for e in entries if e[3] == _DYNAMIC_TOPIC_CONFIG})
    return out


async def config_drift(bootstrap: str, catalog: TopicCatalog
                       ) -> dict[str, dict[str, tuple[str | None, str]]]:
    """The catalog's existing topics whose configs (``TopicSpec.config``: cleanup policy,
    retention) are not the catalog's: topic -> key -> (its value, the catalog's). A topic made
    by an older release keeps its configs (creating topics leaves existing ones as they are)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        listed = set(await admin.list_topics())
        existing = [name for name in catalog.topics() if name in listed]
        drift = {}
        for name, (values, _) in (await _topic_overrides(admin, existing)).items():
            differ = {key: (values.get(key), want)
                      for key, want in catalog.spec(name).config().items()
                      if values.get(key) != want}
            if differ:
                drift[name] = differ
        return drift
    finally:
        await admin.close()


async def align_configs(bootstrap: str, catalog: TopicCatalog, names: list[str],
                        timeout_s: float = 15.0) -> None:
    """Give the topics ``names`` the catalog's configs, keeping their other topic-level
    overrides (AlterConfigs replaces a topic's whole set of them: the rest is sent back);
    return once the broker describes them so (it applies them a moment after it answers)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        overrides = await _topic_overrides(admin, names)
        wanted = {name: {**overrides[name][1], **catalog.spec(name).config()} for name in names}
        for response in await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, wanted[name]) for name in names]):
            for code, message, _, name in response.resources:
                if code:
                    raise BusError(f"could not set the configs of topic {name}: error {code} "
                                   f"{message}")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while any(values.get(key) != value
                  for name, (values, _) in (await _topic_overrides(admin, names)).items()
                  for key, value in wanted[name].items()):
            if asyncio.get_running_loop().time() > deadline:
                raise BusError(f"the broker took the new configs of {', '.join(names)} but did "
                               f"not apply them within {timeout_s:g}s")
            await asyncio.sleep(0.1)  # polling the broker's configs until they are applied
    finally:
        await admin.close()


async def wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str],
                           timeout_s: float = 30) -> None:
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


def _refused(response) -> None:
    """Raise for a topic the broker did not create (one that exists already is fine: another
    process raced us)."""
    for topic, code, *message in response.topic_errors:
        if code not in (0, TopicAlreadyExistsError.errno):
            raise BusError(f"could not create topic {topic}: error {code} {message}")


async def create_topic(bootstrap: str, name: str, configs: dict[str, str] | None = None) -> None:
    """A topic of one partition outside the catalog (a client's own reply topic), with the
    topic ``configs`` given, once it has its leader."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        _refused(await admin.create_topics([NewTopic(name, 1, 1, topic_configs=configs or {})],
                                           timeout_ms=15_000))
        await wait_for_leaders(admin, [name])
    finally:
        await admin.close()


#: The answers of a topic's deletion that leave it deleted or on its way: none, no such topic
#: (gone already), and timed out (the broker deletes it a moment later).
_DELETED_OR_GOING = frozenset({0, UnknownTopicOrPartitionError.errno, RequestTimedOutError.errno})
#: Refusals aiokafka has no class of.
_REFUSALS = {73: "TOPIC_DELETION_DISABLED (the broker's delete.topic.enable is false)"}


def deletion_refusals(topic_error_codes: Iterable[tuple[str, int]]) -> dict[str, str]:
    """The topics of a DeleteTopics answer that the broker did not delete, and why."""
    return {topic: _REFUSALS.get(code, f"{for_code(code).__name__} (error code {code})")
            for topic, code in topic_error_codes if code not in _DELETED_OR_GOING}


async def delete_topics(bootstrap: str, names: Iterable[str], wait: bool = False,
                        timeout_s: float = 30.0) -> None:
    """Delete the topics ``names``; with ``wait``, return once the broker no longer lists them
    (it deletes them a moment after it answers: one created again before that is refused).
    A ``BusError`` names those the broker refused to delete, and why. (Before 7 Dec its
    refusals were ignored: ``governor topics delete`` waited ``timeout_s`` for them to go and
    said the broker still listed them "after deleting them".)"""
    names = list(names)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        answer = await admin.delete_topics(names, timeout_ms=15_000)
        refused = deletion_refusals(answer.topic_error_codes)
        if refused:
            reasons = {why: [t for t in refused if refused[t] == why] for why in refused.values()}
            raise BusError(f"the broker at {bootstrap} did not delete " + "; ".join(
                f"{', '.join(topics)}: {why}" for why, topics in reasons.items()))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while wait and set(names) & set(await admin.list_topics()):
            if asyncio.get_running_loop().time() > deadline:
                raise BusError(f"the broker still lists {', '.join(names)} {timeout_s:g}s after "
                               "deleting them")
            await asyncio.sleep(0.1)  # polling the broker's topic list until they are gone
    finally:
        await admin.close()
