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
