"""A task's steps in the simulator: each is sent once the step before it has ended (it re-sends
that step's answer), and ``rate_scale`` compresses the starts of tasks, not the time between
their steps. Requests without a task id arrive at their time over ``rate_scale``."""

import pytest

from infra.sim import SimOptions, simulate
from infra.traces import TraceRequest


def _step(arrival_s: float, step: int, task: str = "t1", model: str = "llama-3-8b",
          prompt: int = 2000, output: int = 300) -> TraceRequest:
    return TraceRequest(arrival_s=arrival_s, prompt_tokens=prompt + 400 * step,
                        output_tokens=output, model=model, task_id=task, step=step, steps_total=3)


def test_a_step_arrives_after_the_step_before_it_ends():
    # trace times 0.1 s apart; each step takes seconds (300 output tokens)
    trace = [_step(0.0, 1), _step(0.1, 2), _step(0.2, 3)]
    _, sim = simulate(trace, SimOptions(policy="kv_aware", fleet="h100:1"))
    out = sim.outcomes
    assert out.state == ["completed"] * 3
    for k in (1, 2):
        assert out.end_s[k - 1] > trace[k].arrival_s + 1.0  # (the open loop sent it meanwhile)
        assert out.specs[k].arrival_s >= out.end_s[k - 1]
        assert out.first_token_s[k] > out.end_s[k - 1]
    # TTFT from the step's own arrival: the wait for the step before is no queueing
    assert max(out.ttfts()) < 0.5
    assert sim.end_s == out.end_s[2]


def test_rate_scale_compresses_task_starts_not_the_steps_offsets():
    trace = [_step(40.0, 1), _step(100.0, 2), _step(160.0, 3)]
    _, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1", rate_scale=4.0))
    assert [s.arrival_s for s in sim.outcomes.specs] == pytest.approx([10.0, 70.0, 130.0])
    assert sim.outcomes.state == ["completed"] * 3


def test_a_rejected_step_releases_the_next_at_once():
    # no pool serves step 1's model: held, then rejected (no_capacity) at 5 s
    trace = [_step(0.0, 1, model="other-model"), _step(1.0, 2), _step(60.0, 3)]
    _, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1", hold_timeout_s=5.0))
    out = sim.outcomes
    assert out.state == ["rejected", "completed", "completed"]
    assert out.reason[0] == "no_capacity"
    assert 5.0 <= out.end_s[0] < 7.0
    assert out.specs[1].arrival_s == out.end_s[0]  # sent as the rejection comes back
    assert out.specs[2].arrival_s == 60.0  # its own time: step 2 ended long before


def test_requests_without_a_task_keep_their_scaled_arrival():
    single = [TraceRequest(arrival_s=float(t), prompt_tokens=500, output_tokens=20)
              for t in range(0, 200, 20)]
    steps = [_step(0.0, 1, output=20), _step(30.0, 2, output=20), _step(60.0, 3, output=20)]
    trace = sorted(single + steps, key=lambda r: r.arrival_s)
    _, sim = simulate(trace, SimOptions(policy="least_loaded", fleet="h100:1", rate_scale=4.0))
    out = sim.outcomes
    arrivals = {(r.task_id, r.arrival_s): s.arrival_s for r, s in zip(trace, out.specs)}
    for r in single:
        assert arrivals[(None, r.arrival_s)] == r.arrival_s / 4.0
    assert [arrivals[("t1", r.arrival_s)] for r in steps] == [0.0, 30.0, 60.0]
    assert out.unfinished() == [] and out.duplicates == []
    # each request met in time order: first tokens follow arrivals
    assert all(f >= s.arrival_s for f, s in zip(out.first_token_s, out.specs))
    assert sim.end_s == pytest.approx(max(out.end_s))


@pytest.mark.parametrize(("steps", "waits_for"), [
    ([1, 2, 3], [None, 0, 1]),
    ([2, 1], [None, None]),  # step 2 above step 1 in the file (it arrives earlier): no wait
    ([1, 2, 2], [None, 0, 0]),  # a step held twice waits for the step below it, not its twin
    ([1, 1, 2], [None, None, 1]),
    ([1, 3], [None, 0]),  # a step missing from the file: the one below it
])
def test_which_step_a_step_waits_for(steps: list[int], waits_for: list[int | None]):
    """What README says of rows of a task out of order or held twice (``sim`` and a
    closed-loop ``replay`` alike: ``infra.sim.arrivals.Arrivals`` over ``previous_steps``)."""
    from infra.sim.requests import previous_steps

    trace = [TraceRequest(arrival_s=float(i), prompt_tokens=10, output_tokens=2, task_id="t",
                          step=step, steps_total=3) for i, step in enumerate(steps)]
    assert previous_steps(trace) == waits_for
