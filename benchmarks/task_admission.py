"""Cost of task admission per new task while the fleet is overloaded, as its window fills.

    python -m benchmarks.task_admission [--rate 1000] [--seconds 30] [--workers 8] [--similar]

New tasks of 2-12 steps (prompts 200-2,000 tokens, answers 50-500, priorities 0-9) start at
``--rate`` a second of simulated time on ``--workers`` H100s, far more work than they do, so
every task is ranked against the window (the path that costs most). Prints the microseconds a
call of ``TaskAdmission.admit`` takes as the 30 s window fills, and the share refused.
``--similar``: every task of one template (6 steps, prompts 900-1,100 tokens, answers of 200,
priority 5), as an agent platform running one workflow sends them: a few work buckets hold the
whole window.
"""

import argparse
import random
import time

import numpy as np

from controllers.router.fleet import WorkerView
from controllers.router.task_admission import TaskAdmission
from schemas.requests import InferenceRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1_000.0, help="new tasks per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="simulated seconds")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--similar", action="store_true", help="tasks of one template")
    args = parser.parse_args()
    rng = random.Random(0)
    workers = [WorkerView(worker_id=f"w{i}", slot=i, pool="h100@llama-3-8b", gpu_type="h100",
                          models=("llama-3-8b",), running=0, waiting=0, last_seen_ms=0)
               for i in range(args.workers)]
    gate = TaskAdmission()
    n = int(args.rate * args.seconds)
    t0 = 1_800_000_000_000
    times, refused = [], 0
    for i in range(n):
        now = t0 + int(i * 1000 / args.rate)
        request = InferenceRequest(
            event_time_ms=now, created_ms=now, request_id=f"r{i}", task_id=f"t{i}", step=1,
            model="llama-3-8b", **(_similar(rng) if args.similar else _mixed(rng)))
        started = time.perf_counter()
        refused += gate.admit(request, workers, now) is not None
        times.append(time.perf_counter() - started)
    us = np.array(times) * 1e6
    kind = "similar" if args.similar else "mixed"
    print(f"{n} {kind} tasks at {args.rate:g}/s on {args.workers} H100s; {refused / n:.0%} refused")
    for label, part in (("first second", us[: int(args.rate)]), ("last second", us[-int(args.rate):]),
                        ("all", us)):
        print(f"  {label:>12}: p50 {np.percentile(part, 50):7.1f} us   "
              f"p99 {np.percentile(part, 99):7.1f} us")


def _mixed(rng: random.Random) -> dict:
    return {"steps_total": rng.randint(2, 12), "priority": rng.randrange(10),
            "prompt_tokens": rng.randint(200, 2_000), "max_tokens": rng.randint(50, 500)}


def _similar(rng: random.Random) -> dict:
    return {"steps_total": 6, "priority": 5, "prompt_tokens": rng.randint(900, 1_100),
            "max_tokens": 200}


if __name__ == "__main__":
    main()
