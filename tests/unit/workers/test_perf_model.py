"""Tests of workers.sim.perf: interpolation, composition of a step, KV capacity, the formula
fallback. Tests marked ``needs_tables`` read ../shared/data in place and skip where it is absent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.sim.models import GPUS, MODELS, gpu_spec, model_spec, roofline_ms
from workers.sim.perf import (DECODE_TABLE, NO_OVERHEAD, PREFILL_TABLES, TABLES, VALIDATION,
                              Curve, KneeCurve, MeasuredTotals, PerfModel, default_data_dir,
                              isotonic, monotone_grid, pchip_slopes, read_table)

DATA = default_data_dir()
needs_tables = pytest.mark.skipif(not (DATA / TABLES / DECODE_TABLE).is_file(),
                                  reason=f"calibration tables not present under {DATA}")

#: README headline figures (ms): prefill 1k/4k/16k; decode at context 1k, batch 1/64/256.
HEADLINE = {
    "a100": ((79, 303, 1493), (11.0, 18.1, 41.9)),
    "h100": ((22, 93, 403), (6.6, 10.6, 19.8)),
    "h200": ((22, 94, 407), (5.3, 7.9, 15.5)),
}
TABLE_COMBOS = [("a100", "llama-3-8b", 1), ("h100", "llama-3-8b", 1), ("h200", "llama-3-8b", 1),
                ("a100", "llama-2-7b", 1), ("h100", "llama-2-7b", 1),
                ("a100", "llama-2-70b", 4), ("h100", "llama-2-70b", 4), ("h100", "llama-2-70b", 8)]


def formula(gpu: str = "h100", model: str = "llama-3-8b", tp: int = 1, *, tmp) -> PerfModel:
    return PerfModel.load(gpu, model, tp, data_dir=tmp / "no-such-dir")


# --- interpolation primitives -------------------------------------------------------------------

def test_linear_curve_hits_its_knots_exactly_and_is_linear_between():
    xs, ys = [16, 64, 256, 1024], [7.2, 7.5, 8.6, 22.4]
    curve = Curve(xs, ys, shape="linear")
    assert [curve(x) for x in xs] == ys
    assert curve(40) == pytest.approx((7.2 + 7.5) / 2)


def test_pchip_slopes_by_hand():
    # chords 1 and 2 on unit steps: interior = weighted harmonic mean 6 / (3/1 + 3/2) = 4/3;
    # ends = the three-point estimates (3*1 - 2)/2 = 0.5 and (3*2 - 1)/2 = 2.5
    assert pchip_slopes([0, 1, 2], [0, 1, 3]) == pytest.approx([0.5, 4 / 3, 2.5])
    # a local maximum, and a knot beside a flat segment, get slope 0
    assert pchip_slopes([0, 1, 2], [0, 1, 0])[1] == 0.0
    assert pchip_slopes([0, 1, 2, 3], [0, 0, 1, 1])[1:3] == [0.0, 0.0]
    assert pchip_slopes([0, 1], [2, 4]) == [2.0, 2.0]


def test_pchip_curve_is_the_hermite_cubic_between_knots():
    curve = Curve([0, 1, 2], [0, 1, 3])
    assert [curve(x) for x in (0, 1, 2)] == [0.0, 1.0, 3.0]
    # Hermite midpoint: (y0 + y1) / 2 + h (m0 - m1) / 8 = 0.5 + (0.5 - 4/3) / 8
    assert curve(0.5) == pytest.approx(0.5 + (0.5 - 4 / 3) / 8)
    # straight data stay straight
    line = Curve([0, 10, 30], [1.0, 2.0, 4.0])
    assert line(5) == pytest.approx(1.5) and line(20) == pytest.approx(3.0)


def test_pchip_curve_neither_overshoots_nor_dips_on_monotone_data():
    xs, ys = [0, 1, 2, 3, 4], [0.0, 0.0, 1.0, 1.0, 5.0]
    curve = Curve(xs, ys)
    samples = [curve(i / 100) for i in range(401)]
    assert all(a <= b + 1e-12 for a, b in zip(samples, samples[1:]))
    assert all(v == 0.0 for v in samples[:101])  # the flat segment stays flat
    assert all(0.0 <= v <= 1.0 for v in samples[100:301])


def test_knee_curve_recovers_a_smoothed_roofline_between_its_knots():
    # y = sqrt(4^2 + (0.01 x)^2): floor 4, slope 0.01, sharpness 2 (one of KNEE_SHARPNESS)
    xs = [100, 200, 400, 800, 1600]
    ys = [(16 + (0.01 * x) ** 2) ** 0.5 for x in xs]
    curve = KneeCurve(xs, ys)
    assert [curve(x) for x in xs] == pytest.approx(ys, abs=1e-12)
    assert curve(300) == pytest.approx(5.0)  # sqrt(16 + 9); a chord would give 5.06
    assert curve(50) == pytest.approx((16 + 0.25) ** 0.5)  # below: the knee itself
    last_chord = (ys[-1] - ys[-2]) / 800
    assert curve(2000) == pytest.approx(ys[-1] + last_chord * 400)  # above: the last chord
    table = curve.tabulated()
    assert [table(x) for x in xs] == pytest.approx(ys, abs=1e-12)
    assert table(300) == pytest.approx(5.0, rel=1e-4)
    assert table(50) == pytest.approx(curve(50), rel=1e-4) and table(0) == pytest.approx(4.0)
    assert table(2000) == pytest.approx(curve(2000))


def test_knee_curve_is_monotone_on_bumpy_non_decreasing_data_and_linear_when_short():
    xs = [16, 64, 128, 256, 512, 1024, 4096]
    ys = isotonic([6.4, 6.36, 6.45, 7.63, 10.47, 20.85, 83.7])  # H100 GEMM ms, a kink at 1024
    curve = KneeCurve(xs, ys)
    samples = [curve(x) for x in range(1, 5000)]
    assert all(a <= b + 1e-12 for a, b in zip(samples, samples[1:]))
    assert [curve(x) for x in xs] == pytest.approx(ys, abs=1e-12)
    hard = KneeCurve([1, 2, 4, 1000, 2000, 4000], [5.0, 5.0, 5.0, 10.0, 20.0, 40.0])
    assert hard.knee(2) - hard.knee(1) < 1e-9 * hard.knee(2)  # flat to rounding down here
    assert hard(1.5) == 5.0 and 5.0 <= hard(700) <= 10.0
    short = KneeCurve([100, 200], [1.0, 3.0])
    assert short(150) == pytest.approx(2.0) and short(10) == 1.0 and short.tabulated() is not None


def test_curve_ends_flat_below_linear_above_or_quadratic_and_low_linear_clipped_at_zero():
    curve = Curve([100, 200], [1.0, 3.0])
    assert curve(10) == 1.0
    assert curve(400) == pytest.approx(7.0)  # last slope 0.02 per unit
    assert Curve([100, 200], [1.0, 3.0], tail="quadratic")(400) == pytest.approx(12.0)
    low = Curve([100, 200], [1.0, 3.0], low="linear")
    assert low(75) == pytest.approx(0.5)
    assert low(0) == 0.0


def test_isotonic_keeps_a_monotone_series_and_pools_violations_to_their_mean():
    assert isotonic([1.0, 2.0, 2.0, 5.0]) == [1.0, 2.0, 2.0, 5.0]
    assert isotonic([1.0, 4.0, 2.0, 5.0]) == [1.0, 3.0, 3.0, 5.0]
    out = isotonic([58.2, 51.7, 53.9, 77.9])
    assert all(a <= b for a, b in zip(out, out[1:]))
    assert sum(out) == pytest.approx(58.2 + 51.7 + 53.9 + 77.9)


def test_monotone_grid_hits_a_monotone_grid_exactly_and_is_bilinear_inside():
    grid = monotone_grid([1, 4], [128, 1024], [[1.0, 2.0], [3.0, 6.0]])
    assert [grid(b, c) for b in (1, 4) for c in (128, 1024)] == [1.0, 2.0, 3.0, 6.0]
    assert grid(2.5, 576) == pytest.approx((1.5 + 4.5) / 2)


# --- names, API, capacity (no data needed) -------------------------------------------------------

@pytest.mark.parametrize("gpu, model", [("b200", "llama-3-8b"), ("h100", "gpt-4")])
def test_unknown_names_raise_a_value_error_listing_the_known_ones(gpu, model, tmp_path):
    with pytest.raises(ValueError) as info:
        PerfModel.load(gpu, model, data_dir=tmp_path)
    known = GPUS if gpu == "b200" else MODELS
    assert all(name in str(info.value) for name in known)


def test_bad_tp_and_a_model_that_does_not_fit_raise(tmp_path):
    with pytest.raises(ValueError):
        PerfModel.load("h100", "llama-3-8b", 0, data_dir=tmp_path)
    with pytest.raises(ValueError, match="does not fit"):
        PerfModel.load("h100", "llama-2-70b", 1, data_dir=tmp_path)


def test_kv_capacity_of_llama3_8b_on_h100_by_hand(tmp_path):
    perf = formula(tmp=tmp_path)
    memory = 81559 * 2**20  # nvidia-smi total of an H100-SXM 80GB
    weights = 8.03e9 * 2  # 16.06 GB
    reserve = (2**29  # non-torch memory
               + 8192 * 2 * (2 * 4096 + 3 * 14336)  # activations of an 8192-token profile pass
               + 2 * 256 * 128256 * 4)  # fp32 logits of 256 sequences, twice
    per_token = 2 * 32 * 8 * 128 * 2
    assert per_token == 128 * 1024 == perf.model.kv_bytes_per_token
    expected = int((memory * 0.9 - weights - reserve) // per_token)
    assert perf.kv_capacity_tokens() == expected
    assert 440_000 < expected < 460_000  # (76.97 GB - 16.06 GB - 1.64 GB) / 128 KiB
    assert perf.kv_capacity_blocks() == expected // 16
    assert perf.kv_capacity_blocks(32, 0.5) == perf.kv_capacity_tokens(0.5) // 32


def test_kv_capacity_splits_weights_and_kv_heads_across_tensor_parallel_ranks(tmp_path):
    perf = formula("h100", "llama-2-70b", 4, tmp=tmp_path)
    memory = 81559 * 2**20  # each of the four H100s
    weights = 68.98e9 * 2 / 4  # a quarter of the 137.96 GB each
    reserve = (2**29 + 392 * 2**20  # non-torch memory, NCCL buffers
               + 8192 * 2 * (2 * 8192 + 3 * 28672 / 4)  # a rank's share of the MLP activations
               + 2 * 256 * 32000 * 4)  # fp32 logits of 256 sequences, twice
    per_token = 2 * 80 * (8 // 4) * 128 * 2  # two of the eight KV heads on each rank: 80 KiB
    expected = int((memory * 0.9 - weights - reserve) // per_token)
    assert perf.kv_capacity_tokens() == expected
    assert 495_000 < expected < 500_000  # (76.97 GB - 34.49 GB - 1.63 GB) / 80 KiB


def test_the_helpers_are_special_cases_of_step_s(tmp_path):
    perf = formula(tmp=tmp_path)
    assert perf.step_s(0, 0, 0, 0) == 0.0
    assert perf.prefill_s(1000) == perf.step_s(1000, 0, 0, 0)
    assert perf.decode_step_s(32, 900.0) == perf.step_s(0, 0, 32, 900.0)
    assert 10 < perf.load_s() < 60


@pytest.mark.parametrize("gpu", sorted(HEADLINE))
def test_formula_fallback_is_within_15_percent_of_the_headline_figures(gpu, tmp_path):
    perf = formula(gpu, tmp=tmp_path)
    assert perf.source == "formula"
    prefill, decode = HEADLINE[gpu]
    for tokens, ms in zip((1024, 4096, 16384), prefill):
        assert perf.gpu_step_s(tokens, 0, 0, 0) * 1e3 == pytest.approx(ms, rel=0.15)
    for batch, ms in zip((1, 64, 256), decode):
        assert perf.gpu_step_s(0, 0, batch, 1024) * 1e3 == pytest.approx(ms, rel=0.15)


def test_data_dir_env_var_is_honoured(monkeypatch, tmp_path):
    monkeypatch.setenv("GOVERNOR_DATA_DIR", str(tmp_path / "empty"))
    assert PerfModel.load("h100", "llama-3-8b").source == "formula"


def test_roofline_tensor_parallel_is_faster_per_step_but_pays_for_all_reduce():
    gpu, model = GPUS["h100"], MODELS["llama-2-70b"]
    tp4 = roofline_ms(gpu, model, 4, 0, 0, 0, 32, 1000)
    tp8 = roofline_ms(gpu, model, 8, 0, 0, 0, 32, 1000)
    assert tp8 < tp4 < 2 * tp8


# --- properties: both sources -------------------------------------------------------------------

def _models(tmp) -> list[PerfModel]:
    models = [formula(g, m, tp, tmp=tmp) for g, m, tp in TABLE_COMBOS]
    if (DATA / TABLES / DECODE_TABLE).is_file():
        models += [PerfModel.load(g, m, tp) for g, m, tp in TABLE_COMBOS]
    return models


def test_remembered_step_times_equal_computed_ones_and_the_memory_is_bounded(tmp_path, monkeypatch):
    """A step time read back is bit-for-bit the one computed, also when the same step is asked
    with ints where floats were (or the other way round): the simulator's results hang on it."""
    import workers.sim.perf as perf_module

    steps = [(n, ctx, d, dctx, k) for n in (0, 1, 700, 8192) for ctx in (0, 0.0, 3000)
             for d in (0, 1, 37) for dctx in (0, 1024, 1024.0, 1537.25) for k in (1, 3)]
    for perf in _models(tmp_path):
        computed = []
        for args in steps:
            perf._steps.clear()
            computed.append(perf.step_s(*args))
        for args, value in zip(steps, computed):  # now mostly from memory, keyed as numbers
            assert perf.step_s(*args) == value, (perf, args)
    monkeypatch.setattr(perf_module, "STEP_MEMO", 10)
    perf = _models(tmp_path)[0]
    for n in range(1, 100):
        perf.step_s(n, 0, 0, 0)
    assert 0 < len(perf._steps) <= 10


