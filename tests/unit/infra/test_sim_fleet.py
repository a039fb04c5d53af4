"""The virtual fleet: what it costs, and how it grows cold and shrinks by draining."""

import pytest

from infra.sim import SimOptions, Simulation, simulate
from infra.sim.fleet import VirtualFleet
from infra.stack import parse_fleet
from infra.traces import TraceRequest
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR as PRICES
from workers.engine import EngineRequest


def test_cost_is_every_gpu_from_start_to_the_end_busy_or_not():
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=10),
             TraceRequest(arrival_s=1800.0, prompt_tokens=500, output_tokens=10)]
    report, sim = simulate(trace, SimOptions(policy="least_loaded", fleet="h100:2,a100:1"))
    hours = sim.end_s / 3600
    assert sim.end_s == pytest.approx(1800.0, abs=1.0)
    assert report["gpu_hours"] == pytest.approx(3 * hours, rel=1e-3)
    assert report["cost_usd"] == pytest.approx((2 * PRICES["h100"] + PRICES["a100"]) * hours, rel=1e-3)
    assert report["tasks_succeeded"] == 2
    assert report["cost_per_successful_task_usd"] == pytest.approx(report["cost_usd"] / 2, rel=1e-3)


def test_small_costs_keep_four_significant_figures():
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=10)] * 3
    report, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1"))
    cost = sim.fleet.cost_usd(sim.end_s)
    assert cost < 1e-3  # a few seconds of one GPU
    assert report["cost_usd"] == pytest.approx(cost, rel=5e-4)
    assert report["cost_per_successful_task_usd"] == pytest.approx(cost / 3, rel=5e-4)
    assert report["gpu_hours"] == pytest.approx(sim.fleet.gpu_hours(sim.end_s), rel=5e-4)


@pytest.mark.parametrize(("value", "written"), [
    (5.87812e-05, 5.878e-05), (0.0123456, 0.01235), (47.306712, 47.3067), (1234.56789, 1234.5679),
    (0.0, 0.0),
])
def test_figures_keep_four_significant_figures_or_four_decimals(value: float,
                                                                written: float) -> None:
    from infra.sim.summary import _sig

    assert _sig(value) == written


def test_scale_up_is_cold_and_scale_down_drains_least_loaded_first():
    fleet = VirtualFleet(parse_fleet("h100:2"), dict(PRICES))
    added, drained = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 3, 100.0)
    assert [w.worker_id for w in added] == ["w2"] and drained == []
    assert added[0].engine.ready_s == pytest.approx(100.0 + added[0].engine.load_s)
    assert added[0].status(101.0).state == "loading"
    added, drained = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 1, 110.0)
    assert added == [] and [w.worker_id for w in drained] == ["w2", "w1"]  # loading one first
    assert [w.worker_id for w in fleet.stop_idle_drained(120.0)] == ["w1", "w2"]
    # stopped as told to drain, being idle then, not at the tick that saw it (paid to 110 s)
    assert fleet.gpu_hours(3600.0) == pytest.approx((3600 + 110 + 10) / 3600)
    assert fleet.timeline[-1] == (120.0, 1, 1)


def test_a_worker_with_a_dispatch_on_its_way_is_busy_and_drained_last():
    """A dispatch still on the bus counts as the worker's work: drained, it is neither chosen
    first nor stopped before the dispatch lands (which was then dropped and resumed elsewhere,
    spending a retry)."""
    fleet = VirtualFleet(parse_fleet("h100:2"), dict(PRICES))
    fleet.workers["w1"].in_transit = 1
    _, drained = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 1, 5.0)
    assert [w.worker_id for w in drained] == ["w0"]
    fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 0, 6.0)
    assert [w.worker_id for w in fleet.stop_idle_drained(7.0)] == ["w0"]  # w1's is on its way


