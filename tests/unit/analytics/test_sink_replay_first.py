"""A sink started again writes its crashed run's unfinished flush before any flush of its own.

That is what keeps the journal's one gap shut for a store with one sink (``analytics/journal.py``):
the table with views whose insert the crash cut is completed by its dedup token alone, which
the store keeps for the last 1,000 blocks inserted into it; none is inserted between the crash
and the replay when no other sink writes the store. Here the consumer delivers records from the
group's committed offset before the sink's rebalance listener runs (as aiokafka may; the
listener begins during the sink's check before a flush, a commit: a round trip to the broker),
the listener's read of the unfinished flush's records waits until the sink's loop has gone
round many times, and the loop's batch is due at once: the flush that starts first is still
the unfinished one, and every record is counted once by the rollups. (Without the check of
``_assigning`` after that commit, the sink's own flush of those records started first, and
the replay found them written: the rollups counted them twice.)
"""

import asyncio

from aiokafka import TopicPartition

from analytics.batch import Batch, OffsetRange
from analytics.journal import Flush, Journal
from analytics.rows import TopicRows
from analytics.sink import AnalyticsSink, SinkSettings
from schemas.topics import TopicCatalog
from tests.unit.analytics.fake_kafka import FakeConsumer, queued

CATALOG = TopicCatalog("unit")
TP = TopicPartition(CATALOG.telemetry, 0)
LOG = queued(TP, 0, 29)
CRASHED = Flush("crashed-run", 2, (OffsetRange(TP.topic, TP.partition, 10, 19),))
ROUNDS = 50  # of the sink's loop while the unfinished flush's records are read


def _batch(records) -> Batch:
    batch = Batch()
    batch.add_partition(TP.topic, TP.partition, records[0].offset, records[-1].offset,
                        TopicRows(CATALOG.spec(TP.topic)).tables(records))
    return batch


class _Restarted(FakeConsumer):
    """The partition, committed up to the crashed run's last finished flush (offset 10): the
    first fetch delivers from there and starts the group's assignment, whose listener runs
    as the loop goes on; later fetches deliver from where the listener sought."""

    def __init__(self) -> None:
        super().__init__()
        self.position_of: int | None = None
        self.fetches = 0
        self.assigning: asyncio.Task | None = None

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.position_of = offset

    async def end_offsets(self, tps) -> dict[TopicPartition, int]:
        return {TP: len(LOG)}

    async def position(self, tp: TopicPartition) -> int:
        return self.position_of if self.position_of is not None else 10

    async def commit(self, offsets) -> None:
        await asyncio.sleep(0)  # (a round trip to the broker: the listener begins meanwhile)

    async def getmany(self, timeout_ms=0, max_records=None):
        self.fetches += 1
        await asyncio.sleep(0)  # (a fetch yields: the flush in flight and the listener run)
        if self.assigning is None:
            self.assigning = asyncio.create_task(self.listener.on_partitions_assigned({TP}))
            return {TP: LOG[10:20]}  # from the committed offset, before the listener runs
        if self.position_of is not None and TP not in self._paused \
                and self.position_of < len(LOG):
            records, self.position_of = LOG[self.position_of:], len(LOG)
            return {TP: records}
        return {}


class _Noting(Journal):
    """The journal, noting each flush's commit as it begins and as it ends."""

    def __init__(self, store, run: str, commits: list) -> None:
        super().__init__(store, run)
        self.commits = commits

    def commit(self, flush_id, batch, ranges=None, run=None, written=()):
        self.commits.append(("begin", run or self.run, flush_id))
        handed = super().commit(flush_id, batch, ranges, run, written)
        self.commits.append(("end", run or self.run, flush_id))
        return handed


def test_the_unfinished_flush_is_written_before_any_flush_of_the_new_run(store, monkeypatch):
    Journal(store, "crashed-run").commit(1, _batch(LOG[:10]))  # its last finished flush
    crashed = Journal(store, "crashed-run")
    crashed.begin(CRASHED)
    crashed.write(CRASHED, _batch(LOG[10:20]))  # ... and the sink dies before the marks
    consumer, commits = _Restarted(), []

    async def read_ranges(bootstrap, catalog, ranges):
        async with asyncio.timeout(20):  # (the loop goes round while the broker answers)
            while consumer.fetches < ROUNDS:
                await asyncio.sleep(0.001)  # polls the fetches counted, under a deadline
        assert ranges == list(CRASHED.ranges)
        return _batch(LOG[10:20]), ranges

    monkeypatch.setattr("analytics.sink.read_ranges", read_ranges)
    monkeypatch.setattr(AnalyticsSink, "_new_consumer", lambda sink: consumer)

    async def scenario() -> None:
        sink = AnalyticsSink("127.0.0.1:1", CATALOG, store.location,
                             SinkSettings(max_batch_age_s=0.0, max_batch_records=5))
        sink._stop = asyncio.Event()
        sink.journal = _Noting(store, "new-run", commits)
        sink._next_flush_id = 3
        consuming = asyncio.create_task(sink._consume())
        async with asyncio.timeout(20):
            while await asyncio.to_thread(sink.journal.marks, [TP.topic]) != {
                    (TP.topic, TP.partition): len(LOG)}:
                await asyncio.sleep(0.01)  # polls the store's marks, under a deadline
        sink._stop.set()
        await consuming

    asyncio.run(scenario())
    assert commits[:2] == [("begin", "crashed-run", 2), ("end", "crashed-run", 2)], commits
    assert {run for _, run, _ in commits[2:]} == {"new-run"}
    assert consumer.fetches >= ROUNDS
    assert Journal(store, "check").state().pending == ()
    assert store.query("SELECT count(), uniqExact(kafka_offset), "
                       "(SELECT sum(events) FROM request_minute) FROM request_events").rows == [
        [len(LOG), len(LOG), len(LOG)]]
