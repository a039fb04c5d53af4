"""A pool's tensor parallelism named in the fleet spec (``h100:8/tp4@llama-2-70b``): before 6 Dec
every pool ran at its model's least degree (two H100s for Llama-2-70B), and ``/tp4`` was a bad
entry. ``governor sim``, the local stack and the supervisor run the named degree."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controllers.router.candidates import build_candidates
from controllers.router.ledger import PendingLedger
from controllers.router.prefix import PrefixIndex
from infra.sim import SimOptions, simulate
from infra.sim.cli import _config
from infra.stack import PoolSpec, parse_fleet, parse_pool_gpus
from infra.supervisor import carry_out
from infra.traces import TraceRequest
from tests.unit.controllers.router_factories import request_factory
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR as PRICES
from tests.unit.infra.test_stack import _scale, _Stack
from workers.sim.perf import PerfModel

BIG = "llama-2-70b"  # 64 attention heads; holds on two H100s at the least


@pytest.mark.parametrize(("spec", "pools"), [
    (f"h100:8/tp4@{BIG}", [PoolSpec("h100", 2, BIG, tp=4)]),
    (f"h100:8/tp8@{BIG}", [PoolSpec("h100", 1, BIG, tp=8)]),
    (f"h100:8/tp2@{BIG}", [PoolSpec("h100", 4, BIG, tp=2)]),  # (the least, named)
    (f"H100:16/TP8@{BIG},a100:2", [PoolSpec("h100", 2, BIG, tp=8), PoolSpec("a100", 2)]),
    ("h100:4/tp2", [PoolSpec("h100", 2, "llama-3-8b", tp=2)]),  # (a model that needs one)
    ("h100:1/tp1", [PoolSpec("h100", 1)]),
    # a model name may hold '/' (and ':' and '@'): the degree is on the count's side of '@'
    ("h100:2@org/tp4", [PoolSpec("h100", 2, "org/tp4")]),
])
def test_a_pool_runs_at_the_degree_its_spec_names(spec: str, pools: list[PoolSpec]) -> None:
    assert parse_fleet(spec) == pools


@pytest.mark.parametrize(("spec", "says"), [
    (f"h100:16/tp16@{BIG}", f"pool h100@{BIG}: tp 16 is not from 1 to 8 (GPUs a worker)"),
    (f"h100:8/tp0@{BIG}", f"pool h100@{BIG}: tp 0 is not from 1 to 8 (GPUs a worker)"),
    (f"h100:6/tp4@{BIG}", f"pool h100@{BIG}: tp 4 does not divide its 6 GPUs"),
    (f"h100:4/tp1@{BIG}",
     f"pool h100@{BIG}: tp 1: {BIG} does not fit on 1 h100 GPU (it needs tp 2 at least)"),
    ("h100:6/tp3", "pool h100@llama-3-8b: tp 3 does not divide llama-3-8b's 32 attention heads "
                   "(vLLM refuses it)"),
    (f"h100:6/tp6@{BIG}", f"pool h100@{BIG}: tp 6 does not divide {BIG}'s 64 attention heads "
                          "(vLLM refuses it)"),
])
def test_a_degree_the_pool_cannot_run_is_refused_naming_pool_field_and_limit(
        spec: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_fleet(spec)
    assert str(info.value) == says


@pytest.mark.parametrize("entry", [f"h100:8/4@{BIG}", f"h100:8/tp@{BIG}", "h100:8/tpx",
                                   "h100:8/", "h100:/tp2", "h100:8/tp²"])
def test_a_malformed_degree_is_a_bad_entry(entry: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_fleet(entry)
    assert str(info.value) == (f"bad fleet entry {entry!r}: expected GPU:COUNT[/tpN][@MODEL], "
                               "e.g. h100:4 or h100:8/tp4@llama-2-70b")


def test_the_stack_and_the_supervisor_start_workers_at_the_pools_degree(tmp_path) -> None:
    """``governor up``/``demo --fleet h100:8/tp4@llama-2-70b``: two workers, each ``--tp 4``;
    the autoscaler's third is started ``--tp 4`` too, not at the least degree (2)."""
    stack = _Stack("127.0.0.1:1", "ns", parse_fleet(f"h100:8/tp4@{BIG}"), tmp_path,
                   with_router=False)
    stack.start()
    said: list[str] = []
    carry_out([_scale(f"h100@{BIG}", "h100", BIG, 3)], stack, 32, {}, said.append)
    assert stack.workers_of(f"h100@{BIG}") == [0, 1, 2], said
    assert [args[args.index("--tp") + 1] for args in stack.args.values()] == ["4", "4", "4"]


