"""Every simulated request ends in exactly one terminal state, however the run goes."""

import pytest

from infra.sim import SimOptions, Simulation
from infra.sim.outcomes import COMPLETED, ConservationError, Outcomes, RequestSpec
from schemas.commands import ScalePool
from tests.unit.infra.sim_factories import azure_like, conversations


def _check(sim: Simulation) -> None:
    out = sim.outcomes
    assert out.unfinished() == []
    assert out.duplicates == []
    counts = out.counts()
    assert sum(counts.values()) == len(out)
    assert set(counts) <= {"completed", "rejected", "failed"}
    assert sim.done == len(out)
    # the router holds nothing in flight once the run is over
    assert sim.core.in_flight == {}


@pytest.mark.parametrize("policy", ["governor", "round_robin", "least_loaded", "kv_aware"])
def test_overloaded_fleet(policy):
    # ~40 requests/s of 1k-token prompts on one A100: queues, overdue resumptions, failures
    trace = azure_like(duration_s=30.0, rate_rps=40.0)
    sim = Simulation(trace, SimOptions(policy=policy, fleet="a100:1", drain_limit_s=1800)).run()
    _check(sim)


def test_workflows_with_priorities_and_tight_deadlines():
    trace = conversations(60)
    sim = Simulation(trace, SimOptions(policy="governor", fleet="h100:1", rate_scale=30.0)).run()
    _check(sim)


class _ScaleScript:
    """A controller that scales the pool to a scripted size at given times."""

    def __init__(self, plan: dict[int, int]) -> None:
        self.plan = plan

    def observe(self, message, now_ms: int) -> None:
        pass

    def tick(self, now_ms: int):
        replicas = self.plan.get(now_ms // 1000)
        if replicas is None:
            return []
        return [ScalePool(event_time_ms=now_ms, command_id=f"s{now_ms}", pool="h100@llama-3-8b",
                          gpu_type="h100", model="llama-3-8b", replicas=replicas)]


def test_scaling_to_zero_and_back_holds_then_serves_or_rejects():
    trace = azure_like(duration_s=120.0, rate_rps=4.0)
    sim = Simulation(trace, SimOptions(policy="round_robin", fleet="h100:2", hold_timeout_s=20.0))
    sim.controllers = [_ScaleScript({10: 0, 40: 1, 90: 3})]
    sim.run()
    _check(sim)
    reasons = sim.outcomes.reasons("rejected")
    assert reasons.get("no_capacity", 0) > 0  # held longer than 20 s while nothing served
    assert sim.outcomes.counts()["completed"] > 0
    # workers drained at 10 s stopped once idle; the one added at 40 s loaded its weights cold
    stopped = [w for w in sim.fleet.workers.values() if w.stopped_s is not None]
    assert len(stopped) == 2 and all(w.stopped_s < 40 for w in stopped)
    added = sim.fleet.workers["w2"]
    assert added.started_s == pytest.approx(40.0) and added.engine.ready_s > 60.0


def test_a_second_terminal_state_is_counted_or_raised():
    specs = [RequestSpec(0.0, 10, 5, 2.0, 10.0, ("default", "t"))]
    lenient = Outcomes(specs)
    assert lenient.finish(0, COMPLETED, 1.0)
    assert not lenient.finish(0, "failed", 2.0, "worker_lost")
    assert lenient.duplicates == [(0, "failed", "worker_lost")] and lenient.state[0] == COMPLETED
    strict = Outcomes(specs, strict=True)
    strict.finish(0, COMPLETED, 1.0)
    with pytest.raises(ConservationError):
        strict.finish(0, COMPLETED, 2.0)
