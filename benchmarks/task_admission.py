"""Cost of task admission per new task while the fleet is overloaded, as its window fills.

    python -m benchmarks.task_admission [--rate 1000] [--seconds 30] [--workers 8] [--similar]
                                        [--gap S]

New tasks of 2-12 steps (prompts 200-2,000 tokens, answers 50-500, priorities 0-9) start at
``--rate`` a second of simulated time on ``--workers`` H100s, far more work than they do, so
every task is ranked against the window (the path that costs most). Prints the microseconds a
call of ``TaskAdmission.admit`` takes as the 30 s window fills, and the share refused.
``--similar``: every task of one template (6 steps, prompts 900-1,100 tokens, answers of 200,
priority 5), as an agent platform running one workflow sends them: a few work buckets hold the
whole window. ``--gap S``: each task's second step comes ``S`` seconds (jittered) after its
first, as a later step (the gap between steps measured, the tasks in progress spread over their
spans); the microseconds of those calls are printed too.
"""

import argparse
import heapq
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
    parser.add_argument("--gap", type=float, default=None, help="seconds to each second step")
    args = parser.parse_args()
    rng = random.Random(0)
    workers = [WorkerView(worker_id=f"w{i}", slot=i, pool="h100@llama-3-8b", gpu_type="h100",
                          models=("llama-3-8b",), running=0, waiting=0, last_seen_ms=0)
               for i in range(args.workers)]
    gate = TaskAdmission()
    n = int(args.rate * args.seconds)
    t0 = 1_800_000_000_000
    times, later, refused = [], [], 0
    seconds: list[tuple[int, int, InferenceRequest]] = []  # (due, task, a second step): a heap
    for i in range(n):
        now = t0 + int(i * 1000 / args.rate)
        while seconds and seconds[0][0] <= now:
            request = heapq.heappop(seconds)[2].model_copy(update={"created_ms": now})
            started = time.perf_counter()
            gate.admit(request, workers, now)
            later.append(time.perf_counter() - started)
        request = InferenceRequest(
            event_time_ms=now, created_ms=now, request_id=f"r{i}", task_id=f"t{i}", step=1,
            model="llama-3-8b", **(_similar(rng) if args.similar else _mixed(rng)))
        started = time.perf_counter()
        denial = gate.admit(request, workers, now)
        times.append(time.perf_counter() - started)
        refused += denial is not None
        if args.gap is not None and denial is None:
            due = now + int(args.gap * rng.uniform(0.5, 1.5) * 1000)
            heapq.heappush(seconds, (due, i, request.model_copy(update={
                "request_id": f"r{i}-2", "step": 2})))
    us = np.array(times) * 1e6
    kind = "similar" if args.similar else "mixed"
    print(f"{n} {kind} tasks at {args.rate:g}/s on {args.workers} H100s; {refused / n:.0%} refused")
    for label, part in (("first second", us[: int(args.rate)]), ("last second", us[-int(args.rate):]),
                        ("all", us)):
        print(f"  {label:>12}: p50 {np.percentile(part, 50):7.1f} us   "
              f"p99 {np.percentile(part, 99):7.1f} us")
    if later:
        part = np.array(later) * 1e6
        print(f"  {'second steps':>12}: p50 {np.percentile(part, 50):7.1f} us   "
              f"p99 {np.percentile(part, 99):7.1f} us   ({len(later)})")


def _mixed(rng: random.Random) -> dict:
    return {"steps_total": rng.randint(2, 12), "priority": rng.randrange(10),
            "prompt_tokens": rng.randint(200, 2_000), "max_tokens": rng.randint(50, 500)}


def _similar(rng: random.Random) -> dict:
    return {"steps_total": 6, "priority": 5, "prompt_tokens": rng.randint(900, 1_100),
            "max_tokens": 200}


if __name__ == "__main__":
    main()
