"""CPU a task of the most steps a request may state costs the streams' task book.

    python -m benchmarks.streams_long_task [--steps 10000]

One task of ``--steps`` steps (``MAX_TASK_STEPS`` by default), each step charged twice (two
attempts) and then ended, through ``streams.signals.tasks.TaskBook`` over a dict, as the tasks
agent applies them. Prints one JSON object: the steps, the CPU seconds they took, µs per step
and the size of the task's table entry. Before the task book kept its charges in constant time,
3,000 steps of one task took 30 s of CPU (each step searched lists of every request id and
charge); it should now be linear in the steps (``tests/unit/streams/test_tasks.py`` checks the
entry's bounds, not its time).
"""

import argparse
import json
import time

import orjson

from schemas.limits import MAX_ID_CHARS, MAX_TASK_STEPS
from streams.signals.tasks import TaskBook

T = 1_700_000_000_000


def run(steps: int) -> dict:
    table: dict = {}
    book = TaskBook(table)
    rid = "r" * MAX_ID_CHARS
    started = time.process_time()
    for step in range(1, steps + 1):
        request = f"{rid[:-6]}{step:06d}"
        for attempt in (1, 2):
            book.apply("t", {"k": "cost", "rid": request, "a": attempt, "usd": 0.001, "t": T,
                             "tn": "acme", "w": "w0"})
        book.apply("t", {"k": "step", "rid": request, "step": step, "steps": steps, "o": "ok",
                         "t": T, "tn": "acme"})
    cpu_s = time.process_time() - started
    return {"steps": steps, "cpu_s": round(cpu_s, 3), "us_per_step": round(cpu_s / steps * 1e6, 1),
            "entry_bytes": len(orjson.dumps(table["t"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MAX_TASK_STEPS)
    args = parser.parse_args()
    if not 1 <= args.steps <= MAX_TASK_STEPS:
        parser.error(f"--steps must be 1 to {MAX_TASK_STEPS} (MAX_TASK_STEPS), got {args.steps}")
    for steps in sorted({args.steps // 4 or 1, args.steps}):  # linear: the same µs per step
        print(json.dumps(run(steps)), flush=True)


if __name__ == "__main__":
    main()