def test_a_drained_worker_is_paid_to_its_drain_not_to_its_last_heartbeat():
    """Its engine's clock moves on at every heartbeat while it is idle: the stop is the drain (or
    its last step's end), not the last time something advanced it."""
    fleet = VirtualFleet(parse_fleet("h100:2"), dict(PRICES))
    fleet.workers["w0"].engine.add(EngineRequest("long", 100, 5_000), 0.0)  # busy: kept
    fleet.workers["w1"].engine.add(EngineRequest("short", 100, 5), 0.0)
    for w in fleet.workers.values():
        w.engine.advance(1.0)
    assert not fleet.workers["w1"].busy
    _, drained = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 1, 5.0)
    assert [w.worker_id for w in drained] == ["w1"]
    fleet.workers["w1"].engine.advance(5.5)  # its heartbeat
    assert [w.worker_id for w in fleet.stop_idle_drained(6.0)] == ["w1"]
    assert fleet.workers["w1"].stopped_s == 5.0


def test_the_run_ends_when_its_last_request_does_not_at_the_next_tick():
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=10)]
    report, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1"))
    [end] = sim.outcomes.end_s
    assert 0 < end < 1 and sim.end_s == end  # (the first tick is at 1 s)
    assert sim.fleet.gpu_hours(sim.end_s) == pytest.approx(end / 3600)


def test_a_gpu_with_no_price_is_refused_and_an_unknown_one_said_to_be_unknown():
    """An unknown GPU was refused as having no price, and a price set for it then refused."""
    with pytest.raises(ValueError, match="no price for GPU type 'h200'"):
        VirtualFleet(parse_fleet("h200:1"), {"h100": 3.0})
    with pytest.raises(ValueError, match="unknown gpu 'b200'; known: a100, h100, h200"):
        VirtualFleet(parse_fleet("b200:1"), {**PRICES, "b200": 5.0})


def test_scale_out_takes_back_a_draining_worker_before_a_cold_one():
    fleet = VirtualFleet(parse_fleet("h100:3"), dict(PRICES))
    fleet.workers["w0"].engine.add(EngineRequest("r0", 100, 50), 0.0)  # busy: drained last
    _, drained = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 1, 1.0)
    assert sorted(w.worker_id for w in drained) == ["w1", "w2"]
    added, _ = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 3, 2.0)
    assert added == [] and not any(w.draining for w in fleet.active())
    added, _ = fleet.scale("h100@llama-3-8b", "h100", "llama-3-8b", 4, 3.0)
    assert [w.worker_id for w in added] == ["w3"]


def test_a_heartbeat_reports_the_work_of_its_interval_as_a_live_workers_does():
    """Steps, prompt tokens computed and tokens generated since the previous heartbeat: the
    breakers judge a worker's latency by them (without them, by the load at the heartbeat)."""
    fleet = VirtualFleet(parse_fleet("h100:1"), dict(PRICES))
    worker = fleet.workers["w0"]
    assert worker.status(0.0).max_model_len == 131_072  # its model's context, as a live worker's
    worker.engine.add(EngineRequest("r0", 1000, 50), 0.0)
    worker.tokens += sum(b.count for b in worker.engine.advance(0.5))
    status = worker.status(0.5)
    stats = worker.engine.stats()
    assert (status.steps, status.prefilled_tokens, status.generated_tokens) == (
        stats.steps, 1000, 50)
    assert stats.steps > 1
    worker.status(0.6)  # nothing since: none of it counted again
    assert (worker.status(0.7).steps, worker.status(0.8).prefilled_tokens) == (0, 0)


def test_the_timeline_ends_with_the_fleet_the_run_ends_with():
    """The run ends at its last request's end; a tick after it (the one that saw the run done)
    may drain and stop a worker, which is paid to the run's end: the timeline's last point is
    the fleet then, not as the tick left it (``billed_to`` pays that fleet on)."""
    from schemas import commands

    class ScaleIn:  # a controller that drains one worker at its first tick
        def observe(self, message, now_ms):
            pass

        def tick(self, now_ms):
            return [commands.ScalePool(event_time_ms=now_ms, command_id="c", pool="h100@llama-3-8b",
                                       gpu_type="h100", model="llama-3-8b", replicas=1)]

    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=2)]
    sim = Simulation(trace, SimOptions(policy="round_robin", fleet="h100:2"))
    sim.controllers = [ScaleIn()]
    sim.run()
    assert sim.end_s < 1.0 and [w.stopped_s for w in sim.fleet.workers.values()] == [None, 1.0]
    assert sim.fleet.gpu_hours(sim.end_s) == pytest.approx(2 * sim.end_s / 3600)
    assert sim.fleet.timeline == [(0.0, 2, 2), (round(sim.end_s, 3), 2, 2)]
