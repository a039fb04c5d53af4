"""What workers gone for good cost the streams' worker table and each tick's fleet view.

    python -m benchmarks.streams_gone_workers [--gone 10000] [--live 8]

A deployment whose worker ids change at each restart (pods): ``--gone`` workers, one a second,
each heard twice and then silent, and ``--live`` workers heart-beating past the worker table's
retention (``RETENTION_S``) after them, through ``streams.pipeline.Pipeline``. Prints one JSON
object a line: the table before its sweep (every worker, as the table kept them all before 6 Dec
2026) and after it (the gone ones deleted): its entries, their encoded bytes (what the changelog
holds and a restart reads again), the CPU of one tick's fleet view and of one sweep of the
workers (every 5 s of event time), in ms, and the workers the fleet view publishes.
"""

import argparse
import json
import time

import orjson

from schemas.events import WorkerStatus
from streams.pipeline import Pipeline
from streams.signals.workers import RETENTION_S

T = 1_700_000_000_000


def _heartbeat(worker: str, t: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=t, worker_id=worker, slot=0, pool="h100@m",
                        gpu_type="h100", models_loaded=["m"], running=1, state="warm",
                        started_ms=0)


def _cpu_ms(call, repeats: int = 20) -> float:
    started = time.process_time()
    for _ in range(repeats):
        call()
    return round((time.process_time() - started) / repeats * 1000, 3)


def _measure(pipeline: Pipeline, when: str, now: int) -> dict:
    stages, table = pipeline.stages, pipeline.tables["workers"]
    return {"table": when, "entries": len(table),
            "entry_bytes": sum(len(orjson.dumps(v)) for v in table.values()),
            "fleet_view_ms": _cpu_ms(lambda: stages.fleet_view(None, now)),
            "workers_sweep_ms": _cpu_ms(lambda: stages.worker_book.sweep(list(table), 0)),
            "published": len(stages.fleet_view(None, now))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gone", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=8)
    args = parser.parse_args()
    pipeline = Pipeline()
    for i in range(args.gone):
        t = T + i * 1000
        pipeline.send(_heartbeat(f"pod-{i}", t), _heartbeat(f"pod-{i}", t + 500))
    end = T + args.gone * 1000 + int(RETENTION_S * 1000) + 60_000
    for j in range(args.live):
        pipeline.send(*[_heartbeat(f"live-{j}", end - 10_000 + k * 500) for k in range(21)])
    print(json.dumps(_measure(pipeline, "kept", end)), flush=True)
    pipeline.sweep(end)
    print(json.dumps(_measure(pipeline, "swept", end)), flush=True)


if __name__ == "__main__":
    main()
