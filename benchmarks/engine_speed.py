"""Speed of the simulated engine: replay a trace on a fleet of simulated GPUs in virtual time.

    python -m benchmarks.engine_speed [--trace PATH] [--gpus 16] [--gpu h100] [--limit N]

Round-robin placement, no Kafka, no wall clock inside the engines. Prints requests per wall
second, engine steps, prefix-cache hit rate, preemptions and TTFT percentiles. The goal the
offline simulator is held to: the 12k-request Mooncake trace on 16 GPUs in under 20 s on one core.
"""

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import positive_int
from infra.traces import load_trace
from workers.engine import EngineRequest
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.perf import PerfModel

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared/data/traces/mooncake_fast25/conversation_trace.jsonl"


def run(trace: Path, gpus: int, gpu: str, limit: int | None) -> dict:
    perf = PerfModel.load(gpu, "llama-3-8b")
    engines = [SimEngine(perf, SimEngineConfig(emit_tokens=False)) for _ in range(gpus)]
    items = list(load_trace(trace, limit=limit))
    arrival: dict[str, float] = {}
    ttft: list[float] = []
    done = 0
    start = time.perf_counter()

    def collect(engine: SimEngine, now: float) -> None:
        nonlocal done
        for batch in engine.advance(now):
            if batch.first_token_s is not None:
                ttft.append(batch.first_token_s - arrival[batch.request_id])
            done += batch.finished

    for i, item in enumerate(items):
        rid = f"r{i}"
        arrival[rid] = item.arrival_s
        for engine in engines:
            collect(engine, item.arrival_s)
        engines[i % gpus].add(EngineRequest(
            request_id=rid, prompt_tokens=item.prompt_tokens, max_tokens=max(item.output_tokens, 1),
            prefix_hashes=item.hash_ids, hash_block_size=item.block_size), item.arrival_s)
    for engine in engines:
        while (due := engine.next_event_s()) is not None:
            collect(engine, due)
    wall = time.perf_counter() - start
    queries = sum(e.kv.queries_tokens for e in engines)
    hits = sum(e.kv.hits_tokens for e in engines)
    return {
        "requests": len(items), "completed": done, "wall_s": round(wall, 2),
        "requests_per_wall_s": round(len(items) / wall),
        "engine_steps": sum(e.steps for e in engines),
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else 0.0,
        "preemptions": sum(e.preemptions for e in engines),
        "ttft_p50_s": round(float(np.quantile(ttft, 0.5)), 3),
        "ttft_p99_s": round(float(np.quantile(ttft, 0.99)), 3),
        "simulated_s": round(max(e.t for e in engines), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=MOONCAKE)
    parser.add_argument("--gpus", type=positive_int, default=16)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--limit", type=positive_int, default=None)
    args = parser.parse_args()
    if not args.trace.exists():
        raise SystemExit(f"trace not found: {args.trace} (pass --trace)")
    try:
        PerfModel.load(args.gpu, "llama-3-8b")
    except ValueError as exc:
        parser.error(f"--gpu: {exc}")
    for key, value in run(args.trace, args.gpus, args.gpu, args.limit).items():
        print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
