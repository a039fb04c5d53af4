"""A sink stopped while the store fails a flush starts no later flush: the failed one stays
pending, with nothing past its records, and is written at the next start.

Before 5 Dec the stop ended the failed flush's retries, and the sink then flushed the batch it
held: that flush moved the store's offset marks (and Kafka's) past the failed flush's records,
and the next run took the pending flush for written and dropped its records.
"""

import asyncio

from aiokafka import TopicPartition

from analytics.journal import Journal
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import StoreError
from schemas.topics import TopicCatalog
from tests.unit.analytics.fake_kafka import OnePartition, queued

CATALOG = TopicCatalog("unit")
TP = TopicPartition(CATALOG.telemetry, 0)


class _FailingFirstFlush(Journal):
    """The store takes the journal's intent of flush 1, then fails its insert; the operator
    stops the sink meanwhile."""

    def __init__(self, store, run: str, stop: asyncio.Event) -> None:
        super().__init__(store, run)
        self.stop, self.loop = stop, asyncio.get_running_loop()

    def write(self, flush, batch) -> int:
        if flush.flush_id == 1:
            self.loop.call_soon_threadsafe(self.stop.set)
            raise StoreError("insert into request_events failed: TOO_MANY_PARTS")
        return super().write(flush, batch)


def test_a_sink_stopped_while_a_flush_fails_flushes_nothing_after_it(store):
    consumer = OnePartition(TP, [queued(TP, 0, 9), queued(TP, 10, 19)])

    class Sink(AnalyticsSink):
        def _new_consumer(self):
            return consumer

    async def scenario() -> Sink:
        sink = Sink("127.0.0.1:1", CATALOG, store.location,
                    SinkSettings(max_batch_records=10, retry_initial_s=5.0))
        sink._stop = asyncio.Event()
        sink.journal = _FailingFirstFlush(store, "run-1", sink._stop)
        sink._next_flush_id = 1
        async with asyncio.timeout(30):
            await sink._consume()
        return sink

    sink = asyncio.run(scenario())
    assert sink.stats.flushes == 0
    assert sink.journal.marks([TP.topic]) == {}  # nothing past flush 1's records
    assert store.query("SELECT count() FROM request_events").rows == [[0]]
    assert max(consumer.commits) == 0  # Kafka's offset never past them either
    (pending,) = Journal(store, "run-2").state().pending
    assert (pending.run, pending.flush_id) == ("run-1", 1)
    assert [(r.first, r.last) for r in pending.ranges] == [(0, 9)]  # written in full next start
