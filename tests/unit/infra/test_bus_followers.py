"""Helpers of the services that follow topics (``infra.bus``): ``HeardUntil``, until when a
reader has read every record of its partitions, from what the aiokafka consumer reports (the
router's and the controllers' fleet views judge liveness as of then); ``background`` tasks."""

import asyncio

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from infra.bus import HeardUntil

T0 = 1_700_000_000_000
TOPIC = "unit.telemetry"


class Follower:
    """What ``HeardUntil`` asks of the aiokafka consumer: each partition's end as its last
    fetch found it (None: not fetched yet), when that fetch was answered, and the position."""

    def __init__(self, ends: dict[int, int], positions: dict[int, int],
                 polled: dict[int, int] | None = None) -> None:
        self.ends, self.positions = ends, positions
        self.polled = polled or {}

    def highwater(self, tp):
        return self.ends.get(tp.partition)

    def last_poll_timestamp(self, tp):
        return self.polled.get(tp.partition, T0 + 60_000) if tp.partition in self.ends else None

    async def position(self, tp):
        return self.positions[tp.partition]


def record(partition: int, timestamp: int, topic: str = TOPIC) -> ConsumerRecord:
    return ConsumerRecord(topic, partition, 0, timestamp, 0, b"w", b"", None, 0, 0, [])


def test_a_partition_read_to_its_end_is_heard_until_the_fetch_else_until_its_newest_record():
    heard = HeardUntil([TopicPartition(TOPIC, p) for p in range(2)], since_ms=T0)
    follower = Follower({0: 50, 1: 90}, {0: 50, 1: 40})  # partition 1 read behind
    records = [record(1, T0 + 4_000), record(1, T0 + 3_000), record(0, T0 + 8_000, "other")]
    assert asyncio.run(heard.update(follower, T0 + 9_000, records)) == T0 + 4_000
    follower.positions[1] = 90  # caught up
    assert asyncio.run(heard.update(follower, T0 + 9_500, [])) == T0 + 9_500


def test_a_partition_not_fetched_yet_holds_the_view_where_reading_began():
    """Since the reader's start (or the end of its read-back); an empty partition is at its
    end at its first fetch."""
    partitions = [TopicPartition(TOPIC, p) for p in range(2)]
    follower = Follower({0: 5}, {0: 5, 1: 0})  # partition 1: no fetch answered yet
    heard = HeardUntil(partitions, since_ms=T0 - 2_000)
    assert asyncio.run(heard.update(follower, T0, [])) == T0 - 2_000
    follower.ends[1] = 0  # its first fetch: empty
    assert asyncio.run(heard.update(follower, T0 + 500, [])) == T0 + 500


def test_a_partition_at_the_end_its_last_fetch_found_is_heard_until_that_fetch_only():
    """Its records were fetched at T0 + 1 s and held until the reader, slow, took them at
    T0 + 9 s (or it was paused, or its fetches failed since): it is not fetched again while
    they wait, so what its workers sent since is not read, and a worker heard at T0 + 1 s is
    not silent as of T0 + 9 s."""
    from controllers.router.fleet import FleetView, WorkerView

    partitions = [TopicPartition(TOPIC, p) for p in range(2)]
    follower = Follower({0: 7, 1: 3}, {0: 7, 1: 3}, polled={0: T0 + 1_000, 1: T0 + 8_900})
    heard = HeardUntil(partitions, since_ms=T0)
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    fleet.put(WorkerView("w0", slot=0, pool="h100", gpu_type="h100", models=("m",), running=1,
                         waiting=0, last_seen_ms=T0 + 1_000))
    fleet.heard_until_ms = asyncio.run(heard.update(follower, T0 + 9_000, [record(0, T0 + 1_000)]))
    assert fleet.heard_until_ms == T0 + 1_000
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
