"""The streams agents' own CPU per telemetry event, without a broker.

    python -m benchmarks.streams_hotpath [--requests 15000] [--batch 5000] [--profile]

Runs the real agents of ``streams.app.StreamsApp`` (ingest, tasks, windows) over in-memory
batches of raw telemetry records: a stand-in for Faust's stream hands them batches, a stand-in
producer acknowledges at once and queues what they send for the next agent. What it measures is
the app's own work per event (decoding, the stages, repartition and changelog encoding), not
Faust's or aiokafka's; ``benchmarks.streams_throughput`` measures the whole worker on a broker.
Prints one JSON object (µs of CPU per lifecycle event, and the load average). Like the worker,
it tunes the cycle collector (``infra.runtime.tune_gc``) unless ``--default-gc``.
"""

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.runtime import tune_gc
from schemas.codec import encode
from schemas.events import WorkerStatus
from streams.app import StreamsApp
from streams.stages import partition_of
from streams.synthetic import synthetic_telemetry
from streams.worker import settings_for


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass
class _Event:
    message: _Message


class _Batches:
    """What ``take_events`` would yield: the given batches, then the end of the stream."""

    def __init__(self, batches: list[list[_Event]]) -> None:
        self.batches = batches

    async def take_events(self, _max: int, _within: float):
        for batch in self.batches:
            yield batch


class _Producer:
    """Acknowledges every send at once; keeps what was sent to each topic, in order."""

    def __init__(self) -> None:
        self.sent: dict[str, list[tuple[bytes | None, bytes | None, int]]] = defaultdict(list)
        self.done = asyncio.get_running_loop().create_future()
        self.done.set_result(None)

    async def send(self, topic, key, value, partition, _timestamp, _headers) -> Any:
        self.sent[topic].append((key, value, partition))
        return self.done

    def _ensure_producer(self) -> "_Producer":  # Faust's producer service: aiokafka's within
        return self

    def add_topic(self, _topic: str) -> None:  # aiokafka's client, which tracks topics
        pass

    @property
    def client(self) -> "_Producer":
        return self


def _batches(topic: str, records: list[tuple[bytes | None, bytes, int]], size: int,
             offsets: dict) -> list[list[_Event]]:
    events = []
    for key, value, partition in records:
        offset = offsets[(topic, partition)]
        offsets[(topic, partition)] += 1
        events.append(_Event(_Message(topic, partition, offset, key, value)))
    return [events[i:i + size] for i in range(0, len(events), size)]


async def run_agents(streams: StreamsApp, telemetry: list, batch: int) -> None:
    """Run the app's agents over ``(key, value, partition)`` telemetry records in batches of
    ``batch``, then over what each stage sent the next, until nothing is left."""
    producer = _Producer()
    streams.app._producer = producer  # the app's ``producer`` property returns this
    names, offsets = streams.names, defaultdict(int)
    pending = {streams.catalog.telemetry: telemetry}
    agents = {streams.catalog.telemetry: streams._ingest_agent, names["worker"]: streams._ingest_agent,
              names["task"]: streams._task_agent, names["scope"]: streams._window_agent}
    while pending:
        for topic, records in pending.items():
            await agents[topic](_Batches(_batches(topic, records, batch, offsets)))
        pending = {topic: producer.sent.pop(topic) for topic in agents if producer.sent.get(topic)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=15_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile")
    parser.add_argument("--default-gc", action="store_true",
                        help="keep CPython's default collector thresholds (no tune_gc)")
    args = parser.parse_args()
    settings = settings_for("hotpath", "127.0.0.1:1")
    # stamped to end before now: the streams dead-letter events stamped more than
    # max_event_ahead_s ahead of their clock (the stream spans args.requests ms and 2.3 s more)
    start = int(time.time() * 1000) - args.requests - 5_000
    messages, counts = synthetic_telemetry(start, args.requests, workers=8, spacing_ms=1,
                                           prefix="hp")
    telemetry = []
    for m in messages:
        key = m.worker_id if isinstance(m, WorkerStatus) else m.request_id
        telemetry.append((key.encode(), encode(m), partition_of(key, settings.partitions)))
    del messages
    with tempfile.TemporaryDirectory() as datadir:
        streams = StreamsApp(settings, datadir=Path(datadir))
    if not args.default_gc:
        tune_gc()  # as the worker does
    profile = cProfile.Profile() if args.profile else None
    started = time.process_time()
    if profile:
        profile.enable()
    asyncio.run(run_agents(streams, telemetry, args.batch))
    if profile:
        profile.disable()
    cpu_s = time.process_time() - started
    fleet = streams.tables["windows"].data.get("fleet:all|total")
    print(json.dumps({
        "lifecycle_events": counts.lifecycle_events,
        "records_incl_heartbeats": len(telemetry),
        "fleet_events_counted": fleet["b"]["c"].get("events") if fleet else None,
        "cpu_s": round(cpu_s, 3),
        "us_per_event": round(cpu_s / counts.lifecycle_events * 1e6, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }, indent=2))
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
