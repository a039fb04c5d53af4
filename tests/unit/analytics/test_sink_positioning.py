"""A sink given partitions positions them only once their unfinished flushes are in the store.

The broker here is a port that refuses connections (a broker restarting): reading the records of
another run's unfinished flush fails, and the sink retries it with backoff, keeping the
partitions paused and starting no flush, rather than resuming them from Kafka's committed
offsets (before that flush: its records were then written again under a new token and the
summing rollups counted them twice).
"""

import asyncio
import socket

from aiokafka import AIOKafkaConsumer, TopicPartition

from analytics.batch import OffsetRange
from analytics.journal import Flush, Journal
from analytics.sink import AnalyticsSink, SinkSettings, _Listener
from schemas.topics import TopicCatalog

FAST = SinkSettings(retry_initial_s=0.01, retry_max_s=0.01)


async def _assigned_while_the_broker_refuses(store, bootstrap: str, retried):
    catalog = TopicCatalog("unit")
    tp = TopicPartition(catalog.telemetry, 0)
    crashed = Flush("crashed-run", 1, (OffsetRange(tp.topic, tp.partition, 0, 9),))
    Journal(store, crashed.run).begin(crashed)
    sink = AnalyticsSink(bootstrap, catalog, store.location, FAST)
    sink.journal, sink._stop = Journal(store, "survivor-run"), asyncio.Event()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)  # not started: only holds partitions
    consumer.assign([tp])
    try:
        assigning = asyncio.create_task(_Listener(sink, consumer).on_partitions_assigned({tp}))
        async with asyncio.timeout(30):
            while not assigning.done() and retried() < 3:
                await asyncio.sleep(0.01)  # polling a condition under a deadline
        sink._stop.set()
        await assigning
        return sink, consumer.paused(), crashed
    finally:
        await consumer.stop()


def test_a_failed_read_of_an_unfinished_flush_is_retried_with_its_partitions_paused(store, caplog):
    def retried() -> int:
        return sum("records of the unfinished flush crashed-run:1 failed" in r.getMessage()
                   for r in caplog.records)

    with socket.socket() as refusing:  # bound, never listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        bootstrap = "%s:%d" % refusing.getsockname()
        sink, paused, crashed = asyncio.run(
            _assigned_while_the_broker_refuses(store, bootstrap, retried))
    assert sink.stats.kafka_failures >= 3
    assert "reading the records of the unfinished flush crashed-run:1" in sink.stats.last_error
    assert paused == {TopicPartition("unit.telemetry", 0)}  # never resumed unplaced
    assert sink._assigning  # so no flush starts
    assert sink.journal.state().pending == (crashed,)


def test_a_sink_that_cannot_position_its_partitions_stops_rather_than_idle(store):
    """An exception the retries do not wait out left the partitions paused and the sink storing
    nothing, looking healthy (aiokafka logs a listener's exception and carries on)."""
    import pytest

    async def scenario():
        catalog = TopicCatalog("unit")
        tp = TopicPartition(catalog.telemetry, 0)
        sink = AnalyticsSink("127.0.0.1:1", catalog, store.location, FAST)
        sink._stop = asyncio.Event()

        async def broken(consumer, assigned):
            raise ValueError("a bug")

        sink._seek_to_marks = broken
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")  # not started
        consumer.assign([tp])
        try:
            with pytest.raises(ValueError, match="a bug"):
                await _Listener(sink, consumer).on_partitions_assigned({tp})
        finally:
            await consumer.stop()
        return sink

    sink = asyncio.run(scenario())
    assert sink._stop.is_set() and isinstance(sink.failed, ValueError)