def test_a_vllm_servers_degree_is_its_workers_gpus(tmp_path) -> None:
    """With ``--vllm-url`` the count is GPUs too, a server each ``/tp4`` (or the least degree
    that holds the model): each worker is started ``--tp 4`` to bill its server's GPUs."""
    pools = parse_fleet(f"h100:8/tp4@{BIG},h100:2@llama-3-8b,a100:2@{BIG}")
    urls = tuple(f"http://127.0.0.1:{n}" for n in range(1, 6))
    stack = _Stack("127.0.0.1:1", "ns", pools, tmp_path, with_router=False, vllm_urls=urls)
    stack.start()
    tp = [args[args.index("--tp") + 1] if "--tp" in args else None
          for args in stack.args.values()]
    assert tp == ["4", "4", None, None, "2"]


def test_an_isolated_request_on_a_tp4_pool_takes_the_tp4_prefill_and_bills_four_gpus() -> None:
    trace = [TraceRequest(arrival_s=5.0, prompt_tokens=2000, output_tokens=20, model=BIG),
             TraceRequest(arrival_s=1800.0, prompt_tokens=500, output_tokens=10, model=BIG)]
    report, sim = simulate(trace, SimOptions(policy="governor", fleet=f"h100:8/tp4@{BIG}",
                                             bus_latency_s=0.0))
    assert [w.engine.perf.tp for w in sim.fleet.workers.values()] == [4, 4]
    assert [w.status(0.0).gpus for w in sim.fleet.workers.values()] == [4, 4]
    expected = PerfModel.load("h100", BIG, 4).prefill_s(2000)
    assert expected < 0.8 * PerfModel.load("h100", BIG, 2).prefill_s(2000)  # (the degree tells)
    assert sim.outcomes.first_token_s[0] - 5.0 == pytest.approx(expected, rel=1e-9)
    hours = sim.end_s / 3600
    assert report["gpu_hours"] == pytest.approx(2 * 4 * hours, rel=1e-3)
    assert report["cost_usd"] == pytest.approx(2 * 4 * PRICES["h100"] * hours, rel=1e-3)
    assert report["fleet_timeline"][0] == [0.0, 2, 2]  # workers, of four GPUs each


def test_the_router_predicts_a_tp4_pools_workers_at_tp4() -> None:
    """The simulated workers of ``h100:8/tp4`` say their four GPUs in each heartbeat, and the
    router's candidates (its TTFT prediction, its scorers) take them at TP 4."""
    request = TraceRequest(arrival_s=0.0, prompt_tokens=2000, output_tokens=5, model=BIG)
    _, sim = simulate([request], SimOptions(policy="governor", fleet=f"h100:8/tp4@{BIG}"))
    views = sim.core.fleet.workers()
    assert [w.gpus for w in views] == [4, 4]
    cands = build_candidates(request_factory(model=BIG, prompt_tokens=2000), views,
                             PendingLedger(), PrefixIndex(), dict(PRICES), {}, None)
    assert [c.perf.tp for c in cands] == [4, 4]


def test_the_autoscaler_adds_workers_of_the_pools_degree() -> None:
    """``--autoscale`` caps ``h100:16/tp8`` at its two workers; the pool scaled from one worker
    adds one of eight GPUs, cold for TP 8's load time."""
    config = _config([], [], True, f"h100:16/tp8@{BIG}")
    assert config.autoscaler.pools[f"h100@{BIG}"].max_replicas == 2
    _, sim = simulate([TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=5, model=BIG)],
                      SimOptions(policy="round_robin", fleet=f"h100:8/tp8@{BIG}"))
    [new], _ = sim.fleet.scale(f"h100@{BIG}", "h100", BIG, 2, 100.0)
    assert new.engine.perf.tp == 8 and new.price_per_hour == 8 * PRICES["h100"]
    assert new.engine.ready_s == pytest.approx(100.0 + PerfModel.load("h100", BIG, 8).load_s())


