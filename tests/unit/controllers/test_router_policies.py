"""Tests of controllers.router.policies: the baselines and Dynamo's KV-aware cost, by hand."""

from __future__ import annotations

import pytest

from controllers.router.placement import Placer
from controllers.router.policies import POLICIES, KvAware, RoundRobin, least_loaded, make_policy
from router_factories import candidate_factory, context_factory, request_factory


def test_round_robin_cycles_in_candidate_order() -> None:
    rr = RoundRobin()
    cands = [candidate_factory(f"w{i}", i) for i in range(3)]
    chosen = [rr(context_factory(), cands).chosen.worker.slot for _ in range(7)]
    assert chosen == [0, 1, 2, 0, 1, 2, 0]


def test_round_robin_takes_the_next_slot_per_model_whatever_the_candidates() -> None:
    """Two models on two workers each, their requests alternating: each model's requests go
    round its own workers (one counter for all of them sent every request of a model to the
    same worker), and a worker missing from the candidates this time is stepped over."""
    rr = RoundRobin()
    fleets = {"a": [candidate_factory(f"w{i}", i) for i in (0, 1)],
              "b": [candidate_factory(f"w{i}", i) for i in (2, 3)]}
    chosen = {"a": [], "b": []}
    for _ in range(4):
        for model, cands in fleets.items():
            ctx = context_factory(request_factory(model=model))
            chosen[model].append(rr(ctx, cands).chosen.worker.slot)
    assert chosen == {"a": [0, 1, 0, 1], "b": [2, 3, 2, 3]}
    three = [candidate_factory(f"w{i}", i) for i in (4, 5, 6)]
    ctx = context_factory(request_factory(model="c"))
    assert [rr(ctx, cands).chosen.worker.slot for cands in (three, three[::2], three)] == [4, 6, 4]


def test_round_robin_ignores_load_and_breakers() -> None:
    rr = RoundRobin()
    cands = [candidate_factory("busy", 0, running=50, breaker="open"), candidate_factory("idle", 1)]
    assert [rr(context_factory(), cands).chosen.worker.worker_id for _ in range(2)] == [
        "busy", "idle"]


@pytest.mark.parametrize(
    ("loads", "winner"),
    [
        # (slot, running, waiting, pending)
        ([(0, 2, 0, 0), (1, 0, 1, 0), (2, 0, 0, 3)], 1),
        ([(0, 1, 1, 1), (1, 0, 0, 2), (2, 4, 0, 0)], 1),  # 3, 2, 4
        ([(3, 0, 0, 1), (1, 1, 0, 0), (2, 0, 1, 0)], 1),  # all 1: the lowest slot
        ([(0, 0, 0, 5), (1, 3, 1, 0)], 1),  # pending dispatches count as load
    ],
)
def test_least_loaded_counts_running_waiting_and_pending(
        loads: list[tuple[int, int, int, int]], winner: int) -> None:
    cands = [candidate_factory(f"w{slot}", slot, running=r, waiting=w, pending=p)
             for slot, r, w, p in loads]
    placement = least_loaded(context_factory(), cands)
    assert placement.chosen.worker.slot == winner
    assert placement.scores == {}


# --- kv_aware: Dynamo's cost ---------------------------------------------------------------------
#
# cost = prefill_load_scale * max(prefill_blocks - overlap_score_credit * overlap_blocks, 0)
#        + decode_blocks
# prefill_blocks = (pending prompt tokens + waiting * 1024 typical + request prompt) / 16
# overlap_blocks = cached leading blocks * request block size / 16
# decode_blocks  = kv_blocks_used + request prompt / 16
#
# The request: 1024 prompt tokens in blocks of 64 (16 hashes), so 64 engine blocks.

def _kv_request_ctx():
    req = request_factory(prompt_tokens=1024, block_size=64, prefix_hashes=list(range(1, 17)))
    return context_factory(req)


def _kv_cands(a_used: int = 100) -> list:
    return [
        # A: half the prefix cached (8 x 64 = 512 tokens = 32 engine blocks), no backlog
        #    prefill 64, uncovered 64 - 32 = 32, decode a_used + 64
        candidate_factory("A", 0, overlap_blocks=8, kv_blocks_used=a_used),
        # B: nothing cached, 2048 pending prompt tokens and 1 waiting request (1024 assumed)
        #    prefill (2048 + 1024 + 1024) / 16 = 256, uncovered 256, decode 0 + 64
        candidate_factory("B", 1, pending=2, pending_prompt_tokens=2048, waiting=1),
        # C: all 16 blocks cached (64 engine blocks), no backlog
        #    prefill 64, uncovered 0, decode 150 + 64
        candidate_factory("C", 2, overlap_blocks=16, kv_blocks_used=150),
    ]


@pytest.mark.parametrize(
    ("a_used", "costs", "winner"),
    [
        (100, [32 + 164, 256 + 64, 0 + 214], "A"),  # 196, 320, 214
        (200, [32 + 264, 256 + 64, 0 + 214], "C"),  # 296, 320, 214
    ],
)
def test_kv_aware_cost_by_hand(a_used: int, costs: list[float], winner: str) -> None:
    policy, ctx, cands = KvAware(), _kv_request_ctx(), _kv_cands(a_used)
    assert [policy.cost(ctx, c) for c in cands] == pytest.approx(costs)
    assert policy(ctx, cands).chosen.worker.worker_id == winner


def test_kv_aware_scale_and_credit() -> None:
    policy = KvAware(prefill_load_scale=2.0, overlap_score_credit=0.5)
    ctx, cands = _kv_request_ctx(), _kv_cands()
    # A: 2 * max(64 - 0.5 * 32, 0) + 164 = 260; B: 2 * 256 + 64 = 576; C: 2 * (64 - 32) + 214 = 278
    assert [policy.cost(ctx, c) for c in cands] == pytest.approx([260, 576, 278])
    assert policy(ctx, cands).chosen.worker.worker_id == "A"


def test_kv_aware_overlap_credit_does_not_go_negative() -> None:
    policy = KvAware(overlap_score_credit=3.0)
    ctx = _kv_request_ctx()
    c = candidate_factory("C", 0, overlap_blocks=16, kv_blocks_used=10)
    assert policy.cost(ctx, c) == pytest.approx(0 + 10 + 64)  # max(64 - 192, 0) = 0


def test_kv_aware_ties_go_to_the_lower_slot() -> None:
    ctx = _kv_request_ctx()
    cands = [candidate_factory("x", 4), candidate_factory("y", 2), candidate_factory("z", 3)]
    assert KvAware()(ctx, cands).chosen.worker.worker_id == "y"


# --- the registry --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", POLICIES)
def test_every_named_policy_places_on_a_candidate(name: str) -> None:
    policy = make_policy(name)
    cands = [candidate_factory("a", 0), candidate_factory("b", 1)]
    assert policy(context_factory(), cands).chosen in cands


def test_governor_policy_is_the_placer_with_the_given_weights() -> None:
    policy = make_policy("governor", {"load": 1.0})
    assert isinstance(policy.__self__, Placer)
    assert policy.__self__.weights == {"load": 1.0}


def test_unknown_policy_raises_naming_it() -> None:
    with pytest.raises(ValueError, match="'fastest'"):
        make_policy("fastest")
