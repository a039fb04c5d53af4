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
    """What ``HeardUntil`` asks of the aiokafka consumer."""

    def __init__(self, ends: dict[int, int], positions: dict[int, int]) -> None:
        self.ends, self.positions = ends, positions

    def highwater(self, tp):
        return self.ends.get(tp.partition)

    async def position(self, tp):
        return self.positions[tp.partition]


def record(partition: int, timestamp: int, topic: str = TOPIC) -> ConsumerRecord:
    return ConsumerRecord(topic, partition, 0, timestamp, 0, b"w", b"", None, 0, 0, [])


def test_a_partition_read_to_its_end_is_heard_until_the_fetch_else_until_its_newest_record():
    heard = HeardUntil([TopicPartition(TOPIC, p) for p in range(2)])
    follower = Follower({0: 50, 1: 90}, {0: 50, 1: 40})  # partition 1 read behind
    records = [record(1, T0 + 4_000), record(1, T0 + 3_000), record(0, T0 + 8_000, "other")]
    assert asyncio.run(heard.update(follower, T0 + 9_000, records)) == T0 + 4_000
    follower.positions[1] = 90  # caught up
    assert asyncio.run(heard.update(follower, T0 + 9_500, [])) == T0 + 9_500


def test_a_partition_not_fetched_yet_holds_back_nothing_but_a_read_back_holds_all():
    partitions = [TopicPartition(TOPIC, p) for p in range(2)]
    follower = Follower({0: 5}, {0: 5, 1: 0})  # partition 1: no fetch answered yet
    assert asyncio.run(HeardUntil(partitions).update(follower, T0, [])) == T0
    after_read_back = HeardUntil(partitions, since_ms=T0 - 2_000)
    assert asyncio.run(after_read_back.update(follower, T0, [])) == T0 - 2_000


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
