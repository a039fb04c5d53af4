"""``Outbox.flush`` returns only once every message emitted before it is acknowledged, even when
another task's flush took them (a component commits its input offsets after its flush); what
the broker refused, it names, after delivering the rest."""

import asyncio
from types import SimpleNamespace

from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError
from aiokafka.partitioner import DefaultPartitioner

from infra.bus import Outbox, StreamPartition, Undelivered, stream_partition
from schemas.events import Queued

T0 = 1_700_000_000_000


class _HeldAcks:
    """A producer whose acknowledgements arrive when the test releases them."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future] = []
        self.released = False
        self.unknown: set[str] = set()  # topics without metadata: a send to one waits for it
        self.client = SimpleNamespace(cluster=SimpleNamespace(
            partitions_for_topic=lambda topic: None if topic in self.unknown else {0}),
            force_metadata_update=self._no_news)

    async def _no_news(self) -> bool:
        """A metadata refresh that finds what the producer knew."""
        return True

    async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
        ack = asyncio.get_running_loop().create_future()
        ack.key = key  # type: ignore[attr-defined]
        self.acks.append(ack)
        if self.released:
            self._answer(ack)
        return ack

    def release(self) -> None:
        """Answer what was sent, and from now on every send at once."""
        self.released = True
        for ack in self.acks:
            if not ack.done():
                self._answer(ack)

    def _answer(self, ack: asyncio.Future) -> None:
        ack.set_result(None)


def _queued(request_id: str) -> Queued:
    return Queued(event_time_ms=T0, request_id=request_id, created_ms=T0, prompt_tokens=1,
                  max_tokens=1)


def test_a_flush_waits_for_messages_another_flush_took() -> None:
    async def scenario() -> tuple[bool, int]:
        producer = _HeldAcks()
        outbox = Outbox(producer)
        outbox.emit("governor.telemetry", _queued("tick"), "tick")
        ticks = asyncio.create_task(outbox.flush())  # a background flush, acks not yet in
        await asyncio.sleep(0)
        outbox.emit("governor.telemetry", _queued("r1"), "r1")  # the request loop's message
        config_reader = asyncio.create_task(outbox.flush())  # another task's flush
        await asyncio.sleep(0)
        own = asyncio.create_task(outbox.flush())  # the request loop's own, then it commits
        for _ in range(5):
            await asyncio.sleep(0)
        returned_early = own.done()
        producer.release()
        await asyncio.wait_for(asyncio.gather(ticks, config_reader, own), timeout=5)
        return returned_early, len(producer.acks)

    returned_early, sent = asyncio.run(scenario())
    assert not returned_early  # it waited for the acknowledgements of "r1"
    assert sent == 2  # each message sent once


def test_a_flush_sends_what_was_emitted_in_order_and_counts_it() -> None:
    async def scenario() -> tuple[int, int]:
        producer = _HeldAcks()
        outbox = Outbox(producer)
        for i in range(3):
            outbox.emit("governor.telemetry", _queued(f"r{i}"), f"r{i}")
        flush = asyncio.create_task(outbox.flush())
        await asyncio.sleep(0)
        producer.release()
        return await flush, len(outbox)

    assert asyncio.run(scenario()) == (3, 0)


class _Broker(_HeldAcks):
    """Acknowledges sends to ``live`` topics at once; sends to others are refused (``refuse``),
    fail on delivery (``fail``) or are never acknowledged (the rest), as for a deleted topic."""

    def __init__(self, live: set[str], refuse: set[str] = frozenset(),
                 fail: set[str] = frozenset()) -> None:
        super().__init__()
        self.live, self.refuse, self.fail = live, refuse, fail
        self.sends: list[str] = []

    async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
        self.sends.append(topic)
        if topic in self.unknown:  # waits for metadata that never comes (deleted), unless live
            while topic not in self.live:
                await asyncio.sleep(0.005)
        if topic in self.refuse:
            raise KafkaTimeoutError(f"no metadata for {topic}")
        if topic not in self.live and topic not in self.fail:
            return await super().send(topic, value, key, partition)  # acknowledged on release
        ack = asyncio.get_running_loop().create_future()
        if topic in self.live:
            ack.set_result(None)
        else:
            ack.set_exception(UnknownTopicOrPartitionError(topic))
        return ack


def _flush(outbox: Outbox, messages: list[tuple[str, str]]):
    for topic, key in messages:
        outbox.emit(topic, _queued(key), key)
    try:
        return asyncio.run(asyncio.wait_for(outbox.flush(), timeout=5))
    except Undelivered as exc:
        return exc


def test_a_flush_delivers_what_it_can_and_names_what_the_broker_refused() -> None:
    broker = _Broker(live={"telemetry"}, refuse={"gone"}, fail={"deleted"})
    undelivered = _flush(Outbox(broker), [("gone", "a"), ("telemetry", "b"), ("deleted", "c"),
                                          ("gone", "d"), ("telemetry", "e")])
    assert isinstance(undelivered, Undelivered)
    assert [(t, k) for t, k, _ in undelivered.failed] == [("gone", "a"), ("gone", "d"),
                                                          ("deleted", "c")]
    assert undelivered.topics == {"gone", "deleted"}
    # each refused send waits out the producer's timeout: a topic refused once is not sent again
    assert broker.sends == ["gone", "telemetry", "deleted", "telemetry"]


def test_a_detached_topics_messages_hold_up_no_flush_and_their_failures_are_logged(
        caplog) -> None:
    """The router's ends of streams to its clients' reply topics: one client's topic, gone
    (never acknowledged), refusing or failing, must neither hold up nor stop the router."""
    async def run() -> tuple[int, Exception | None]:
        broker = _Broker(live={"telemetry"}, refuse={"refusing", "own"}, fail={"failing"})
        outbox = Outbox(broker, detached=lambda topic: topic not in ("telemetry", "own"))
        for topic, key in (("unacknowledged", "a"), ("refusing", "b"), ("failing", "c"),
                           ("telemetry", "d")):
            outbox.emit(topic, _queued(key), key)
        delivered = await asyncio.wait_for(outbox.flush(), timeout=5)  # (not waiting on "a")
        await asyncio.sleep(0)  # (the detached sends' failures come in)
        outbox.emit("own", _queued("e"), "e")  # (a topic not detached: its failure raised)
        try:
            await asyncio.wait_for(outbox.flush(), timeout=5)
        except Undelivered as exc:
            return delivered, exc
        return delivered, None

    delivered, undelivered = asyncio.run(run())
    assert delivered == 1  # "d": the flush counts what it waited for
    assert "b to refusing was not delivered" in caplog.text
    assert "c to failing was not delivered" in caplog.text
    assert "a to" not in caplog.text  # still unacknowledged, never waited for
    assert isinstance(undelivered, Undelivered) and undelivered.topics == {"own"}


def test_a_flush_stops_waiting_for_messages_to_a_topic_that_vanished() -> None:
    asked: list[set[str]] = []

    async def vanished(topics: set[str]) -> set[str]:
        asked.append(topics)
        return topics & {"deleted"}

    broker = _Broker(live={"telemetry"})
    outbox = Outbox(broker, vanished=vanished, patience_s=0.01)
    undelivered = _flush(outbox, [("telemetry", "a"), ("deleted", "b"), ("deleted", "c")])
    assert [(t, k) for t, k, _ in undelivered.failed] == [("deleted", "b"), ("deleted", "c")]
    assert asked == [{"deleted"}]
    # a topic that still exists is waited for, however long its acknowledgement takes
    slow = _Broker(live=set())
    outbox = Outbox(slow, vanished=vanished, patience_s=0.01)
    outbox.emit("slow", _queued("d"), "d")
    flush = asyncio.run(_released_after(outbox, slow, 0.05))
    assert flush == 1 and asked[1:] and all(ask == {"slow"} for ask in asked[1:])


async def _released_after(outbox: Outbox, broker: _HeldAcks, delay_s: float) -> int:
    flush = asyncio.create_task(outbox.flush())
    await asyncio.sleep(delay_s)
    broker.release()
    return await asyncio.wait_for(flush, timeout=5)


def test_a_send_waiting_for_a_deleted_topics_metadata_is_given_up() -> None:
    """A topic deleted after it was last listed and before the first send to it: the producer
    waits for its metadata until the request timeout, holding up the flush (and, in a worker,
    its heartbeats). With ``vanished``, the send is given up once the topic is known gone."""
    asked: list[set[str]] = []

    async def vanished(topics: set[str]) -> set[str]:
        asked.append(topics)
        return topics & {"deleted"}

    broker = _Broker(live={"telemetry"})
    broker.unknown = {"deleted"}
    outbox = Outbox(broker, vanished=vanished, patience_s=0.01)
    undelivered = _flush(outbox, [("deleted", "a"), ("telemetry", "b"), ("deleted", "c")])
    assert isinstance(undelivered, Undelivered)
    assert [(t, k) for t, k, _ in undelivered.failed] == [("deleted", "a"), ("deleted", "c")]
    assert broker.sends == ["deleted", "telemetry"]  # refused once, not waited for again
    assert asked == [{"deleted"}]
    # a topic whose metadata arrives late is waited for: it exists
    late = _Broker(live=set())
    late.unknown = {"new"}
    outbox = Outbox(late, vanished=vanished, patience_s=0.01)
    outbox.emit("new", _queued("d"), "d")

    async def metadata_after_two_more_asks() -> int:
        flush = asyncio.create_task(outbox.flush())
        async with asyncio.timeout(5):  # asked again at each lapse of patience meanwhile
            while len(asked) < 3:
                await asyncio.sleep(0.005)
        late.live.add("new")
        return await asyncio.wait_for(flush, timeout=5)

    assert asyncio.run(metadata_after_two_more_asks()) == 1
    assert len(asked) >= 3 and all(ask == {"new"} for ask in asked[1:])


class _FailingAcks(_HeldAcks):
    """Acknowledgements fail (the broker refused), when released, for the keys given."""

    def __init__(self, failing: set[bytes]) -> None:
        super().__init__()
        self.failing = failing

    def _answer(self, ack: asyncio.Future) -> None:
        if ack.key in self.failing:
            ack.set_exception(KafkaTimeoutError())
        else:
            ack.set_result(None)


def test_a_flush_reports_a_refusal_of_its_messages_that_another_flush_sent() -> None:
    """The router's background tasks flush the outbox its request loop emits into: a refused
    Dispatch taken by one of them must not let the request loop's own flush return (it would
    then commit a request nobody answered)."""
    async def scenario() -> tuple:
        producer = _FailingAcks({b"r1"})
        outbox = Outbox(producer)
        outbox.emit("governor.dispatch", _queued("r1"), "r1")
        background = asyncio.create_task(outbox.flush())  # takes r1
        await asyncio.sleep(0)
        own = asyncio.create_task(outbox.flush())  # the request loop's, after emitting r1
        await asyncio.sleep(0)
        outbox.emit("governor.telemetry", _queued("r2"), "r2")
        later = asyncio.create_task(outbox.flush())  # after r2 only: r1 is not its business
        await asyncio.sleep(0)
        producer.release()
        return tuple(await asyncio.wait_for(asyncio.gather(
            background, own, later, return_exceptions=True), timeout=5))

    background, own, later = asyncio.run(scenario())
    assert isinstance(background, Undelivered) and isinstance(own, Undelivered)
    assert own.failed[0][:2] == ("governor.dispatch", "r1")
    assert isinstance(later, Undelivered)  # r1 was emitted before it too
    assert asyncio.run(_one_more_flush_after_a_told_failure()) == 1


async def _one_more_flush_after_a_told_failure() -> int:
    """A refusal is reported by every flush, whichever task calls it (the one that emitted the
    message may flush only later), until its emitter says it dealt with it."""
    producer = _FailingAcks({b"bad"})
    outbox = Outbox(producer)
    outbox.emit("gone", _queued("bad"), "bad")
    producer.release()
    for _ in range(2):
        try:
            await outbox.flush()
            raise AssertionError("the refusal was not reported")
        except Undelivered as exc:
            assert exc.topics == {"gone"}
    outbox.forgive({"gone"})
    outbox.emit("t", _queued("good"), "good")
    return await outbox.flush()


def test_a_flush_cut_short_leaves_what_it_had_not_sent_for_the_next_one() -> None:
    class _SlowSecondSend(_HeldAcks):
        async def send(self, topic, value, key=None, partition=None):
            if key == b"b" and not self.released:
                await asyncio.sleep(60)  # a topic's metadata that does not come
            return await super().send(topic, value, key, partition)

    async def scenario() -> tuple[int, int]:
        producer = _SlowSecondSend()
        outbox = Outbox(producer)
        for key in ("a", "b", "c"):
            outbox.emit("t", _queued(key), key)
        flush = asyncio.create_task(outbox.flush())
        for _ in range(3):
            await asyncio.sleep(0)
        flush.cancel()
        await asyncio.gather(flush, return_exceptions=True)
        left = len(outbox)
        producer.release()
        return left, await outbox.flush()

    assert asyncio.run(scenario()) == (2, 2)  # b and c kept, then sent


def test_a_send_that_raises_something_else_fails_its_message_not_the_rest() -> None:
    class _NoSuchPartition(_HeldAcks):
        async def send(self, topic, value, key=None, partition=None):
            assert partition is None or partition < 32, "Unrecognized partition"
            return await super().send(topic, value, key, partition)

    async def scenario():
        producer = _NoSuchPartition()
        producer.released = True
        outbox = Outbox(producer)
        outbox.emit("governor.dispatch", _queued("a"), "a", 40)
        outbox.emit("governor.dispatch", _queued("b"), "b", 3)
        try:
            await outbox.flush()
        except Undelivered as exc:
            return exc.failed, len(producer.acks)

    failed, sent = asyncio.run(scenario())
    assert [(topic, key) for topic, key, _ in failed] == [("governor.dispatch", "a")]
    assert "Unrecognized partition" in repr(failed[0][2]) and sent == 1


def test_a_flush_called_after_another_flush_failed_its_message_reports_it() -> None:
    """The request loop emits r1 and awaits something else; the config reader's flush takes r1
    and the broker refuses it; the request loop's own flush, called only then, must not return
    (it would commit r1, never answered)."""
    async def scenario():
        producer = _FailingAcks({b"r1"})
        producer.released = True
        outbox = Outbox(producer)
        outbox.emit("governor.dispatch", _queued("r1"), "r1")
        try:
            await outbox.flush()  # the config reader's
        except Undelivered:
            pass
        try:
            await outbox.flush()  # the request loop's
        except Undelivered as exc:
            return exc.failed[0][:2]

    assert asyncio.run(scenario()) == ("governor.dispatch", "r1")


class _LateMetadata(_HeldAcks):
    """A producer that knows one partition of each topic until its metadata is refreshed, then
    two (a partition added since its last refresh); aiokafka refuses a send to a partition its
    metadata lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.released = True
        self.partitions = {0}
        self.client = SimpleNamespace(
            cluster=SimpleNamespace(partitions_for_topic=lambda topic: self.partitions),
            force_metadata_update=self._refresh)

    async def _refresh(self) -> bool:
        self.partitions = {0, 1}
        return True

    async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
        assert partition is None or partition in self.partitions, "Unrecognized partition"
        return await super().send(topic, value, key, partition)


