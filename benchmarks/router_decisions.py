"""Per-request decision latency of the router core (admission + seven-axis placement).

    python -m benchmarks.router_decisions [--workers 256] [--requests 20000] [--gone 100000]

A fleet of N warm workers (mixed A100/H100/H200) with KV block events; requests with Mooncake-
like prefix chains; heartbeats arrive every 0.5 s of simulated time, and the router's
resumption tick runs once a second. Prints p50/p99/max of the time ``RouterCore.route`` takes.
Target: p99 under 1 ms with 256 workers. ``--gone N``: N more workers, each under an id of its
own, stopped two minutes before the run (restarted pods, or forged heartbeats).
"""

import argparse
import random
import time

import numpy as np

from benchmarks import positive_int
from controllers.router.core import RouterCore
from controllers.router.policies import POLICIES
from schemas.events import KvBlocksStored, Started, WorkerStatus
from schemas.requests import InferenceRequest

GPUS = ("a100", "h100", "h200")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=positive_int, default=256)
    parser.add_argument("--requests", type=positive_int, default=20_000)
    parser.add_argument("--policy", default="governor", choices=sorted(POLICIES))
    parser.add_argument("--gone", type=int, default=0, help="workers stopped before the run")
    args = parser.parse_args()
    rng = random.Random(0)
    from schemas.config import GovernorConfig

    core = RouterCore(GovernorConfig(routing_policy=args.policy))
    t = 1_800_000_000_000

    def heartbeat(now: int) -> None:
        for i in range(args.workers):
            gpu = GPUS[i % 3]
            core.observe(WorkerStatus(
                event_time_ms=now, worker_id=f"w{i}", slot=i % 32, pool=f"{gpu}@llama-3-8b",
                gpu_type=gpu, models_loaded=["llama-3-8b"], running=rng.randint(0, 64),
                waiting=rng.randint(0, 8), kv_blocks_used=rng.randint(0, 20_000),
                kv_blocks_free=8_000, started_ms=now - 60_000), now)

    for i in range(args.gone):
        at = t - 120_000
        core.observe(WorkerStatus(
            event_time_ms=at, worker_id=f"gone-{i}", slot=i % 32, pool="h100@llama-3-8b",
            gpu_type="h100", models_loaded=["llama-3-8b"], running=0, waiting=0,
            state="stopped", started_ms=at - 60_000), at)
    heartbeat(t)
    for i in range(args.workers):  # each worker caches a few conversation prefixes
        for conv in range(4):
            core.observe(KvBlocksStored(event_time_ms=t, worker_id=f"w{i}", block_size=512,
                                        block_hashes=[0, 1000 * (i * 4 + conv) + 1,
                                                      1000 * (i * 4 + conv) + 2]), t)
    latencies = []
    for n in range(args.requests):
        now = t + n * 2  # 500 requests/s
        if n % 250 == 0:
            heartbeat(now)
        if n % 500 == 0:
            core.resume(now)
        conv = rng.randrange(args.workers * 4)
        blocks = [0, 1000 * conv + 1, 1000 * conv + 2, 1000 * conv + 3][: rng.randint(1, 4)]
        request = InferenceRequest(
            event_time_ms=now, created_ms=now, request_id=f"r{n}", prompt_tokens=512 * len(blocks),
            prefix_hashes=blocks, block_size=512, max_tokens=200, priority=rng.randint(0, 9),
            deadline_ms=now + 30_000)
        start = time.perf_counter()
        decision = core.route(request, now)
        latencies.append(time.perf_counter() - start)
        if decision.dispatch is not None:
            core.observe(Started(event_time_ms=now, request_id=request.request_id,
                                 worker_id=decision.dispatch.worker_id), now)
    ms = np.array(latencies) * 1000
    print(f"policy {args.policy}, {args.workers} workers (and {args.gone} gone), "
          f"{args.requests} requests; workers known at the end: {len(core.fleet)}")
    print(f"decision latency ms: p50 {np.percentile(ms, 50):.3f}  p99 {np.percentile(ms, 99):.3f}  "
          f"max {ms.max():.3f}  mean {ms.mean():.3f}")


if __name__ == "__main__":
    main()
