"""How long a restarted router reads back what it follows before it takes requests again.

    python -m benchmarks.router_recovery [--requests 20000] [--chunks 10] [--bootstrap H:P]

Starts the embedded Kafka broker unless --bootstrap is given and writes, into a fresh namespace,
the history a router leaves behind: ``--requests`` finished requests spread over 16 workers
(``Queued``, ``Dispatch``, ``Started``, ``--chunks`` response chunks and ``Completed`` each), 100
more still streaming, and the workers' heartbeats. Then it times ``RouterService.take_over`` (the
read-back a restarted router does first) and checks that it holds exactly the 100 unfinished
requests, at the token offsets they had reached. Prints the events of the window read back per
second (the chunks of finished requests are skipped by key, not decoded).
"""

import argparse
import os
import time
import uuid

from benchmarks.router_throughput import main_with_broker
from controllers.router.service import RouterService, _queued
from infra.bus import Outbox, create_topics, delete_topics, make_producer, now_ms
from schemas.events import Completed, Started, WorkerStatus
from schemas.requests import Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicCatalog

WORKERS = 16
IN_FLIGHT = 100
ROUTER = "router-0"


def history(n: int, chunks: int, t: int):
    """(topic attribute, message, key) of ``n`` finished requests and ``IN_FLIGHT`` streaming."""
    for i in range(WORKERS):
        yield "telemetry", WorkerStatus(
            event_time_ms=t, worker_id=f"worker-{i}", slot=i, pool="h100@llama-3-8b",
            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=t), f"worker-{i}"
    for i in range(n + IN_FLIGHT):
        rid, slot = f"r{i}", i % WORKERS
        request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid,
                                   prompt_tokens=512, max_tokens=chunks * 8 + 1)
        yield "telemetry", _queued(request), rid
        yield "dispatch", Dispatch(event_time_ms=t, request=request, worker_id=f"worker-{slot}",
                                   slot=slot, router_id=ROUTER), rid
        yield "telemetry", Started(event_time_ms=t, request_id=rid,
                                   worker_id=f"worker-{slot}"), rid
        for c in range(chunks):
            yield "responses", ResponseChunk(event_time_ms=t, request_id=rid,
                                             worker_id=f"worker-{slot}", token_offset=8 * c,
                                             tokens=list(range(8))), rid
        if i < n:
            yield "telemetry", Completed(
                event_time_ms=t, request_id=rid, model="llama-3-8b", worker_id=f"worker-{slot}",
                prompt_tokens=512, output_tokens=chunks * 8 + 1, e2e_s=1.0), rid


async def run(bootstrap: str, n: int, chunks: int) -> dict:
    catalog = TopicCatalog(f"bench-{uuid.uuid4().hex[:8]}")
    await create_topics(bootstrap, catalog)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox, written = Outbox(producer), 0
        started = time.perf_counter()
        for topic, message, key in history(n, chunks, now_ms()):
            outbox.emit(getattr(catalog, topic), message, key,
                        message.slot if isinstance(message, Dispatch) else None)
            written += 1
            if written % 5_000 == 0:
                await outbox.flush()
                print(f"  written {written:,} events", end="\r", flush=True)
        await outbox.flush()
        print(f"  written {written:,} events in {time.perf_counter() - started:.1f} s")
        router = RouterService(bootstrap, catalog, router_id=ROUTER)
        cpu, wall = time.process_time(), time.perf_counter()
        follower = await router.take_over()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await follower.stop()
        in_flight = router.core.in_flight
        expected = {f"r{i}" for i in range(n, n + IN_FLIGHT)}
        assert set(in_flight) == expected, f"{len(in_flight)} in flight, expected {IN_FLIGHT}"
        assert all(f.tokens_done == chunks * 8 for f in in_flight.values())
        return {"events_in_window": written, "events_decoded": router.read_back,
                "read_back_s": round(wall, 2), "read_back_cpu_s": round(cpu, 2),
                "window_events_per_s": round(written / wall),
                "in_flight_recovered": len(in_flight),
                "load_1min": os.getloadavg()[0]}
    finally:
        await producer.stop()
        await delete_topics(bootstrap, catalog.topics())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    main_with_broker(args.bootstrap, lambda b: run(b, args.requests, args.chunks))


if __name__ == "__main__":
    main()
