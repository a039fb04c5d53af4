"""Tests of controllers.router.filters and controllers.router.placement.Placer."""

from __future__ import annotations

import pytest

from controllers.router import filters
from controllers.router.placement import Placer
from controllers.router.scorers import SCORERS
from router_factories import candidate_factory, context_factory, request_factory

# --- filters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("breaker", "pending", "running", "waiting", "kept"),
    [
        ("closed", 0, 0, 0, True),
        ("closed", 3, 2, 1, True),
        ("open", 0, 0, 0, False),
        ("open", 2, 0, 0, False),
        ("half_open", 0, 0, 0, True),  # idle of probes: takes one
        ("half_open", 1, 0, 0, False),  # a probe is already pending
        ("half_open", 0, 1, 0, False),  # a probe runs there (its heartbeat counts it)
        ("half_open", 0, 0, 1, False),  # ... or is queued there
    ],
)
def test_breaker_open_filter(breaker: str, pending: int, running: int, waiting: int,
                             kept: bool) -> None:
    c = candidate_factory(breaker=breaker, pending=pending, running=running, waiting=waiting)
    assert filters.breaker_open(context_factory(), [c]) == ([c] if kept else [])


def test_breaker_open_filter_keeps_the_others_in_order() -> None:
    cands = [candidate_factory("a", 0), candidate_factory("b", 1, breaker="open"),
             candidate_factory("c", 2, breaker="half_open"), candidate_factory("d", 3)]
    kept = filters.breaker_open(context_factory(), cands)
    assert [c.worker.worker_id for c in kept] == ["a", "c", "d"]


@pytest.mark.parametrize(
    ("workers", "budget_s", "kept"),
    [
        # (id, state, predicted ttft)
        ([("w", "warm", 0.5), ("c", "loading", 30.0)], 2.0, ["w"]),  # a warm one fits
        ([("w", "warm", 3.0), ("c", "loading", 30.0)], 2.0, ["w", "c"]),  # no warm one fits
        ([("c", "loading", 30.0)], 2.0, ["c"]),
        ([("w1", "warm", 3.0), ("w2", "warm", 1.0), ("c", "loading", 0.1)], 2.0, ["w1", "w2"]),
        ([("w", "warm", 2.0), ("c", "loading", 0.1)], 2.0, ["w"]),  # exactly on budget fits
    ],
)
def test_cold_when_warm_fits_filter(workers: list[tuple[str, str, float]], budget_s: float,
                                    kept: list[str]) -> None:
    cands = [candidate_factory(wid, i, state=state, predicted_ttft_s=ttft)
             for i, (wid, state, ttft) in enumerate(workers)]
    out = filters.cold_when_warm_fits(context_factory(budget_s=budget_s), cands)
    assert [c.worker.worker_id for c in out] == kept


@pytest.mark.parametrize(
    ("has_deadline", "ttfts", "kept"),
    [
        (True, [0.5, 0.85, 1.0], [0, 1]),  # 15% headroom: 0.85 of a 1 s budget fits, 1.0 does not
        (True, [1.5, 3.0], []),
        (False, [1.5, 3.0], [0, 1]),  # no deadline: the budget is only a target
        (True, [0.84999, 0.85001], [0]),
    ],
)
def test_deadline_filter(has_deadline: bool, ttfts: list[float], kept: list[int]) -> None:
    cands = [candidate_factory(f"w{i}", i, predicted_ttft_s=t) for i, t in enumerate(ttfts)]
    out = filters.deadline(context_factory(budget_s=1.0, has_deadline=has_deadline), cands)
    assert [c.worker.slot for c in out] == kept


# --- the placer ----------------------------------------------------------------------------------

def _prefix_vs_idle() -> tuple:
    """``cached`` holds the whole prefix but is busy; ``idle`` holds none of it."""
    ctx = context_factory(request_factory(prompt_tokens=64, block_size=16,
                                          prefix_hashes=[1, 2, 3, 4]))
    cached = candidate_factory("cached", 0, overlap_blocks=4, running=4)
    idle = candidate_factory("idle", 1)
    return ctx, [cached, idle]


@pytest.mark.parametrize(
    ("weights", "winner", "scores"),
    [
        # cached: prefix 1, load 1 - 4/5 = 0.2; idle: prefix 0, load 1
        ({"prefix": 1.0, "load": 0.1}, "cached", {"prefix": 1.0, "load": 0.2}),  # 1.02 vs 0.1
        ({"prefix": 0.1, "load": 1.0}, "idle", {"prefix": 0.0, "load": 1.0}),  # 0.3 vs 1.0
        ({"prefix": 0.9, "load": 1.0}, "cached", {"prefix": 1.0, "load": 0.2}),  # 1.1 vs 1.0
        ({"prefix": 0.7, "load": 1.0}, "idle", {"prefix": 0.0, "load": 1.0}),  # 0.9 vs 1.0
    ],
)
def test_weights_decide_the_choice(weights: dict[str, float], winner: str,
                                   scores: dict[str, float]) -> None:
    ctx, cands = _prefix_vs_idle()
    placement = Placer(weights).place(ctx, cands)
    assert placement.chosen is not None
    assert placement.chosen.worker.worker_id == winner
    assert placement.scores == scores
    assert placement.filtered_out_by is None


