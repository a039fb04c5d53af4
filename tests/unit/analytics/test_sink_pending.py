"""The sink says what it holds that the store does not (``governor_sink_pending_records``) and
when its last flush landed (``governor_sink_last_flush_timestamp_seconds``): while the store
fails, the records it read wait and the last flush ages; once the store is back, both clear.

Before 6 Dec neither was served: a sink whose store failed for an hour showed its failures
counted and ``store_ok`` 0, but nothing of how much waited, and a sink stuck in some other way
(holding its flush while a rebalance never settled) showed nothing at all."""

import asyncio
import threading
import time

from aiokafka import TopicPartition

from analytics.journal import Journal
from analytics.metrics import sink_registry
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import StoreError
from schemas.topics import TopicCatalog
from tests.unit.analytics.fake_kafka import OnePartition, queued

CATALOG = TopicCatalog("unit")
TP = TopicPartition(CATALOG.telemetry, 0)


class _FailingWhile(Journal):
    """The store fails every write while ``failing`` is set."""

    def __init__(self, store, run: str) -> None:
        super().__init__(store, run)
        self.failing = threading.Event()
        self.failing.set()

    def write(self, flush, batch) -> int:
        if self.failing.is_set():
            raise StoreError("insert into request_events failed: TOO_MANY_PARTS")
        return super().write(flush, batch)


async def _until(condition, what: str, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)  # polls the sink's stats until the deadline
    assert condition(), what


def test_the_sink_serves_what_waits_for_the_store_and_when_it_last_flushed(store):
    consumer = OnePartition(TP, [queued(TP, 0, 9), queued(TP, 10, 19)])

    class Sink(AnalyticsSink):
        def _new_consumer(self):
            return consumer

    async def scenario() -> tuple[dict, dict, float]:
        sink = Sink("127.0.0.1:1", CATALOG, store.location,
                    SinkSettings(max_batch_records=10, retry_initial_s=0.05, retry_max_s=0.1))
        sink._stop = asyncio.Event()
        sink.journal = _FailingWhile(store, "run-1")
        sink._next_flush_id = 1
        value = sink_registry(lambda: sink.stats).get_sample_value

        def sample() -> dict:
            return {name: value(f"governor_sink_{name}") for name in (
                "pending_records", "last_flush_timestamp_seconds", "flushes_total")}

        consuming = asyncio.create_task(sink._consume())
        # the first ten in a flush the store fails, the next ten in a full batch behind it
        await _until(lambda: sink.stats.store_failures >= 2 and sample()["pending_records"] == 20,
                     "twenty records waiting for the failing store")
        failing = sample()
        back = time.time()
        sink.journal.failing.clear()
        await _until(lambda: sample()["flushes_total"] == 2 and sample()["pending_records"] == 0,
                     "both flushes landed")
        landed = sample()
        sink._stop.set()
        await consuming
        return failing, landed, back

    failing, landed, back = asyncio.run(scenario())
    assert failing == {"pending_records": 20, "last_flush_timestamp_seconds": 0,
                       "flushes_total": 0}
    assert landed["pending_records"] == 0
    assert back <= landed["last_flush_timestamp_seconds"] <= time.time()
