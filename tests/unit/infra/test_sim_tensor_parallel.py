"""Pools of a model that needs several GPUs a worker (``--fleet h100:8@llama-2-70b``): workers of
the model's least tensor parallelism, each on that degree's performance model and billed for
each of its GPUs (before 6 Dec, ``governor sim`` refused such a fleet)."""

import dataclasses
import json

import pytest

from infra.sim import SimOptions, Simulation, simulate
from infra.sim.cli import _config
from infra.sim.fleet import VirtualFleet
from infra.stack import parse_fleet
from infra.traces import TraceRequest
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR as PRICES
from schemas.config import GovernorConfig
from tests.unit.infra.sim_factories import azure_like
from tests.unit.infra.test_sim_conservation import _check
from tests.unit.infra.test_sim_determinism import WALL_CLOCK_FIELDS
from workers.sim.perf import PerfModel

BIG = "llama-2-70b"  # holds on two A100s, H100s or H200s at the least
#: a 130B model (Llama-2-70B's shape, wider): it holds on four H100s at the least
HUGE = {"params_b": 130.0, "n_layers": 96, "n_heads": 64, "n_kv_heads": 8, "head_dim": 128,
        "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 32000}


def _of(model: str, trace: list[TraceRequest]) -> list[TraceRequest]:
    return [dataclasses.replace(r, model=model) for r in trace]


@pytest.mark.parametrize(("gpu", "prompt"), [("h100", 16), ("h100", 1000), ("a100", 3000),
                                             ("h200", 2000)])
def test_isolated_ttft_is_the_prefill_time_at_the_pools_tensor_parallelism(gpu, prompt):
    trace = [TraceRequest(arrival_s=5.0, prompt_tokens=prompt, output_tokens=20, model=BIG)]
    report, sim = simulate(trace, SimOptions(policy="governor", fleet=f"{gpu}:2@{BIG}",
                                             bus_latency_s=0.0))
    [worker] = sim.fleet.workers.values()
    assert worker.engine.perf.tp == 2
    expected = PerfModel.load(gpu, BIG, 2).prefill_s(prompt)
    assert expected != PerfModel.load(gpu, BIG, 4).prefill_s(prompt)  # (the degree tells)
    assert sim.outcomes.first_token_s[0] - 5.0 == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert report["ttft_p50_s"] == pytest.approx(expected, abs=1e-4)


def test_a_declared_model_of_four_gpus_a_worker_runs_at_tp_4():
    """A model ``--set models.NAME`` declares is known before the fleet is read: its pool of
    eight H100s is two workers of four, its TTFT that of the TP-4 performance model."""
    config = GovernorConfig().with_setting("models.huge-130b", HUGE)
    trace = [TraceRequest(arrival_s=5.0, prompt_tokens=2000, output_tokens=20, model="huge-130b")]
    report, sim = simulate(trace, SimOptions(policy="governor", fleet="h100:8@huge-130b",
                                             config=config, bus_latency_s=0.0))
    assert [w.engine.perf.tp for w in sim.fleet.workers.values()] == [4, 4]
    expected = PerfModel.load("h100", "huge-130b", 4).prefill_s(2000)
    assert sim.outcomes.first_token_s[0] - 5.0 == pytest.approx(expected, rel=1e-9)
    assert report["gpu_hours"] == pytest.approx(8 * sim.end_s / 3600, rel=1e-3)


def test_a_worker_has_the_kv_capacity_and_heartbeat_of_its_gpus():
    fleet = VirtualFleet(parse_fleet(f"h100:4@{BIG}"), dict(PRICES))
    w = fleet.workers["w0"]
    assert len(fleet.workers) == 2 and w.price_per_hour == 2 * PRICES["h100"]
    tp2 = PerfModel.load("h100", BIG, 2)
    assert w.engine.stats().kv_blocks_free == tp2.kv_capacity_blocks()
    assert w.status(0.0).gpus == 2


def test_a_fixed_fleet_costs_every_gpu_of_every_worker():
    trace = _of(BIG, [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=10),
                      TraceRequest(arrival_s=1800.0, prompt_tokens=500, output_tokens=10)])
    report, sim = simulate(trace, SimOptions(policy="round_robin", fleet=f"h100:8@{BIG}"))
    hours = sim.end_s / 3600
    assert sim.end_s == pytest.approx(1800.0, abs=1.0)
    assert report["gpu_hours"] == pytest.approx(8 * hours, rel=1e-3)
    assert report["cost_usd"] == pytest.approx(8 * PRICES["h100"] * hours, rel=1e-3)
    assert report["tasks_succeeded"] == 2
    assert report["fleet_timeline"][0] == [0.0, 4, 4]  # workers, of two GPUs each


def test_scaling_adds_and_drains_whole_workers_cold_at_their_load_time():
    fleet = VirtualFleet(parse_fleet(f"h100:2@{BIG}"), dict(PRICES))
    added, _ = fleet.scale(f"h100@{BIG}", "h100", BIG, 2, 100.0)
    [new] = added
    assert new.engine.perf.tp == 2
    assert new.engine.ready_s == pytest.approx(100.0 + PerfModel.load("h100", BIG, 2).load_s())
    assert new.status(101.0).state == "loading"
    # a pool the fleet did not name, scaled from nothing, runs on the model's least degree too
    [other], _ = fleet.scale(f"a100@{BIG}", "a100", BIG, 1, 100.0)
    assert other.engine.perf.tp == 2 and other.price_per_hour == 2 * PRICES["a100"]
    _, drained = fleet.scale(f"h100@{BIG}", "h100", BIG, 1, 200.0)
    assert drained == [new]
    fleet.stop_idle_drained(200.0)
    # w0: 3600 s; w1: 100 s to 200 s; w2 (a100): 100 s to 3600 s; two GPUs each
    assert fleet.gpu_hours(3600.0) == pytest.approx(2 * (3600 + 100 + 3500) / 3600)


def test_autoscale_caps_each_pool_at_its_workers_not_its_gpus():
    config = _config([], [], True, f"h100:8@{BIG},a100:2")
    assert config.autoscaler.pools[f"h100@{BIG}"].max_replicas == 4
    assert config.autoscaler.pools["a100@llama-3-8b"].max_replicas == 2


def _report(trace, **options) -> str:
    report, _ = simulate(trace, SimOptions(**options), "test")
    for name in WALL_CLOCK_FIELDS:
        report.pop(name)
    return json.dumps(report, sort_keys=True)


@pytest.mark.parametrize("policy", ["governor", "round_robin"])
def test_a_tensor_parallel_fleet_is_deterministic(policy):
    trace = _of(BIG, azure_like(duration_s=30.0, rate_rps=6.0))
    options = dict(policy=policy, fleet=f"h100:4@{BIG},a100:2@{BIG}", seed=5, rate_scale=2.0)
    assert _report(trace, **options) == _report(trace, **options)


def test_every_request_ends_once_on_an_autoscaled_tensor_parallel_fleet():
    trace = _of(BIG, azure_like(duration_s=40.0, rate_rps=20.0))
    config = _config([], [], True, f"h100:8@{BIG}")
    sim = Simulation(trace, SimOptions(policy="governor", fleet=f"h100:2@{BIG}", config=config,
                                       drain_limit_s=1800)).run()
    _check(sim)
    assert len(sim.fleet.workers) > 1  # it scaled out, a worker (two GPUs) at a time
    assert {w.engine.perf.tp for w in sim.fleet.workers.values()} == {2}
