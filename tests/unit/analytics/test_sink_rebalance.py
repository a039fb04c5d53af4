"""Partitions given to a sink again while it holds a full batch: every record is written once.

A rebalance begins while the sink's batch is full and its partitions paused for it. The listener
pauses the partitions it is given and seeks them to the store's marks; a partition the store
has no records of is sought to its beginning, a round trip to the broker. Before 5 Dec the main
loop resumed its paused partitions during that round trip: records were fetched from the
positions just sought, then dropped with the batch when the positioning ended, their partition's
position already past them, and never written (or the sink stalled below the partition's end).
"""

import asyncio
import time

from aiokafka import TopicPartition

from analytics.journal import Journal
from analytics.sink import AnalyticsSink, SinkSettings
from schemas.topics import TopicCatalog
from tests.unit.analytics.fake_kafka import FakeConsumer, queued

CATALOG = TopicCatalog("unit")
FIRST, LATER = TopicPartition(CATALOG.telemetry, 0), TopicPartition(CATALOG.telemetry, 1)
LATEST = TopicPartition(CATALOG.telemetry, 2)
PARTITIONS = (FIRST, LATER, LATEST)
RECORDS = 30  # per partition
ROUND_TRIP_S = 0.5  # a seek to the beginning asks the broker: longer than the loop's waits


class _Consumer(FakeConsumer):
    """Three partitions with positions, as a consumer in a group has them: the first delivers
    records from the start; the group rebalances the first time all three are paused (the
    sink's batch full), and the other two have records from then on. A new assignment starts
    unpaused, with no positions until they are sought."""

    def __init__(self) -> None:
        super().__init__()
        self.logs = {tp: queued(tp, 0, RECORDS - 1) for tp in PARTITIONS}
        self.available = {FIRST}
        self.positions: dict[TopicPartition, int | None] = {}
        self.rebalances: list[asyncio.Task] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        await asyncio.sleep(ROUND_TRIP_S)
        self.positions[tp] = 0

    async def end_offsets(self, tps) -> dict[TopicPartition, int]:
        return {tp: len(self.logs[tp]) for tp in tps}

    async def commit(self, offsets) -> None:
        pass

    async def position(self, tp: TopicPartition) -> int:
        while self.positions[tp] is None:  # (as aiokafka's, until the partition is sought)
            await asyncio.sleep(0.005)
        return self.positions[tp]

    async def _rebalance(self, revoked: set[TopicPartition]) -> None:
        if revoked:
            await self.listener.on_partitions_revoked(revoked)
            self.available = set(PARTITIONS)
        self.positions = dict.fromkeys(PARTITIONS)  # (their committed offsets not read yet)
        self._paused = set()
        await self.listener.on_partitions_assigned(set(PARTITIONS))

    async def getmany(self, timeout_ms=0, max_records=None):
        if not self.rebalances or (len(self.rebalances) == 1 and self.rebalances[0].done()
                                   and self._paused == self.assignment()):
            self.rebalances.append(asyncio.create_task(self._rebalance(self.assignment())))
        await asyncio.sleep(0.005)  # a fetch takes a moment; the flush and the listener run
        for tp in sorted(self.assignment() & self.available - self._paused):
            position = self.positions[tp]
            if position is not None and position < len(self.logs[tp]):
                records = self.logs[tp][position:position + max_records]
                self.positions[tp] = position + len(records)
                return {tp: records}
        return {}


def test_records_fetched_while_partitions_are_positioned_are_written_once(store):
    consumer = _Consumer()

    class Sink(AnalyticsSink):
        def _new_consumer(self):
            return consumer

    async def scenario():
        sink = Sink("127.0.0.1:1", CATALOG, store.location, SinkSettings(max_batch_records=10))
        sink._stop = asyncio.Event()
        sink.journal = Journal(store, "run-1")
        sink._next_flush_id = 1
        consuming = asyncio.create_task(sink._consume())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                len(consumer.rebalances) == 2 and consumer.rebalances[1].done()
                and await asyncio.to_thread(sink.journal.marks, [CATALOG.telemetry])
                == {(tp.topic, tp.partition): RECORDS for tp in PARTITIONS}):
            await asyncio.sleep(0.05)  # polling for the marks under a deadline
        sink._stop.set()
        await consuming
        return len(consumer.rebalances), sink.journal.marks([CATALOG.telemetry])

    rebalances, marks = asyncio.run(scenario())
    assert rebalances == 2
    assert marks == {(tp.topic, tp.partition): RECORDS for tp in PARTITIONS}
    rows = store.query("SELECT kafka_partition, count(), uniqExact(kafka_offset) "
                       "FROM request_events GROUP BY kafka_partition ORDER BY kafka_partition").rows
    assert rows == [[tp.partition, RECORDS, RECORDS] for tp in PARTITIONS]
