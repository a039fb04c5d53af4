"""Tests of controllers.router.scorers: each axis of placement scores candidates in [0, 1]."""

from __future__ import annotations

import pytest

from controllers.router import scorers
from controllers.router.candidates import perf_model
from controllers.router.scorers import DEFAULT_WEIGHTS, SCORERS
from router_factories import MODEL, candidate_factory, context_factory, request_factory


def test_every_scorer_has_a_default_weight() -> None:
    assert set(SCORERS) == set(DEFAULT_WEIGHTS)


# --- price ---------------------------------------------------------------------------------------

def _tokens_per_usd(gpu: str, usd_per_hour: float) -> float:
    """What the price scorer is documented to prefer: speed from the performance model / price."""
    return (1.0 / perf_model(gpu, MODEL).decode_step_s(32, 1024)) / usd_per_hour


def test_price_prefers_more_tokens_per_dollar_by_the_perf_model() -> None:
    a100 = candidate_factory("a", 0, gpu_type="a100", price_per_hour=1.8)
    h100 = candidate_factory("h", 1, gpu_type="h100", price_per_hour=3.0)
    value = {"a": _tokens_per_usd("a100", 1.8), "h": _tokens_per_usd("h100", 3.0)}
    assert value["a"] != pytest.approx(value["h"], rel=1e-3)  # the comparison means something
    best = max(value.values())

    scores = scorers.price(context_factory(), [a100, h100])

    assert scores == pytest.approx([value["a"] / best, value["h"] / best])
    winner = max(value, key=value.get)
    assert scores[["a", "h"].index(winner)] == 1.0
    assert min(scores) < 1.0


def test_price_ratio_follows_the_price_on_equal_gpus() -> None:
    cheap = candidate_factory("c", 0, price_per_hour=2.0)
    dear = candidate_factory("d", 1, price_per_hour=4.0)
    assert scorers.price(context_factory(), [cheap, dear]) == pytest.approx([1.0, 0.5])


@pytest.mark.parametrize(
    ("prices", "expected"),
    [((0.0, 3.0), [1.0, 0.0]),  # a free GPU beats any priced one
     ((0.0, 0.0), [1.0, 1.0])],  # all free: all equal
)
def test_price_of_free_gpus(prices: tuple[float, float], expected: list[float]) -> None:
    cands = [candidate_factory(f"w{i}", i, price_per_hour=p) for i, p in enumerate(prices)]
    assert scorers.price(context_factory(), cands) == expected


# --- kv_headroom ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("used", "free", "pending", "prompt_tokens", "expected"),
    [
        (0, 100, 0, 256, 1.0),
        (50, 50, 0, 256, 0.5),
        (0, 0, 0, 256, 0.5),  # unknown capacity: neutral
        (0, 100, 2, 256, 1.0 - 2 * (256 // 16 + 1) / 100),  # pending work takes blocks
        (90, 10, 1, 256, 0.0),  # over capacity: clamped at 0
    ],
)
def test_kv_headroom(used: int, free: int, pending: int, prompt_tokens: int,
                     expected: float) -> None:
    ctx = context_factory(request_factory(prompt_tokens=prompt_tokens))
    c = candidate_factory(kv_blocks_used=used, kv_blocks_free=free, pending=pending)
    assert scorers.kv_headroom(ctx, [c]) == [pytest.approx(expected)]


def test_kv_headroom_prefers_the_emptier_worker() -> None:
    ctx = context_factory()
    full = candidate_factory("f", 0, kv_blocks_used=900, kv_blocks_free=100)
    empty = candidate_factory("e", 1, kv_blocks_used=100, kv_blocks_free=900)
    s_full, s_empty = scorers.kv_headroom(ctx, [full, empty])
    assert s_empty > s_full


# --- prefix --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("hashes", "overlaps", "expected"),
    [
        ([1, 2, 3, 4], [0, 2, 4], [0.0, 0.5, 1.0]),
        ([1, 2, 3, 4], [1, 3], [0.25, 0.75]),
        ([], [0, 0], [0.0, 0.0]),  # no prefix hashes: the axis says nothing
    ],
)
def test_prefix_prefers_more_leading_blocks(hashes: list[int], overlaps: list[int],
                                            expected: list[float]) -> None:
    ctx = context_factory(request_factory(prompt_tokens=64, block_size=16, prefix_hashes=hashes))
    cands = [candidate_factory(f"w{i}", i, overlap_blocks=o) for i, o in enumerate(overlaps)]
    assert scorers.prefix(ctx, cands) == pytest.approx(expected)


# --- warmth --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("state", "expected"),
    [("warm", 1.0), ("loading", 0.3), ("starting", 0.0), ("sleeping", 0.0)],
)
def test_warmth(state: str, expected: float) -> None:
    assert scorers.warmth(context_factory(), [candidate_factory(state=state)]) == [expected]


# --- load and priority ---------------------------------------------------------------------------

def _loaded(loads: list[tuple[int, int, int]]) -> list:
    return [candidate_factory(f"w{i}", i, running=r, waiting=w, pending=p)
            for i, (r, w, p) in enumerate(loads)]


def test_load_prefers_fewer_running_waiting_and_pending() -> None:
    cands = _loaded([(0, 0, 0), (1, 1, 1), (4, 2, 1)])  # loads 0, 3, 7
    assert scorers.load(context_factory(), cands) == pytest.approx([1.0, 1 - 3 / 8, 1 - 7 / 8])


def test_load_of_an_idle_fleet_is_even() -> None:
    assert scorers.load(context_factory(), _loaded([(0, 0, 0)] * 3)) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("priority", [0, 3, 9])
