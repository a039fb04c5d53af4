"""The fidelity benchmark's own arithmetic: reversals along a sweep, the held-out summary, and
the Splitwise noise section against a small raw file written here."""

from __future__ import annotations

import csv

import pytest

from benchmarks import fidelity
from workers.sim import perf as perf_mod


def test_reversal_is_the_largest_drop_to_the_next_point():
    assert fidelity.reversal([1.0, 2.0, 3.0]) == 0.0
    assert fidelity.reversal([50.0, 40.0, 60.0, 57.0]) == pytest.approx(20.0)


def test_ratio_of_two_points_or_a_dash_where_one_is_missing():
    assert fidelity.ratio({2048: 137.0, 4096: 390.0}, 2048, 4096) == "2.85"
    assert fidelity.ratio({2048: 137.0}, 2048, 4096) == "-"


def test_summary_keeps_interior_and_ends_apart():
    line = fidelity.summary("kernel", [0.5, -1.0], [2.0, -6.0, 4.0], [-12.0, 3.0])
    assert "interior max 6.0% mean 4.0% (1/3 > 5%)" in line
    assert "ends (extrapolated) max 12.0% (1/2 > 5%)" in line


def test_noise_section_measures_repeat_spread_and_the_same_prefill_across_runs(tmp_path, capsys):
    raw = tmp_path / fidelity.SPLITWISE_RAW
    raw.parent.mkdir(parents=True)
    with open(raw, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "hardware", "prompt_size", "batch_size", "token_size",
                    "prompt_time", "token_time", "tensor_parallel"])
        for model, gpu, tp in fidelity.SPLITWISE:
            label, hw = perf_mod.SPLITWISE_MODELS[model], perf_mod.SPLITWISE_GPUS[gpu]
            # 512-token prefill at two output lengths: medians 100 and 103 -> 3% apart; repeats
            # +-1 -> MAD 1, i.e. 1% and 0.97% (median of the two 0.985); decode 30 +- 0.3 -> 1%
            for tokens, base in ((128, 100.0), (256, 103.0)):
                for dt in (-1.0, 0.0, 1.0):
                    w.writerow([label, hw, 512, 1, tokens, base + dt, 30.0 + dt * 0.3, tp])

    class Tables:  # the published medians: one reversal of 20% along the batch sweep
        def splitwise_rows(self, model, gpu, tp):
            pre = [{"prompt_tokens": n, "prefill_ms_median": v} for n, v in ((128, 50), (256, 60))]
            dec = [{"batch_size": b, "prompt_tokens": 512, "decode_step_ms_median": v}
                   for b, v in ((1, 30.0), (32, 50.0), (64, 40.0))]
            return pre, dec

    fidelity.section_noise(Tables(), tmp_path)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("llama-2-70b a100 tp2"))
    assert row.split()[3:7] == ["0.99", "1.0", "1.00", "1.0"]
    assert "3.0%" in row and row.split()[-6:-3] == ["0.0", "20.0", "0.0"]
    assert row.split()[-2:] == ["-", "-"]  # no 2048/4096-token prefill, no batched runs here
    assert "at most 3.0%; reversals along the sweeps up to 20.0%" in out


def test_roofline_fit_hits_the_knots_and_recovers_an_exact_quadratic_between_them():
    xs = [128.0, 256.0, 512.0, 1024.0, 2048.0]
    ys = [40.0 + 0.05 * n + 1e-5 * n * n for n in xs]
    assert [fidelity.roofline_fit(xs, ys, n) for n in xs] == pytest.approx(ys)
    assert fidelity.roofline_fit(xs, ys, 768.0) == pytest.approx(40 + 0.05 * 768 + 1e-5 * 768 ** 2)


def test_alternatives_predict_a_point_without_seeing_it():
    xs, ys = [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 40.0]  # 3 -> 99 is a one-point feature
    errs = fidelity.alternatives_loo(xs, ys, 2)
    assert set(errs) == set(fidelity.ALTERNATIVES)
    assert errs["linear"] == pytest.approx(100 * (30 / 99 - 1))  # from 20 and 40 only


def test_neighbours_show_cost_per_token_and_the_step_ratios():
    line = fidelity.neighbours([1024, 2048, 4096], [100.0, 150.0, 450.0], 1)
    assert line == "us/token 1024:97.7 2048:73.2 4096:109.9, step ratios 1.50 3.00"


def test_decode_neighbours_name_the_same_kv_cells_and_the_gemm_beside_a_batch():
    def cell(attention, gemm):
        return {"attention_ms": attention, "linear_and_elementwise_ms": gemm}
    cells = {(8, 2048): cell(1.0, 5.0), (16, 1024): cell(1.5, 6.0), (32, 512): cell(1.1, 6.1),
             (8, 1024): cell(0.6, 5.0), (32, 1024): cell(2.0, 6.1)}
    line = fidelity.decode_neighbours(cells, "batch", 16, 1024)
    assert line == ("attention 1.50 ms, same b*c b8 c2048:1.00 b32 c512:1.10; "
                    "GEMM b8:5.00 b16:6.00 b32:6.10")
    sweep = {(1, 512): 30.0, (16, 512): 42.0, (32, 512): 52.3, (64, 512): 42.3, (1, 128): 29.0}
    assert fidelity.decode_neighbours(sweep, "batch", 32, 512) == (
        "sweep b16 c512:42.0 b32 c512:52.3 b64 c512:42.3")


def test_vidur_source_sums_the_layer_ops_of_tp1_rows_and_averages_repeats(tmp_path):
    path = tmp_path / "mlp.csv"
    ops = [f"time_stats.{op}.median" for op in fidelity.VIDUR_OPS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["num_tokens", "num_tensor_parallel_workers", *ops])
        w.writerow([128, 1, *[0.01] * len(ops)])   # 9 ops x 0.01 ms x 32 layers = 2.88 ms
        w.writerow([128, 1, *[0.02] * len(ops)])   # profiled twice: the mean, 4.32 ms
        w.writerow([128, 2, *[1.0] * len(ops)])    # TP 2: not the tables' recipe
        w.writerow([136, 1, *[0.03] * len(ops)])
    assert fidelity.vidur_linear_ms(path) == pytest.approx({128: 4.32, 136: 8.64})