def test_monotonic_in_tokens_batch_and_context(tmp_path):
    for perf in _models(tmp_path):
        prefill = [perf.prefill_s(n) for n in range(1, 40_000, 97)]
        assert all(a <= b for a, b in zip(prefill, prefill[1:])), perf
        for context in (0, 100, 1000, 5000, 30_000):
            decode = [perf.decode_step_s(b, context) for b in range(1, 600)]
            assert all(a <= b for a, b in zip(decode, decode[1:])), (perf, context)
        for batch in (1, 8, 64, 256):
            decode = [perf.decode_step_s(batch, c) for c in range(1, 40_000, 101)]
            assert all(a <= b for a, b in zip(decode, decode[1:])), (perf, batch)


@settings(max_examples=300, deadline=None)
@given(prefill=st.integers(1, 20_000), context=st.integers(0, 60_000), seqs=st.integers(1, 8),
       decode=st.integers(1, 300), decode_context=st.floats(1, 30_000), which=st.integers(0, 99))
def test_a_mixed_step_costs_at_least_its_parts(prefill, context, seqs, decode, decode_context,
                                               which, tmp_path_factory):
    models = _models(tmp_path_factory.getbasetemp())
    perf = models[which % len(models)]
    mixed = perf.step_s(prefill, context, decode, decode_context, prefill_seqs=seqs)
    alone = perf.step_s(prefill, context, 0, 0, prefill_seqs=seqs)
    assert mixed >= max(alone, perf.decode_step_s(decode, decode_context))
    assert mixed <= alone + perf.decode_step_s(decode, decode_context) + 1e-3  # no double floor


