"""``benchmarks/gpu_profile.py``'s choice of points and order, its error without PyTorch, and the
committed H200 runs as ``benchmarks/fidelity.py`` reads them."""

import sys

import pytest

from benchmarks import gpu_profile
from benchmarks.fidelity import measured_runs
from benchmarks.gpu_profile import (BATCH_GRID, CONTEXT_GRID, PREFILL_GRID, between, interleave,
                                    decode_points, prefill_points)


def test_points_are_the_grid_then_the_points_between_then_the_sweep() -> None:
    assert between([16, 32, 64, 128]) == [24, 48, 96]
    assert between([1024, 2048, 3072]) == [1536, 2560]
    assert between([1, 2, 4]) == [1, 3]  # 1.5 has no token count: 1, already on the grid
    points = prefill_points()
    assert len(points) == len(set(points))
    grid_and_between = sorted(set(PREFILL_GRID) | set(between(PREFILL_GRID)))
    assert points[:len(grid_and_between)] == grid_and_between
    assert points[len(grid_and_between):] == [n for n in range(64, 4097, 64)
                                              if n not in grid_and_between]
    assert prefill_points(sweep=False) == grid_and_between
    cells = decode_points()
    assert cells[:len(BATCH_GRID) * len(CONTEXT_GRID)] == [(b, c) for b in BATCH_GRID
                                                          for c in CONTEXT_GRID]
    assert len(cells) == len(set(cells)) == 16 * 13


def test_interleave_keeps_each_order_and_the_proportion() -> None:
    a, b = list(range(3)), [f"d{i}" for i in range(9)]
    merged = interleave(a, b)
    assert sorted(merged, key=str) == sorted(a + b, key=str)
    assert [x for x in merged if x in a] == a and [x for x in merged if x in b] == b
    # a budget cut after a third of the points leaves a third of each
    first = merged[:4]
    assert sum(x in a for x in first) == 1 and sum(x in b for x in first) == 3


def test_without_pytorch_it_says_what_it_needs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(gpu_profile, "torch", None)
    monkeypatch.setattr(sys, "argv", ["gpu_profile", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="needs PyTorch with CUDA"):
        gpu_profile.main()


def test_the_committed_h200_runs_hold_their_points_in_order() -> None:
    runs = measured_runs("h200")
    assert set(runs) == {"unfused_1", "unfused_2", "unfused_3", "unfused_4",
                         "fused_1", "fused_2", "fused_3"}
    every_prefill, every_decode = prefill_points(), decode_points()
    for name, (prefill, decode, *_) in runs.items():
        # each run measured a prefix of the order: all of it, its grid and midpoints (fused_1),
        # or what its time budget allowed (fused_2, and the version 2 runs)
        tokens = [int(r["prompt_tokens"]) for r in prefill]
        cells = [(int(r["batch_size"]), int(r["context_tokens_per_seq"])) for r in decode]
        assert tokens == every_prefill[:len(tokens)]
        assert cells == every_decode[:len(cells)]
        for row in prefill + decode:  # the parts add up to the measured whole
            parts = sum(float(row[k]) for k in ("linear_and_elementwise_ms", "attention_ms",
                                                "lm_head_ms"))
            total = float(row.get("prefill_ms") or row["decode_step_ms"])
            assert parts == pytest.approx(total, abs=2e-3)
    for name in ("unfused_1", "unfused_2"):
        assert len(runs[name].prefill) == len(every_prefill)
        assert len(runs[name].decode) == len(every_decode)
    assert len(runs["fused_1"].prefill) == len(prefill_points(sweep=False))
    assert len(runs["fused_1"].decode) == len(every_decode)
    assert [name for name, run in runs.items() if run.fused] == ["fused_1", "fused_2", "fused_3"]
    # the runs of 4 Dec 2026 after the tool timed attention in place say so in their JSON
    assert [name for name, run in runs.items() if run.version == 2] == [
        "fused_3", "unfused_3", "unfused_4"]
    assert {run.version for run in runs.values()} == {1, 2}
