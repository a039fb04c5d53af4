"""A stopped sink reads its partitions on to the end offsets they had at the stop, and stores
what it read: the records written just before the stop (a stack's workers' final heartbeats,
``Stack.stop``). Before 6 Dec it wrote what it had read by then and exited, and those records
waited for its next start."""

import asyncio

from aiokafka import TopicPartition

from analytics.journal import Journal
from analytics.sink import AnalyticsSink, SinkSettings
from schemas.topics import TopicCatalog
from tests.unit.analytics.fake_kafka import OnePartition, queued

CATALOG = TopicCatalog("unit")
TP = TopicPartition(CATALOG.telemetry, 0)


class _StoppedAfterFirstFetch(OnePartition):
    """The sink is stopped right after its first fetch, the second already on the broker."""

    def __init__(self, stop: asyncio.Event) -> None:
        super().__init__(TP, [queued(TP, 0, 9), queued(TP, 10, 19)])
        self.stopping = stop

    async def getmany(self, timeout_ms=0, max_records=None):
        fetched = await super().getmany(timeout_ms, max_records)
        self.stopping.set()
        return fetched


def _consumed(store, settings: SinkSettings) -> AnalyticsSink:
    stop = asyncio.Event()
    consumer = _StoppedAfterFirstFetch(stop)

    class Sink(AnalyticsSink):
        def _new_consumer(self):
            return consumer

    async def scenario() -> Sink:
        sink = Sink("127.0.0.1:1", CATALOG, store.location, settings)
        sink._stop = stop
        sink.journal = Journal(store, "run-1")
        sink._next_flush_id = 1
        async with asyncio.timeout(30):
            await sink._consume()
        return sink

    return asyncio.run(scenario())


def test_a_stopped_sink_stores_what_its_partitions_held_at_the_stop(store):
    _consumed(store, SinkSettings())
    assert store.query("SELECT count() FROM request_events").rows == [[20]]
    assert Journal(store, "run-2").marks([TP.topic]) == {(TP.topic, 0): 20}


def test_a_stopped_sink_reads_on_no_longer_than_its_stop_drain(store):
    _consumed(store, SinkSettings(stop_drain_s=0.0))
    assert store.query("SELECT count() FROM request_events").rows == [[10]]
