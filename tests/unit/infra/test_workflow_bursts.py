"""The scenarios of ``benchmarks/workflow_bursts.py``: a burst inside steady traffic is the steady
phase's whole conversations, then the workload again at the burst's rate, kept apart from them."""

import pytest

from benchmarks.workflow_bursts import BURST_SCALE, STEADY_S, steady_then_burst
from infra.workloads import build_workload, default_traces_dir

pytestmark = pytest.mark.skipif(not (default_traces_dir() / "sharegpt_lengths").is_dir(),
                                reason="no shared data")


def test_steady_then_burst_keeps_both_phases_whole_and_apart() -> None:
    workload = build_workload("sharegpt", duration_s=120.0, rate_scale=0.3, seed=0)
    trace = steady_then_burst(workload, 2.0)
    steady = [r for r in trace if r.task_id.startswith("steady-")]
    burst = [r for r in trace if r.task_id.startswith("burst-")]
    assert len(steady) + len(burst) == len(trace)
    assert [r.arrival_s for r in trace] == sorted(r.arrival_s for r in trace)
    # The steady phase: every conversation that starts before STEADY_S, with all of its steps.
    starts = {r.task_id: r.arrival_s for r in steady if r.step == 1}
    assert starts and max(starts.values()) < STEADY_S
    expected = {f"steady-{r.task_id}" for r in workload
                if r.step == 1 and r.arrival_s / 2.0 < STEADY_S}
    assert set(starts) == expected
    for task in starts:
        steps = [r for r in steady if r.task_id == task]
        assert sorted(r.step for r in steps) == list(range(1, steps[0].steps_total + 1))
    # The burst: the whole workload at BURST_SCALE from STEADY_S on, sharing no prefix block.
    assert len(burst) == len(workload)
    assert min(r.arrival_s for r in burst) >= STEADY_S
    first = min(workload, key=lambda r: r.arrival_s)
    assert min(r.arrival_s for r in burst) == round(first.arrival_s / BURST_SCALE + STEADY_S, 6)
    steady_blocks = {h for r in steady for h in r.hash_ids}
    assert steady_blocks and not steady_blocks & {h for r in burst for h in r.hash_ids}
    # Scaling moves task starts only: a step keeps its offset from its task's first request.
    task = next(r.task_id for r in workload if r.steps_total > 2)
    original = sorted(r.arrival_s for r in workload if r.task_id == task)
    scaled = sorted(r.arrival_s for r in burst if r.task_id == f"burst-{task}")
    assert scaled[0] == round(original[0] / BURST_SCALE + STEADY_S, 6)
    assert [round(t - scaled[0], 3) for t in scaled] == [round(t - original[0], 3) for t in original]
