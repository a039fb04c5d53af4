"""Task admission under the governor policy in the simulator: ShareGPT conversations (a
conversation is a task, each turn a step that re-sends the history) on two H100s, as the policy
benchmark runs them. In virtual time, without a broker.

Since 5 Dec the simulator sends a step only once the step before it has ended, and ``rate_scale``
moves task starts only: at 14x the two workers now serve all 332 conversations within their
SLOs without task admission, and task admission refuses 29 of them (303 succeed, SLO attainment
0.79; at 30x: 260 against 332). The first test held of the open loop, where a task's steps
piled up; it is kept, expected to fail, until this workload is made to overload the fleet again
or task admission is reworked."""

import pytest

from infra.sim import SimOptions, Simulation
from infra.workloads import build_workload
from schemas.config import GovernorConfig, TaskAdmissionConfig


@pytest.fixture(scope="module")
def conversations() -> list:
    return list(build_workload("sharegpt", duration_s=300.0, rate_scale=0.3, seed=0))


def _run(trace: list, rate_scale: float, enabled: bool) -> tuple[Simulation, list]:
    """The finished run, and the first requests of the tasks task admission refused."""
    config = GovernorConfig(task_admission=TaskAdmissionConfig(enabled=enabled))
    sim = Simulation(trace, SimOptions(policy="governor", fleet="h100:2", rate_scale=rate_scale,
                                       config=config))
    gate, refused = sim.core.task_admission, []
    admit = gate.admit

    def recorded(request, *args, **kwargs):
        denial = admit(request, *args, **kwargs)
        if denial is not None:
            refused.append(request)
        return denial

    gate.admit = recorded
    return sim.run(), refused


def _slo_attainment(sim: Simulation) -> float:
    return sum(map(sim.outcomes.met_slo, range(len(sim.trace)))) / len(sim.trace)


@pytest.mark.xfail(strict=True, reason="closed loop: 14x no longer overloads two H100s, and "
                   "task admission refuses tasks they could serve (module docstring)")
def test_overloaded_it_refuses_long_conversations_and_more_tasks_succeed(conversations) -> None:
    (on, refused), (off, none) = (_run(conversations, 14.0, enabled) for enabled in (True, False))
    assert refused and not none
    starts = [r for r in conversations if r.step == 1]
    mean_steps = sum(r.steps_total for r in starts) / len(starts)
    assert sum(r.steps_total for r in refused) / len(refused) > 1.5 * mean_steps  # longest first
    assert on.outcomes.tasks()[1] > off.outcomes.tasks()[1]
    assert _slo_attainment(on) >= _slo_attainment(off)


def test_at_a_load_the_fleet_can_serve_it_refuses_nothing(conversations) -> None:
    sim, refused = _run(conversations, 4.0, True)
    assert not refused
    tasks, succeeded = sim.outcomes.tasks()
    assert succeeded == tasks
