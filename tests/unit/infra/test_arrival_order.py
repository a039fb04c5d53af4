"""``in_arrival_order``: a trace's rows in the order ``governor sim --rate-scale`` has them
arrive (before any wait for a task's previous step), streamed for ``governor replay``."""

import random

import pytest

from infra.sim.requests import earliest_arrivals, in_arrival_order
from infra.traces import TraceRequest


def _trace(seed: int, rows: int = 300) -> list[TraceRequest]:
    """Lone requests and tasks of a few steps, some steps far from their task's start."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(rows):
        t += rng.choice([0.0, 0.1, 1.0, 3.0])
        task = rng.choice([None, "a", "b", "c", f"t{i // 50}"])
        out.append(TraceRequest(arrival_s=t, prompt_tokens=10, output_tokens=3, task_id=task,
                                step=1, steps_total=1))
    return out


@pytest.mark.parametrize("rate_scale", [0.25, 1.0, 2.0, 3.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_come_by_their_earliest_arrival_then_their_row(seed: int, rate_scale: float):
    trace = _trace(seed)
    due = earliest_arrivals(trace, rate_scale)
    got = list(in_arrival_order(iter(trace), rate_scale))
    assert [(t, i) for t, i, _ in got] == sorted(zip(due, range(len(trace))))
    assert all(trace[i] is r for _, i, r in got)
    if rate_scale != 1.0:  # (a task's later step due after rows below it: reordered)
        assert [i for _, i, _ in got] != list(range(len(trace)))


def test_a_row_is_given_before_the_rows_far_below_it_are_read():
    """Streamed: a long trace is not held whole before its first row is sent."""
    read = []

    def rows():
        for i in range(10_000):
            read.append(i)
            yield TraceRequest(arrival_s=float(i), prompt_tokens=10, output_tokens=3)

    order = in_arrival_order(rows(), 2.0)
    assert next(order)[1] == 0 and len(read) <= 2