# --- the measured tables ------------------------------------------------------------------------

@needs_tables
@pytest.mark.parametrize("model", sorted(PREFILL_TABLES))
def test_prefill_reproduces_the_kernel_table_grid(model):
    """Knots are hit exactly (see the Curve tests); the knots themselves are the measured series
    made non-decreasing, which moves a few noisy points (H100 at 32/64 tokens) by up to ~1%."""
    rows = read_table(DATA / TABLES / PREFILL_TABLES[model])
    by_gpu = {g.label: g.name for g in GPUS.values()}
    errors = []
    for r in rows:
        perf = PerfModel.load(by_gpu[r["gpu"]], model)
        assert perf.source == "tables"
        ms = perf.gpu_step_s(int(r["prompt_tokens"]), 0, 0, 0) * 1e3
        errors.append(abs(ms / float(r["prefill_ms"]) - 1))
    assert max(errors) < 0.012 and sum(errors) / len(errors) < 0.003


@needs_tables
def test_decode_reproduces_the_kernel_table_grid():
    rows = read_table(DATA / TABLES / DECODE_TABLE)
    by_gpu = {g.label: g.name for g in GPUS.values()}
    errors = []
    for r in rows:
        perf = PerfModel.load(by_gpu[r["gpu"]], "llama-3-8b")
        ms = perf.gpu_step_s(0, 0, int(r["batch_size"]), int(r["context_tokens_per_seq"])) * 1e3
        errors.append(abs(ms / float(r["decode_step_ms"]) - 1))
    assert max(errors) < 0.01 and sum(errors) / len(errors) < 0.003


