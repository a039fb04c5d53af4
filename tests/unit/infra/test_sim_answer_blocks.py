"""A conversation's answers in the simulator's prefix caches: the blocks each step's answer
fills, read from the next step of its task (``infra.sim.requests.answer_hashes``), are cached
by the engine that generates them, so the next turn, which re-sends the answer, hits them there,
and the router's prefix index hears of them as it does of a prompt's."""

from infra.sim import SimOptions, Simulation, simulate
from infra.sim.requests import answer_hashes, previous_steps
from infra.traces import TraceRequest
from tests.unit.infra.sim_factories import conversations


def _step(step: int, prompt: int, output: int, ids: range | tuple, task: str | None = "t",
          block_size: int = 64, steps_total: int = 3, tenant: str = "a") -> TraceRequest:
    return TraceRequest(arrival_s=float(step), prompt_tokens=prompt, output_tokens=output,
                        hash_ids=tuple(ids), block_size=block_size, tenant=tenant, task_id=task,
                        step=step if task else 1, steps_total=steps_total if task else 1)


def _answers(trace: list[TraceRequest]) -> list[tuple[int, ...]]:
    return answer_hashes(trace, previous_steps(trace))


def test_a_step_whose_next_step_extends_its_prompt_fills_the_blocks_after_its_own():
    # step 1: 150 tokens (two full 64-token blocks) and an answer of 100: its tokens fill
    # block 3 (128-191), not block 4 (192-255: 250 tokens); step 2 re-sends them and 30 more
    trace = [_step(1, 150, 100, range(10, 12)), _step(2, 280, 60, range(10, 14)),
             _step(3, 400, 5, range(10, 16))]
    assert _answers(trace) == [(12,), (14,), ()]  # step 2: 340 tokens fill block 5; the last


def test_the_answer_runs_no_further_than_the_next_step_has_ids():
    trace = [_step(1, 64, 500, (1,)), _step(2, 200, 5, (1, 2, 3))]  # (the next turn cut short)
    assert _answers(trace)[0] == (2, 3)


def test_a_next_step_that_does_not_extend_the_prompt_says_nothing_of_the_answer():
    trace = [_step(1, 150, 100, (1, 2)), _step(2, 280, 20, (1, 9, 3, 4)),  # another second block
             _step(3, 400, 5, (1, 9, 3))]  # (too short to hold step 2's full prompt)
    assert _answers(trace) == [(), (), ()]


def test_other_tasks_tenants_block_sizes_and_prompts_without_their_ids_say_nothing():
    trace = [
        _step(1, 150, 100, (1, 2), task="x"), _step(2, 280, 20, (1, 2, 3, 4), task="y"),
        _step(1, 150, 100, (5, 6), task="t", tenant="a"),
        _step(2, 280, 20, (5, 6, 7, 8), task="t", tenant="b"),
        _step(1, 150, 100, (9, 10), task="u"),
        _step(2, 280, 20, tuple(range(9, 18)), task="u", block_size=32),  # (other tokens)
        _step(1, 150, 100, (20,), task="z"),  # (its second full block has no id)
        _step(2, 280, 20, (20, 21, 22, 23), task="z"),
        _step(1, 150, 100, (1, 2), task=None), _step(1, 280, 20, (1, 2, 3, 4), task=None),
    ]
    assert _answers(trace) == [()] * len(trace)


def test_a_prompt_under_one_block_has_answer_blocks_all_the_same():
    trace = [_step(1, 30, 120, ()), _step(2, 200, 5, (1, 2, 3))]
    assert _answers(trace)[0] == (1, 2)


def test_a_later_turn_hits_the_answer_before_it_on_the_worker_that_generated_it():
    """One worker, no eviction: each later turn hits every full block of the previous turn's
    prompt and answer whose KV was computed (all but the last token's). Before, the answer's
    blocks were never cached, and a turn hit the previous prompt's blocks alone."""
    trace = conversations(12)
    report, sim = simulate(trace, SimOptions(policy="round_robin", fleet="h100:1"))
    assert report["completed"] == len(trace)
    previous = previous_steps(trace)
    expected = 0
    for r, before in zip(trace, previous):
        if before is not None:
            p = trace[before]
            blocks = min((p.prompt_tokens + p.output_tokens - 1) // 64,
                         (r.prompt_tokens - 1) // 64, len(r.hash_ids))
            expected += blocks * 64
    queries, hits = sim.fleet.cache_tokens()
    assert queries == sum(r.prompt_tokens for r in trace)
    assert hits == expected


def test_the_router_hears_of_a_turns_answer_blocks_before_the_next_turn_is_routed():
    """The stored answer blocks reach the router's prefix index as a prompt's do, before the
    next turn is routed (before, only once that turn had computed them itself)."""
    trace = conversations(4, turns=2)
    sim = Simulation(trace, SimOptions(policy="kv_aware", fleet="h100:2"))
    core = sim.core
    heard: set[tuple[str, int]] = set()  # (worker, block)
    known_when_routed: dict[str, set[tuple[str, int]]] = {}  # request -> what was heard by then
    stored, route = core.kv_stored, core.route

    def kv_stored(worker_id, hashes, event_time_ms):
        heard.update((worker_id, h) for h in hashes)
        stored(worker_id, hashes, event_time_ms)

    def routed(request, now_ms, *args, **kwargs):
        known_when_routed.setdefault(request.request_id, set(heard))
        return route(request, now_ms, *args, **kwargs)

    core.kv_stored, core.route = kv_stored, routed
    sim.run()
    previous = previous_steps(trace)
    answers = answer_hashes(trace, previous)
    checked = 0
    for j, i in enumerate(previous):
        if i is None or not answers[i]:
            continue
        where = sim.outcomes.worker[i]
        assert {(where, h) for h in answers[i]} <= known_when_routed[f"r{j}"], (i, answers[i])
        checked += 1
    assert checked >= 2  # (a turn whose answer fills no block whole has none)