def test_sim_refuses_a_bad_degree_with_exit_2_and_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2,
                                 "model": BIG}) + "\n")
    done = subprocess.run([sys.executable, "-m", "infra.cli", "sim", str(trace), "--fleet",
                           f"h100:8/tp16@{BIG}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: pool h100@{BIG}: tp 16 is not from 1 to 8 (GPUs a worker)"


TWO_DEGREES = f"h100:4/tp2@{BIG},h100:4/tp4@{BIG}"


@pytest.mark.parametrize("command", [
    ["sim", "TRACE", "--fleet", TWO_DEGREES],
    ["up", "--bootstrap", "127.0.0.1:1", "--fleet", TWO_DEGREES],
    ["demo", "--bootstrap", "127.0.0.1:1", "--fleet", TWO_DEGREES],
    ["up", "--bootstrap", "127.0.0.1:1", "--fleet", TWO_DEGREES,
     "--vllm-url", "http://127.0.0.1:1", "--vllm-url", "http://127.0.0.1:2"],
], ids=["sim", "up", "demo", "up-vllm"])
def test_one_pool_at_two_degrees_is_refused_alike_everywhere(tmp_path: Path,
                                                             command: list[str]) -> None:
    """A pool is named GPU@MODEL wherever it is keyed (commands, heartbeats, the autoscaler's
    bounds, the analytics store), so it runs at one degree: two entries of one pool at two
    degrees are refused in one line naming both, before anything starts. Before, the line said
    to give the pool once "with its whole count", which would run it at one of them."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2,
                                 "model": BIG}) + "\n")
    args = [str(trace) if arg == "TRACE" else arg for arg in command]
    done = subprocess.run([sys.executable, "-m", "infra.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: bad fleet spec {TWO_DEGREES!r}: h100:4/tp2@{BIG} and h100:4/tp4@{BIG} are one "
        f"pool, h100@{BIG}, at tp 2 and tp 4: a pool (as commands, heartbeats, "
        "autoscaler.pools and the analytics store name it, GPU@MODEL) runs at one tensor "
        "parallelism; give it one")


def test_one_pool_named_twice_at_one_degree_is_told_to_be_given_once() -> None:
    with pytest.raises(ValueError, match=f"pool h100@{BIG} is named twice; give it once"):
        parse_fleet(f"h100:4@{BIG},h100:4/tp2@{BIG}")  # (the least degree, named)


def test_the_stack_tells_the_controllers_each_pools_degree(tmp_path) -> None:
    """The autoscaler plans a pool none of whose workers it has heard (at zero, or before its
    first heartbeat) at the degree the stack starts its workers at: ``governor up`` gives the
    controllers process its fleet's (``--pool-gpus``, where more than one GPU)."""
    stack = _Stack("127.0.0.1:1", "ns", parse_fleet(f"h100:8/tp4@{BIG},a100:4@{BIG},h100:2"),
                   tmp_path)
    stack.start()
    args = stack.args["controllers"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--pool-gpus"] == [
        f"h100@{BIG}=4", f"a100@{BIG}=2"]
    assert parse_pool_gpus([f"h100@{BIG}=4", f"a100@{BIG}=2"]) == {f"h100@{BIG}": 4,
                                                                   f"a100@{BIG}": 2}


@pytest.mark.parametrize(("entries", "says"), [
    (["h100=4"], "--pool-gpus 'h100=4': expected GPU@MODEL=N (GPUs a worker of the pool), e.g. "
                 "h100@llama-2-70b=4"),
    ([f"h100@{BIG}"], f"--pool-gpus 'h100@{BIG}': expected GPU@MODEL=N"),
    ([f"h100@{BIG}=x"], f"--pool-gpus 'h100@{BIG}=x': expected GPU@MODEL=N"),
    ([f"h100@{BIG}=16"], f"--pool-gpus 'h100@{BIG}=16': tp 16 is not from 1 to 8 (GPUs a worker)"),
    ([f"h100@{BIG}=4", f"h100@{BIG}=2"],
     f"--pool-gpus gives h100@{BIG} 4 and 2 GPUs a worker: a pool runs at one"),
    # a degree its built-in model cannot run at, as autoscaler.pools.<pool>.gpus refuses it
    ([f"h100@{BIG}=3"], f"--pool-gpus 'h100@{BIG}=3': tp 3 does not divide {BIG}'s 64 attention "
                        "heads"),
    ([f"h100@{BIG}=1"], f"--pool-gpus 'h100@{BIG}=1': tp 1: {BIG} does not fit on 1 h100 GPU"),
    # a GPU type no worker runs on (`worker --gpu` refuses it): the entry would name no pool
    ([f"h10@{BIG}=4"], f"--pool-gpus 'h10@{BIG}=4': unknown gpu 'h10'; known: a100, h100, h200"),
])
def test_a_bad_pool_gpus_entry_is_refused_naming_it(entries: list[str], says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_pool_gpus(entries)
    assert str(info.value).startswith(says)


def test_a_pool_gpus_entry_names_its_pool_as_the_fleet_does() -> None:
    # (a pool is named with its GPU type in lower case, as parse_fleet and the workers' heartbeats
    # name it: an entry kept as given would name no pool, and be taken for nothing)
    assert parse_pool_gpus([f"H100@{BIG}=4"]) == {f"h100@{BIG}": 4}
    assert parse_fleet(f"H100:8/tp4@{BIG}")[0].name == f"h100@{BIG}"


def test_the_controllers_command_refuses_a_bad_pool_gpus_before_reaching_for_a_broker() -> None:
    done = subprocess.run([sys.executable, "-m", "infra.cli", "controllers", "--bootstrap",
                           "127.0.0.1:1", "--pool-gpus", f"h100@{BIG}=9"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --pool-gpus 'h100@{BIG}=9': tp 9 is not from 1 to 8 "
                                   "(GPUs a worker)")