def test_a_send_to_a_partition_the_producer_has_not_heard_of_waits_for_its_metadata() -> None:
    """A router that learned of an added partition first pins a stream there; a worker's
    producer that had not yet was refused the send (``Undelivered`` on the responses topic: the
    worker stopped)."""
    async def scenario() -> int:
        outbox = Outbox(_LateMetadata())
        outbox.emit("governor.responses", _queued("r1"), "r1", partition=1)
        return await outbox.flush()

    assert asyncio.run(scenario()) == 1


def test_a_streams_partition_is_where_the_producers_put_its_key() -> None:
    """So a stream pinned before any partition is added lands where it always did."""
    partitioner = DefaultPartitioner()
    for count in (1, 4, 5, 12):
        for rid in (f"req-{i}" for i in range(50)):
            assert stream_partition(rid, count) == partitioner(
                rid.encode(), list(range(count)), list(range(count)))


def test_a_stream_partition_its_topic_lacks_is_left_to_the_key() -> None:
    """A dispatch written by hand may pin its stream to a partition the topic does not have:
    its records go where their key hashes rather than stop the worker or router writing them
    (undelivered records of their own topics do), while any other partition the topic lacks
    is still refused."""
    async def scenario() -> tuple[int, list]:
        producer = _LateMetadata()
        sent = []
        send = producer.send

        async def recording(topic, value, key=None, partition=None):
            ack = await send(topic, value, key, partition)
            sent.append(partition)
            return ack

        producer.send = recording
        outbox = Outbox(producer)
        outbox.emit("governor.responses", _queued("r1"), "r1", partition=StreamPartition(7))
        delivered = await outbox.flush()
        outbox.emit("governor.dispatch", _queued("r2"), "r2", partition=7)
        try:
            await outbox.flush()
        except Undelivered as exc:
            return delivered, sent, [(topic, key) for topic, key, _ in exc.failed]

    delivered, sent, failed = asyncio.run(scenario())
    assert (delivered, sent, failed) == (1, [None], [("governor.dispatch", "r2")])
