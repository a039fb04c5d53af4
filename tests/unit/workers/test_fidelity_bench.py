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
    assert "3.0%" in row and row.split()[-3:] == ["0.0", "20.0", "0.0"]
    assert "at most 3.0%; reversals along the sweeps up to 20.0%" in out