def test_priority_blends_load_with_neutral(priority: int) -> None:
    cands = _loaded([(0, 0, 0), (3, 0, 0)])
    ctx = context_factory(request_factory(priority=priority))
    load = scorers.load(ctx, cands)
    p = priority / 9
    assert scorers.priority(ctx, cands) == pytest.approx([p * s + (1 - p) * 0.5 for s in load])


def test_priority_spreads_high_priority_requests_more() -> None:
    cands = _loaded([(0, 0, 0), (5, 0, 0)])

    def spread(priority: int) -> float:
        idle, busy = scorers.priority(context_factory(request_factory(priority=priority)), cands)
        return idle - busy

    assert spread(0) == 0.0  # the lowest class does not care where it goes
    assert 0.0 < spread(4) < spread(9)


# --- latency -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("budget_s", "ttft_s", "expected"),
    [(2.0, 0.0, 1.0), (2.0, 0.5, 0.75), (2.0, 1.0, 0.5), (2.0, 2.0, 0.0), (2.0, 3.0, 0.0),
     (0.0, 0.0, 1.0), (0.0, 0.01, 0.0), (-1.0, 0.5, 0.0)],
)
def test_latency_against_the_budget(budget_s: float, ttft_s: float, expected: float) -> None:
    ctx = context_factory(budget_s=budget_s)
    assert scorers.latency(ctx, [candidate_factory(predicted_ttft_s=ttft_s)]) == [
        pytest.approx(expected)]


# --- workflow ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("step", "steps_total", "affinity_score"),
    [(1, 1, 1.0), (1, 5, 0.6), (3, 5, 0.8), (5, 5, 1.0)],
)
def test_workflow_favours_the_affinity_worker(step: int, steps_total: int,
                                              affinity_score: float) -> None:
    ctx = context_factory(request_factory(task_id="t", step=step, steps_total=steps_total))
    cands = [candidate_factory("a", 0, affinity=True), candidate_factory("b", 1)]
    assert scorers.workflow(ctx, cands) == pytest.approx([affinity_score, 0.0])


def test_workflow_favours_affinity_more_late_in_a_task() -> None:
    cands = [candidate_factory("a", 0, affinity=True), candidate_factory("b", 1)]

    def pull(step: int) -> float:
        ctx = context_factory(request_factory(task_id="t", step=step, steps_total=5))
        mine, other = scorers.workflow(ctx, cands)
        return mine - other

    assert pull(5) > pull(4) > pull(1) > 0


# --- decode deadlines ----------------------------------------------------------------------------

def test_decode_deadlines_prefers_workers_where_fewer_requests_would_be_made_late() -> None:
    cands = [candidate_factory(f"w{i}", i) for i in range(3)]
    for c, at_risk in zip(cands, [0, 1, 3]):
        c.deadlines_at_risk = at_risk
    assert scorers.decode_deadlines(context_factory(), cands) == pytest.approx([1.0, 0.5, 0.25])


# --- pool_weight ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({}, [1.0, 1.0, 1.0]),  # no controller yet: neutral
        ({"p-a": 2.0, "p-b": 1.0}, [1.0, 0.5, 0.5]),  # a pool absent: no signal yet, weight 1
        ({"p-a": 0.05, "p-b": 0.5}, [0.05, 0.5, 1.0]),  # (before 7 Dec: 0, the worst)
        ({"p-a": 0.05, "p-b": 0.5, "p-c": 0.25}, [0.1, 1.0, 0.5]),  # all there: the best is 1
        ({"p-a": 0.0, "p-b": 0.0, "p-c": 0.0}, [0.0, 0.0, 0.0]),
    ],
)
def test_pool_weight(weights: dict[str, float], expected: list[float]) -> None:
    cands = [candidate_factory(f"w{i}", i, pool=p) for i, p in enumerate(["p-a", "p-b", "p-c"])]
    assert scorers.pool_weight(context_factory(pool_weights=weights), cands) == expected


# --- every scorer stays in [0, 1] ----------------------------------------------------------------

_MIXED = [
    dict(worker_id="w0", slot=0, gpu_type="a100", price_per_hour=1.8, overlap_blocks=4,
         predicted_ttft_s=0.05, kv_blocks_used=10, kv_blocks_free=90, affinity=True, pool="p-a"),
    dict(worker_id="w1", slot=1, gpu_type="h100", price_per_hour=3.0, overlap_blocks=0, pending=3,
         predicted_ttft_s=5.0, running=20, waiting=7, kv_blocks_used=99, kv_blocks_free=1,
         pool="p-b"),
    dict(worker_id="w2", slot=2, gpu_type="h200", price_per_hour=0.0, state="loading",
         predicted_ttft_s=30.0, pool="p-z"),
]


@pytest.mark.parametrize("name", sorted(SCORERS))
@pytest.mark.parametrize("priority", [0, 9])
def test_every_scorer_is_within_unit_interval(name: str, priority: int) -> None:
    req = request_factory(prompt_tokens=64, block_size=16, prefix_hashes=[1, 2, 3, 4],
                          priority=priority, task_id="t", step=2, steps_total=3)
    ctx = context_factory(req, budget_s=1.0, pool_weights={"p-a": 3.0, "p-b": 1.0})
    cands = [candidate_factory(**fields) for fields in _MIXED]
    scores = SCORERS[name](ctx, cands)
    assert len(scores) == len(cands)
    assert all(0.0 <= s <= 1.0 for s in scores), scores
