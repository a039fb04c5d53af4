"""Small workloads for the simulator's tests (no shared data needed)."""

from infra.traces import TraceRequest, azure_like_workload


def azure_like(duration_s: float = 60.0, rate_rps: float = 8.0, seed: int = 3) -> list[TraceRequest]:
    return azure_like_workload(duration_s=duration_s, rate_rps=rate_rps, seed=seed)


def conversations(n_tasks: int = 20, turns: int = 3, gap_s: float = 0.7) -> list[TraceRequest]:
    """Multi-step tasks whose turns re-send a growing history (shared 64-token blocks)."""
    out = []
    for c in range(n_tasks):
        history = 200 + 37 * c
        for k in range(turns):
            prompt = history + 50
            out.append(TraceRequest(
                arrival_s=round(c * gap_s + k * 3.0, 3), prompt_tokens=prompt, output_tokens=40 + k,
                hash_ids=tuple(range(c * 1000, c * 1000 + prompt // 64)), block_size=64,
                task_id=f"t{c}", step=k + 1, steps_total=turns, tenant=f"ten{c % 3}",
                priority=c % 3 * 4))
            history = prompt + 40 + k
    return sorted(out, key=lambda r: (r.arrival_s, r.task_id))


def mixed_value_burst(rate_rps: float = 100.0, duration_s: float = 12.0,
                      seed: int = 1) -> list[TraceRequest]:
    """Poisson arrivals of 80% low-value batch requests, 10% priority-9 interactive ones and 10%
    the fourth step of five-step agent tasks; all with a 2 s TTFT SLO and a 15 s deadline. At
    100/s it is three times what one simulated H100 serves (about 33 of these a second)."""
    import random

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
