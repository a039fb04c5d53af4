"""Refusals in the simulator are published as the live router publishes them. In virtual time,
without a broker."""

from infra.sim import SimOptions, simulate
from infra.traces import TraceRequest
from schemas.commands import TenantLimit
from schemas.config import GovernorConfig


def test_a_step_refused_for_now_fails_no_task_in_the_simulator_as_live() -> None:
    """A ``rate_limited`` step carries a retry hint: the router fails no task for it, so the
    task's next step is served (the simulator published the refusal without its hint)."""
    limit = TenantLimit(requests_per_s=0.5, tokens_per_s=1e6)
    config = GovernorConfig(tenants={"acme": limit})
    trace = [TraceRequest(0.0, 100, 10, tenant="acme"),
             TraceRequest(0.1, 100, 10, tenant="acme", task_id="A", step=1, steps_total=2),
             TraceRequest(60.0, 100, 10, tenant="acme", task_id="A", step=2, steps_total=2)]
    _, sim = simulate(trace, SimOptions(policy="governor", fleet="h100:1", config=config))
    assert list(zip(sim.outcomes.state, sim.outcomes.reason)) == [
        ("completed", None), ("rejected", "rate_limited"), ("completed", None)]


def test_a_prompt_past_the_model_context_is_refused_in_the_simulator_as_by_vllm() -> None:
    """llama-3-8b serves 131,072 tokens of prompt and output (Llama 3.1's context): past that
    the engine refuses the request, as vLLM answers 400 (it completed before); governor's router
    refuses it before placing it. A request of exactly the context is served."""
    trace = [TraceRequest(0.0, 200_000, 10), TraceRequest(0.1, 100, 10),
             TraceRequest(0.2, 131_062, 10)]
    outcomes = {}
    for policy in ("round_robin", "governor"):
        _, sim = simulate(trace, SimOptions(policy=policy, fleet="h100:1"))
        outcomes[policy] = list(zip(sim.outcomes.state, sim.outcomes.reason))
    assert outcomes == {
        "round_robin": [("failed", "invalid_request"), ("completed", None), ("completed", None)],
        "governor": [("rejected", "invalid_request"), ("completed", None), ("completed", None)]}


def test_the_clients_max_tokens_counts_against_the_context_for_every_policy() -> None:
    """With ``--max-tokens longest`` (the default) every request asks for the longest answer
    of the trace: 131,000 prompt tokens and 500 asked for pass llama-3-8b's 131,072, so vLLM
    refuses the request, and governor's router refused it; the baselines' simulated engines
    served it (they counted its 10-token answer), a run governor lost for being right."""
    trace = [TraceRequest(0.0, 131_000, 10), TraceRequest(0.1, 100, 500)]
    outcomes = {}
    for policy in ("round_robin", "governor"):
        _, sim = simulate(trace, SimOptions(policy=policy, fleet="h100:1"))
        outcomes[policy] = list(zip(sim.outcomes.state, sim.outcomes.reason))
    assert outcomes == {
        "round_robin": [("failed", "invalid_request"), ("completed", None)],
        "governor": [("rejected", "invalid_request"), ("completed", None)]}
