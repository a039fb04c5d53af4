"""Helpers of the services that follow topics (``infra.bus``): ``HeardUntil``, until when a
reader has read every record of its partitions, from what the aiokafka consumer reports (the
router's and the controllers' fleet views judge liveness as of then); ``background`` tasks."""

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from infra.bus import HeardUntil

T0 = 1_700_000_000_000
TOPIC = "unit.telemetry"


class Follower:
    """What ``HeardUntil`` asks of the aiokafka consumer: each partition's end as its latest
    fetch found it (none: not fetched yet), when that fetch was answered, and the position."""

    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = positions
        self.ends: dict[int, int] = {}
        self.polled: dict[int, int] = {}

    def answer(self, partition: int, end: int, at_ms: int) -> None:
        """A fetch of ``partition`` answered at ``at_ms``, finding its end at ``end``."""
        self.ends[partition], self.polled[partition] = end, at_ms

    def highwater(self, tp):
        return self.ends.get(tp.partition)

    def last_poll_timestamp(self, tp):
        return self.polled.get(tp.partition)

    async def position(self, tp):
        return self.positions[tp.partition]


def record(partition: int, timestamp: int, topic: str = TOPIC) -> ConsumerRecord:
    return ConsumerRecord(topic, partition, 0, timestamp, 0, b"w", b"", None, 0, 0, [])


def updated(heard: HeardUntil, follower: Follower, records=()) -> int:
    return asyncio.run(heard.update(follower, records))


def test_a_partition_read_to_its_end_is_heard_until_the_fetch_before_its_latest_else_until_its_newest_record():
    heard = HeardUntil([TopicPartition(TOPIC, p) for p in range(2)], since_ms=T0)
    follower = Follower({0: 50, 1: 40})  # partition 1 read behind
    for partition, end in ((0, 50), (1, 90)):
        follower.answer(partition, end, T0 + 1_000)
    records = [record(1, T0 + 4_000), record(1, T0 + 3_000), record(0, T0 + 8_000, "other")]
    assert updated(heard, follower, records) == T0  # (partition 0: one fetch)
    follower.answer(0, 50, T0 + 8_000)
    assert updated(heard, follower) == T0 + 1_000
    follower.positions[1] = 90  # caught up
    follower.answer(1, 90, T0 + 8_000)
    assert updated(heard, follower) == T0 + 1_000  # (partition 0's)
    for partition, end in ((0, 50), (1, 90)):
        follower.answer(partition, end, T0 + 9_600)
    assert updated(heard, follower) == T0 + 8_000


def test_a_partition_not_fetched_yet_holds_the_view_where_reading_began():
    """Since the reader's start (or the end of its read-back); an empty partition is at its
    end at its second fetch, asked for after its first was answered."""
    partitions = [TopicPartition(TOPIC, p) for p in range(2)]
    follower = Follower({0: 5, 1: 0})
    heard = HeardUntil(partitions, since_ms=T0 - 2_000)
    follower.answer(0, 5, T0 - 100)
    assert updated(heard, follower) == T0 - 2_000
    follower.answer(0, 5, T0)  # partition 1: no fetch answered yet
    assert updated(heard, follower) == T0 - 2_000
    for at_ms in (T0 + 100, T0 + 200):  # its first two fetches: empty
        follower.answer(1, 0, at_ms)
        updated(heard, follower)
    assert updated(heard, follower) == T0 - 100  # (partition 0's)


def test_a_partition_assigned_again_is_heard_no_further_until_it_is_read_again():
    """As a consumer assigned anew has it (aiokafka forgets its end and its fetches): held
    where it was until its first fetch after is answered and the next asked for."""
    heard = HeardUntil([TopicPartition(TOPIC, 0)], since_ms=T0)
    follower = Follower({0: 4})
    for at_ms in (T0 + 100, T0 + 200):
        follower.answer(0, 4, at_ms)
        updated(heard, follower)
    assert updated(heard, follower) == T0 + 100
    follower.ends, follower.polled = {}, {}  # assigned again: not fetched yet
    assert updated(heard, follower) == T0 + 100
    follower.answer(0, 9, T0 + 5_000)
    follower.positions[0] = 9  # (read to its end at once)
    assert updated(heard, follower) == T0 + 100
    follower.answer(0, 9, T0 + 5_100)
    assert updated(heard, follower) == T0 + 5_000


