"""Sink throughput: Kafka records to queryable rows, and the ingest lag on a live stream.

    python -m benchmarks.analytics_sink [--requests 100000] [--live-s 10] [--bootstrap HOST:PORT]
                                        [--default-gc]

1. Backlog: produces ``--requests`` synthetic requests (10 records each, ``analytics/synthetic.py``)
   to a fresh namespace, then starts the sink on a fresh embedded store and times it from the
   moment the store is open until every record is queryable: the store's offset marks reach the
   topics' end offsets, and the row count (no FINAL) equals the records produced. Target:
   at least 100,000 rows/s. The time includes the sink's start (joining its consumer group and
   seeking, about a second), so the default backlog (a million records) is large enough for the
   figure to be the sink's throughput rather than its start-up.
2. Live: produces at ``--rate`` records/s for ``--live-s`` seconds while the sink runs, then
   reports the lag from event time to insertion (``ingested - time``) at p50 and p99.

The sink runs with the cycle collector tuned as ``governor sink`` runs it
(``infra.runtime.tune_gc``), unless ``--default-gc``; the CPU seconds spent in collections are
reported. Without ``--bootstrap`` it starts the embedded broker (as ``governor demo`` does), then
stops it.
"""

import argparse
import asyncio
import gc
import os
import resource
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from analytics.progress import count_rows, wait_caught_up
from analytics.query import StoreSource
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import Store, StoreLocation
from analytics.synthetic import history, produce
from infra.bus import create_topics
from infra.runtime import tune_gc
from schemas.topics import TopicCatalog

LAG_SQL = """SELECT count(), quantiles(0.5, 0.99)(toUnixTimestamp64Milli(ingested)
                                               - toUnixTimestamp64Milli(time))
FROM request_events WHERE request_id LIKE 'live-%'"""


async def run(bootstrap: str, requests: int, live_s: float, rate: int, batch: int,
              default_gc: bool) -> None:
    catalog = TopicCatalog(f"bench-sink-{uuid.uuid4().hex[:8]}")
    await create_topics(bootstrap, catalog)
    records, expected = history(catalog, 0, requests, int(time.time() * 1000))
    began = time.perf_counter()
    await produce(bootstrap, records)
    produced = len(records)
    del records  # the sink's own process does not hold them
    print(f"produced {produced:,} records in {time.perf_counter() - began:.1f} s", flush=True)
    if not default_gc:
        tune_gc()  # as ``governor sink`` does

    directory = Path(tempfile.mkdtemp(prefix="governor-sink-bench-"))
    location = StoreLocation("bench", data_dir=directory / "chdb")
    sink = AnalyticsSink(bootstrap, catalog, location, SinkSettings(max_batch_records=batch))
    stop = asyncio.Event()
    running = asyncio.create_task(sink.run(stop))
    reader = None
    try:
        await sink.ready.wait()
        began, cpu_began = time.perf_counter(), _cpu_s()
        collections = _Collections()
        reader = StoreSource(Store.open(location, readonly=True))
        await wait_caught_up(bootstrap, catalog, reader, timeout_s=600)
        elapsed, cpu = time.perf_counter() - began, _cpu_s() - cpu_began
        collections.stop()
        rows = sum(count_rows(reader).values())
        verdict = "ok" if produced / elapsed >= 100_000 else "below target"
        print(f"backlog: {rows:,} rows queryable in {elapsed:.2f} s = "
              f"{produced / elapsed:,.0f} rows/s (target >= 100,000: {verdict}); "
              f"{cpu:.1f} CPU-s = {produced / cpu:,.0f} rows per CPU-second; "
              f"{sink.stats.flushes} flushes of up to {batch:,} records; "
              f"{collections.describe()}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        assert rows == produced == sum(expected.values()), "row count differs from records"
        if live_s > 0:
            await _live(bootstrap, catalog, reader, live_s, rate)
    finally:
        stop.set()
        await running
        if reader is not None:
            reader.close()
        shutil.rmtree(directory, ignore_errors=True)


async def _live(bootstrap, catalog, reader, live_s: float, rate: int) -> None:
    per_tick = max(1, rate // 10 // 10)  # requests (10 records each) per 0.1 s tick
    began, first, sent = time.monotonic(), 0, 0
    while time.monotonic() - began < live_s:
        tick = time.monotonic()
        records, _ = history(catalog, first, per_tick, int(time.time() * 1000), prefix="live")
        await produce(bootstrap, records)
        first, sent = first + per_tick, sent + len(records)
        await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))  # pace the load generator
    await wait_caught_up(bootstrap, catalog, reader, timeout_s=120)
    count, (p50, p99) = reader.query(LAG_SQL).rows[0]
    print(f"live: {sent / live_s:,.0f} records/s for {live_s:g} s; event time to insert lag over "
          f"{count:,} lifecycle rows: p50 {p50 / 1000:.2f} s, p99 {p99 / 1000:.2f} s", flush=True)


class _Collections:
    """The CPU time the cycle collector takes, in whichever thread runs it, until ``stop``."""

    def __init__(self) -> None:
        self.cpu_s, self.count, self._began = 0.0, 0, 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            self.cpu_s += time.thread_time() - self._began
            self.count += 1

    def stop(self) -> None:
        gc.callbacks.remove(self._observe)

    def describe(self) -> str:
        gen0, *_ = gc.get_threshold()
        return (f"{self.cpu_s:.2f} CPU-s in {self.count:,} cycle collections "
                f"(gen0 threshold {gen0:,})")


def _cpu_s() -> float:
    """CPU seconds of this process: the sink's loop, its insert threads and the engine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--live-s", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20_000, help="records/s in the live phase")
    parser.add_argument("--batch", type=int, default=SinkSettings().max_batch_records)
    parser.add_argument("--bootstrap", help="an existing broker; default: the embedded one")
    parser.add_argument("--default-gc", action="store_true",
                        help="keep CPython's default collector thresholds (no tune_gc)")
    args = parser.parse_args()
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from infra.kafka import BrokerSettings, EmbeddedKafka

        kafka = EmbeddedKafka(BrokerSettings())
        was_running = kafka.status().answers
        bootstrap = kafka.start()
    try:
        asyncio.run(run(bootstrap, args.requests, args.live_s, args.rate, args.batch,
                        args.default_gc))
    finally:
        if kafka is not None and not was_running:
            kafka.stop()


if __name__ == "__main__":
    main()