@needs_tables
def test_splitwise_70b_prefill_hits_its_monotone_grid_and_adds_no_overhead():
    perf = PerfModel.load("a100", "llama-2-70b", 4)
    assert perf.source == "tables" and perf.overhead == NO_OVERHEAD
    measured = {128: 63.65, 1024: 227.08, 8192: 2278.45}
    for tokens, ms in measured.items():
        assert perf.prefill_s(tokens) * 1e3 == pytest.approx(ms, abs=0.01)
    assert perf.step_s(512, 0, 16, 700) == perf.gpu_step_s(512, 0, 16, 700)


def test_splitwise_decode_uses_one_value_for_the_cell_both_sweeps_share():
    """Batch 1 at context 512 is on the batch sweep and the context sweep; the context sweep's
    monotone fit pools it with its neighbours (56 with 52 and 53 -> 53.67), and the batch sweep
    starts from that same value, so batch 1 follows the context fit at every context."""
    context = {128: 50.0, 512: 56.0, 1024: 52.0, 2048: 53.0}
    batch = {1: 56.0, 2: 57.0, 4: 58.0}
    decode = ([{"batch_size": 1, "prompt_tokens": c, "decode_step_ms_median": v}
               for c, v in context.items()]
              + [{"batch_size": b, "prompt_tokens": 512, "decode_step_ms_median": v}
                 for b, v in batch.items() if b > 1])
    prefill = [{"prompt_tokens": n, "prefill_ms_median": 100.0 * n / 1024} for n in (512, 1024)]
    totals = MeasuredTotals.from_rows(prefill, decode, gpu_spec("a100"),
                                      model_spec("llama-2-70b"), 2)
    pooled = (56.0 + 52.0 + 53.0) / 3
    for c in (512, 1024, 2048):
        assert totals.decode_ms(1, c) == pytest.approx(pooled)
    assert totals.decode_ms(1, 128) == pytest.approx(50.0)
    assert totals.decode_ms(2, 512) == pytest.approx(57.0)
    assert totals.decode_ms(4, 512) == pytest.approx(58.0)


@needs_tables
def test_combinations_without_tables_fall_back_to_the_formula():
    assert PerfModel.load("h200", "llama-2-70b", 4).source == "formula"
    assert PerfModel.load("h100", "llama-3-8b", 2).source == "formula"


@needs_tables
def test_h100_end_to_end_batches_within_15_percent_of_measured_vllm():
    perf = PerfModel.load("h100", "llama-3-8b")
    assert 0.5 < perf.overhead.base_ms < 2.0
    rows = [r for r in read_table(DATA / TABLES / VALIDATION)
            if r["gpu"].startswith("H100")]
    assert len(rows) == 20
    for r in rows:
        b, i, o = int(r["batch_size"]), int(r["input_len"]), int(r["output_len"])
        total = perf.step_s(b * i, 0, 0, 0, prefill_seqs=b)
        total += sum(perf.decode_step_s(b, i + k) for k in range(1, o))
        assert total == pytest.approx(float(r["measured_latency_s"]), rel=0.15), r