def test_zero_weights_switch_a_scorer_off() -> None:
    placer = Placer({"prefix": 0.0, "load": 1.0})
    assert placer.weights == {"load": 1.0}
    ctx, cands = _prefix_vs_idle()
    placement = placer.place(ctx, cands)
    assert placement.chosen is cands[1]
    assert placement.scores == {"load": 1.0}


def test_the_placer_clamps_scores_into_the_unit_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer plugin that strays outside [0, 1] is clamped by the framework: unclamped, the
    rogue's 5 would win for ``busy``; clamped to 1 vs 0, the load score decides for ``idle``."""
    monkeypatch.setitem(SCORERS, "rogue", lambda ctx, cands: [5.0, -3.0])
    busy, idle = candidate_factory("busy", 0, running=4), candidate_factory("idle", 1)
    # rogue: busy 5 -> 1, idle -3 -> 0; load: busy 1 - 4/5 = 0.2, idle 1.0
    # totals: busy 1 + 1.5 * 0.2 = 1.3, idle 0 + 1.5 * 1.0 = 1.5
    placement = Placer({"rogue": 1.0, "load": 1.5}).place(context_factory(), [busy, idle])
    assert placement.chosen is idle
    assert placement.scores == {"rogue": 0.0, "load": 1.0}


@pytest.mark.parametrize(
    ("workers", "winner"),
    [
        # (id, slot, running): equal totals, so less load wins, then the lower slot
        ([("a", 0, 3), ("b", 1, 1)], "b"),
        ([("b", 1, 1), ("a", 0, 3)], "b"),
        ([("a", 5, 2), ("b", 2, 2)], "b"),
        ([("b", 2, 2), ("a", 5, 2)], "b"),
        ([("a", 7, 0), ("b", 3, 1), ("c", 4, 0)], "c"),
    ],
)
def test_ties_go_to_less_load_then_lower_slot(workers: list[tuple[str, int, int]],
                                             winner: str) -> None:
    cands = [candidate_factory(wid, slot, running=running) for wid, slot, running in workers]
    placement = Placer({"warmth": 1.0}).place(context_factory(), cands)  # all warm: all 1.0
    assert placement.chosen is not None and placement.chosen.worker.worker_id == winner


def test_placement_is_deterministic() -> None:
    ctx, cands = _prefix_vs_idle()
    placer = Placer()
    first = placer.place(ctx, cands)
    assert all(placer.place(ctx, cands) == first for _ in range(5))


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (dict(weights={"prefix": 1.0, "bogus": 1.0}), ["bogus"]),
        (dict(weights={"nope": 1.0, "warmth": 1.0, "zilch": 0.0}), ["nope", "zilch"]),
        (dict(filters=("deadline", "no_such_filter")), ["no_such_filter"]),
    ],
)
def test_unknown_scorer_or_filter_names_raise(kwargs: dict, names: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        Placer(**kwargs)
    for name in names:
        assert name in str(info.value)


def test_set_weights_rejects_unknown_names_and_keeps_the_old_weights() -> None:
    placer = Placer({"load": 1.0})
    with pytest.raises(ValueError, match="typo"):
        placer.set_weights({"typo": 2.0})
    assert placer.weights == {"load": 1.0}


@pytest.mark.parametrize(
    ("cands", "ctx", "filter_name"),
    [
        ([candidate_factory("a", 0, breaker="open"),
          candidate_factory("b", 1, breaker="half_open", pending=1)],
         context_factory(), "breaker_open"),
        ([candidate_factory("a", 0, predicted_ttft_s=3.0),
          candidate_factory("b", 1, predicted_ttft_s=2.5)],
         context_factory(budget_s=1.0, has_deadline=True), "deadline"),
    ],
)
def test_the_filter_that_left_no_candidate_is_reported(cands: list, ctx, filter_name: str) -> None:
    placement = Placer().place(ctx, cands)
    assert placement.chosen is None
    assert placement.scores == {}
    assert placement.filtered_out_by == filter_name


def test_filters_run_in_order_and_only_survivors_are_scored() -> None:
    """The open-breaker worker would win on prefix; it is filtered out first."""
    ctx = context_factory(request_factory(prompt_tokens=64, block_size=16,
                                          prefix_hashes=[1, 2, 3, 4]))
    broken = candidate_factory("broken", 0, overlap_blocks=4, breaker="open")
    late = candidate_factory("late", 1, predicted_ttft_s=50.0)
    fine = candidate_factory("fine", 2, predicted_ttft_s=0.2)
    placement = Placer().place(ctx, [broken, late, fine])
    assert placement.chosen is fine
    assert Placer(filters=()).place(ctx, [broken, late, fine]).chosen is broken


@pytest.mark.parametrize("score", [-1, -0.0, 0, 0.0, 1e-300, 0.5, 0.9999999999, 1, 1.0, 2,
                                   float("inf"), float("-inf"), float("nan")])
def test_scores_are_clamped_as_min_max_clamps_them(score: float) -> None:
    from controllers.router.placement import _clamped

    [clamped] = _clamped([score])
    assert repr(clamped) == repr(min(1.0, max(0.0, score)))
