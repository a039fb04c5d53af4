"""Requests per second through one router process on the real broker.

    python -m benchmarks.router_throughput [--requests 5000] [--workers 16] [--bootstrap H:P]

Starts the embedded Kafka broker unless --bootstrap is given, creates a fresh namespace, runs
`governor router` as its own process, keeps 16 workers' heartbeats flowing (this process plays
their status; no engine runs, so the router's own throughput is what is measured), produces the
requests as fast as the producer can, and times until every request has its Queued (or Rejected)
event. Prints requests/s and the produce-to-queued latency percentiles.
"""

import argparse
import asyncio
import subprocess
import sys
import time
import uuid

import numpy as np
from aiokafka import AIOKafkaConsumer

from infra.bus import Outbox, TypedConsumer, create_topics, delete_topics, make_producer, now_ms
from schemas.events import Queued, Rejected, WorkerStatus
from schemas.requests import InferenceRequest
from schemas.topics import TopicCatalog


async def heartbeats(outbox: Outbox, catalog: TopicCatalog, workers: int, stop: asyncio.Event):
    while not stop.is_set():
        t = now_ms()
        for i in range(workers):
            outbox.emit(catalog.telemetry, WorkerStatus(
                event_time_ms=t, worker_id=f"worker-{i}", slot=i, pool="h100@llama-3-8b",
                gpu_type="h100", models_loaded=["llama-3-8b"], kv_blocks_used=100,
                kv_blocks_free=20_000, prefill_backlog_tokens=0, started_ms=t), f"worker-{i}")
        await outbox.flush()
        await asyncio.sleep(0.5)  # the heartbeat period


async def run(bootstrap: str, n: int, workers: int) -> dict:
    catalog = TopicCatalog(f"bench-{uuid.uuid4().hex[:8]}")
    await create_topics(bootstrap, catalog)
    router = subprocess.Popen([sys.executable, "-m", "infra.cli", "router", "--bootstrap", bootstrap,
                               "--namespace", catalog.namespace], stdin=subprocess.DEVNULL)
    producer = make_producer(bootstrap)
    await producer.start()
    consumer = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    stop = asyncio.Event()
    beats = asyncio.create_task(heartbeats(Outbox(producer), catalog, workers, stop))
    typed = TypedConsumer(consumer, catalog, producer, "bench")
    try:
        # Warm up: one request through, so the router has joined its group and seen the fleet.
        sent_at: dict[str, float] = {}
        answered: dict[str, float] = {}
        outbox = Outbox(producer)

        def send(rid: str) -> None:
            t = now_ms()
            outbox.emit(catalog.requests, InferenceRequest(
                event_time_ms=t, created_ms=t, request_id=rid, prompt_tokens=512,
                max_tokens=64), rid)
            sent_at[rid] = time.perf_counter()

        async def until(count: int, timeout_s: float = 120) -> None:
            async with asyncio.timeout(timeout_s):
                while len(answered) < count:
                    for item in await typed.fetch(100):
                        m = item.message
                        if isinstance(m, (Queued, Rejected)) and m.request_id in sent_at:
                            answered.setdefault(m.request_id, time.perf_counter())

        send("warmup")
        await outbox.flush()
        await until(1, 90)
        start = time.perf_counter()
        for i in range(n):
            send(f"r{i}")
            if i % 500 == 499:
                await outbox.flush()
        await outbox.flush()
        await until(n + 1)
        elapsed = max(answered.values()) - start
        lat = np.array([answered[r] - sent_at[r] for r in answered if r != "warmup"]) * 1000
        return {"requests": n, "seconds": round(elapsed, 2), "requests_per_s": round(n / elapsed),
                "queued_latency_ms_p50": round(float(np.percentile(lat, 50)), 1),
                "queued_latency_ms_p99": round(float(np.percentile(lat, 99)), 1)}
    finally:
        stop.set()
        await beats
        router.terminate()
        router.wait(timeout=30)
        await consumer.stop()
        await producer.stop()
        await delete_topics(bootstrap, catalog.topics())


def main_with_broker(bootstrap: str | None, run_on) -> None:
    """Print what ``run_on(bootstrap)`` returns, on ``bootstrap`` or else on the embedded broker
    (started for the run unless it is already running)."""
    kafka = None
    if bootstrap is None:
        from infra.kafka import EmbeddedKafka

        kafka = EmbeddedKafka()
        was_running = kafka.status().answers
        bootstrap = kafka.start()
    try:
        for key, value in asyncio.run(run_on(bootstrap)).items():
            print(f"{key:24} {value}")
    finally:
        if kafka is not None and not was_running:
            kafka.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    main_with_broker(args.bootstrap, lambda b: run(b, args.requests, args.workers))


if __name__ == "__main__":
    main()
