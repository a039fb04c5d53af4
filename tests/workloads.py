"""Workloads that tests at several levels share (the simulator's and the whole stack's)."""

import random

from infra.traces import TraceRequest


def mixed_value_burst(rate_rps: float = 100.0, duration_s: float = 12.0,
                      seed: int = 1) -> list[TraceRequest]:
    """Poisson arrivals of 80% low-value batch requests, 10% priority-9 interactive ones and 10%
    the fourth step of five-step agent tasks; all with a 2 s TTFT SLO and a 15 s deadline. At
    100/s it is three times what one simulated H100 serves (about 33 of these a second)."""
    rng = random.Random(seed)
    t, i, out = 0.0, 0, []
    while t < duration_s:
        t += rng.expovariate(rate_rps)
        row = dict(arrival_s=round(t, 4), prompt_tokens=rng.randint(800, 1600),
                   output_tokens=rng.randint(60, 140), ttft_slo_s=2.0, deadline_s=15.0)
        kind = rng.random()
        if kind < 0.8:
            row.update(priority=0, tenant="batch")
        elif kind < 0.9:
            row.update(priority=9, tenant="interactive")
        else:
            row.update(priority=3, tenant="agents", task_id=f"task-{i}", step=4, steps_total=5)
        out.append(TraceRequest(**row))
        i += 1
    return out