def test_a_partition_added_holds_the_view_where_it_stands_until_it_is_read_to_its_end():
    """One added to the topic while the reader runs (``take_on_added``), read from its
    beginning: heartbeats may wait there unread, so the view goes no further until it is read."""
    heard = HeardUntil([TopicPartition(TOPIC, 0)], since_ms=T0)
    follower = Follower({0: 4, 1: 0})
    for at_ms in (T0 + 100, T0 + 200):
        follower.answer(0, 4, at_ms)
        updated(heard, follower)
    heard.add([TopicPartition(TOPIC, 1), TopicPartition("other", 7)])
    assert [tp.partition for tp in heard.partitions] == [0, 1]
    for at_ms in (T0 + 5_000, T0 + 5_100):
        follower.answer(0, 4, at_ms)
        assert updated(heard, follower) == T0 + 100  # (partition 1: not fetched yet)
    follower.answer(1, 6, T0 + 5_100)  # its records: read behind, up to the newest
    assert updated(heard, follower, [record(1, T0 + 3_000)]) == T0 + 3_000
    follower.positions[1] = 6
    for at_ms in (T0 + 5_200, T0 + 5_300):
        follower.answer(0, 4, at_ms)
        follower.answer(1, 6, at_ms)
        updated(heard, follower)
    assert updated(heard, follower) == T0 + 5_200


@pytest.mark.parametrize("before_ms, latest_ms", [
    # its records, fetched at T0 + 1 s, waited until the reader, slow, took them at T0 + 9 s
    # (or it was paused since, or its fetches failed since): it is not fetched meanwhile
    (T0 + 900, T0 + 1_000),
    # its latest fetch, asked for after T0 + 1 s, was answered while the reader's loop stood
    # still, and taken at T0 + 8.9 s: what was stored after the broker answered is not read
    (T0 + 1_000, T0 + 8_900),
])
def test_a_worker_is_not_silent_for_what_its_partition_may_hold_unread(before_ms, latest_ms):
    from controllers.router.fleet import FleetView, WorkerView

    heard = HeardUntil([TopicPartition(TOPIC, p) for p in range(2)], since_ms=T0)
    follower = Follower({0: 7, 1: 3})
    for partition, end in ((0, 7), (1, 3)):
        follower.answer(partition, end, before_ms)
        updated(heard, follower)
    follower.answer(0, 7, latest_ms)
    for at_ms in (T0 + 8_800, T0 + 8_900):
        follower.answer(1, 3, at_ms)
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    fleet.put(WorkerView("w0", slot=0, pool="h100", gpu_type="h100", models=("m",), running=1,
                         waiting=0, last_seen_ms=T0 + 1_000))
    fleet.heard_until_ms = updated(heard, follower, [record(0, T0 + 1_000)])
    assert fleet.heard_until_ms == before_ms
    assert fleet.silent(T0 + 9_000) == set()


def test_a_background_task_the_broker_fails_is_said_in_one_line_a_bug_with_its_traceback(caplog):
    """It stops the service either way (the component exits and is restarted)."""
    import logging

    from aiokafka.errors import KafkaConnectionError

    from infra.bus import background

    async def run(error: Exception) -> bool:
        stop = asyncio.Event()

        async def fails():
            raise error

        task = background(fails(), stop)
        await asyncio.wait_for(stop.wait(), timeout=5)
        return task.done()

    with caplog.at_level(logging.ERROR, logger="infra.bus"):
        assert asyncio.run(run(KafkaConnectionError("no broker")))
        assert asyncio.run(run(ValueError("a bug")))
    broker, bug = [r for r in caplog.records if r.name == "infra.bus"]
    assert "no broker" in broker.getMessage() and broker.exc_info is None
    assert bug.exc_info is not None
