"""A request's max_tokens is its client's cap, not its answer's length: the router is not told
how long answers run, and the engines still end each answer at its length in the trace."""

import json

import pytest

from infra.sim import SimOptions, Simulation, simulate, summarize
from tests.unit.infra.sim_factories import azure_like, conversations
from tests.unit.infra.test_sim_determinism import WALL_CLOCK_FIELDS


def _routed(trace, **options) -> tuple[Simulation, list, list]:
    """The finished simulation, the requests routed and the token counts the engines streamed."""
    sim = Simulation(trace, SimOptions(**options))
    routed, route, streamed, stream = [], sim.core.route, [], sim.core.streamed
    sim.core.route = lambda request, now_ms: routed.append(request) or route(request, now_ms)
    sim.core.streamed = lambda rid, offset, count, *rest, **kw: streamed.append(count) or stream(
        rid, offset, count, *rest, **kw)
    return sim.run(), routed, streamed


def test_every_request_asks_for_the_longest_answer_and_the_engines_end_each_at_its_own():
    trace = azure_like(30.0)
    longest = max(r.output_tokens for r in trace)
    sim, routed, streamed = _routed(trace, policy="governor", fleet="h100:2")
    assert {r.max_tokens for r in routed} == {longest} and len(routed) == len(trace)
    report = summarize(sim, "t")
    assert report["completed"] == len(trace)
    assert sum(streamed) == sum(r.output_tokens for r in trace)
    # the router learned from the completions how long answers run, far below the cap
    expected = sim.core.answers.expected(routed[-1])
    assert min(r.output_tokens for r in trace) <= expected <= max(r.output_tokens for r in trace)
    assert expected < longest / 2


def test_told_each_answers_length_the_router_sees_it_as_max_tokens():
    trace = azure_like(10.0)
    _, routed, _ = _routed(trace, policy="governor", fleet="h100:2", max_tokens="answer")
    assert [r.max_tokens for r in routed] == [max(r.output_tokens, 1) for r in trace]


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "kv_aware"])
def test_a_baseline_that_never_reads_max_tokens_gives_the_same_report_either_way(policy):
    def report(max_tokens):
        result, _ = simulate(azure_like(60.0), SimOptions(policy=policy, fleet="h100:1",
                                                           rate_scale=4.0, max_tokens=max_tokens))
        assert result.pop("max_tokens") == max_tokens
        return json.dumps({k: v for k, v in result.items() if k not in WALL_CLOCK_FIELDS},
                          sort_keys=True)

    assert report("longest") == report("answer")


def test_an_unknown_max_tokens_setting_is_refused():
    with pytest.raises(ValueError, match="max_tokens must be 'longest' or 'answer'"):
        SimOptions(max_tokens="cap")


def test_a_task_whose_length_is_unknown_says_each_step_is_its_last_and_is_judged_whole():
    trace = [r for r in conversations(6, turns=3) if (r.task_id, r.step) != ("t0", 3)]
    sim, routed, _ = _routed(trace, policy="governor", fleet="h100:1", steps_total="unknown")
    assert [(r.step, r.steps_total) for r in routed] == [(r.step, r.step) for r in trace]
    report = summarize(sim, "t")
    assert report["steps_total"] == "unknown" and report["completed"] == len(trace)
    # t0's third step is not in the trace: t0 fails though its router saw no step missing
    assert (report["tasks"], report["tasks_succeeded"]) == (6, 5)


def test_an_unknown_steps_total_setting_is_refused():
    with pytest.raises(ValueError, match="steps_total must be 'trace' or 'unknown'"):
        SimOptions(steps_total="guess")
