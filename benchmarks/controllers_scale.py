"""The controllers process's CPU per round of heartbeats, against the fleet's size.

    python -m benchmarks.controllers_scale [--workers 64,256,1024,2048] [--rounds 8]

Every worker heart-beats every 0.5 s, so a round of heartbeats must take the controllers well
under half a second of CPU. No broker: ``ControllersService.observe`` and ``tick`` (breakers,
shedding, routing weights, the autoscaler) on ``WorkerStatus``es of one pool, every worker
running 32 sequences. Prints the CPU seconds per round (observe) and per tick, after two rounds
of warm-up.
"""

import argparse
import time

from controllers.service import ControllersService
from schemas.config import GovernorConfig
from schemas.events import WorkerStatus
from schemas.topics import TopicCatalog

T0 = 1_800_000_000_000
ROUND_MS = 500


def status(i: int, at_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id=f"w{i}", slot=i % 32,
                        pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                        running=32, waiting=2, itl_ms=20.0 + i % 7, kv_blocks_used=5_000,
                        kv_blocks_free=5_000, prefill_backlog_tokens=1_000, started_ms=T0)


def measure(workers: int, rounds: int) -> tuple[float, float]:
    """CPU seconds per round of heartbeats and per tick, the first two rounds left out."""
    controllers = ControllersService("127.0.0.1:1", TopicCatalog("governor"),
                                     config=GovernorConfig(autoscaler={"enabled": True}))
    observe = tick = 0.0
    for r in range(rounds):
        at = T0 + r * ROUND_MS
        beats = [status(i, at) for i in range(workers)]
        started = time.process_time()
        for beat in beats:
            controllers.observe(beat, at)
        observed = time.process_time()
        controllers.tick(at + ROUND_MS // 2, restate=False)
        if r >= 2:
            observe += observed - started
            tick += time.process_time() - observed
    return observe / (rounds - 2), tick / (rounds - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="64,256,1024,2048",
                        help="fleet sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of heartbeats (at least 3)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds must be at least 3, got {args.rounds}")
    try:
        sizes = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers must be whole numbers separated by commas, got {args.workers!r}")
    for n in sizes:
        observe, tick = measure(n, args.rounds)
        print(f"{n:>5} workers: {observe * 1000:7.1f} ms of CPU per round of heartbeats "
              f"({observe / n * 1e6:5.1f} us each, {observe / (ROUND_MS / 1000):.0%} of a core), "
              f"tick {tick * 1000:5.1f} ms")


if __name__ == "__main__":
    main()
