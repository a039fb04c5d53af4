"""An isolated request's TTFT in the simulator is the engine's calibrated prefill time."""

import pytest

from infra.sim import SimOptions, simulate
from infra.traces import TraceRequest
from workers.sim.perf import PerfModel


@pytest.mark.parametrize("gpu", ["h100", "a100", "h200"])
@pytest.mark.parametrize("prompt", [16, 1000, 4000, 8000])
def test_isolated_ttft_is_the_prefill_time(gpu, prompt):
    trace = [TraceRequest(arrival_s=5.0, prompt_tokens=prompt, output_tokens=20)]
    report, sim = simulate(trace, SimOptions(policy="governor", fleet=f"{gpu}:1", bus_latency_s=0.0))
    expected = PerfModel.load(gpu, "llama-3-8b").prefill_s(prompt)
    ttft = sim.outcomes.first_token_s[0] - 5.0
    assert ttft == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert report["ttft_p50_s"] == pytest.approx(expected, abs=1e-4)


def test_bus_latency_adds_to_ttft():
    trace = [TraceRequest(arrival_s=1.0, prompt_tokens=2000, output_tokens=5)]
    _, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1", bus_latency_s=0.002))
    expected = 0.002 + PerfModel.load("h100", "llama-3-8b").prefill_s(2000)
    assert sim.outcomes.first_token_s[0] - 1.0 == pytest.approx(expected, rel=1e-9)


def test_chunked_prefill_is_the_sum_of_its_chunks():
    # 20,000 tokens exceed max_num_batched_tokens (8192): three chunks of prefill
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=20_000, output_tokens=5)]
    _, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1", bus_latency_s=0.0))
    perf = PerfModel.load("h100", "llama-3-8b")
    expected = perf.step_s(8192, 0, 0, 0) + perf.step_s(8192, 8192, 0, 0) + perf.step_s(3616, 16384, 0, 0)
    assert sim.outcomes.first_token_s[0] == pytest.approx(expected, rel=1e-9)
