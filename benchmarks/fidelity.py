"""Fidelity of the simulated engine's performance model against the measurements it came from.

    python -m benchmarks.fidelity [--data-dir DIR]

Sections (each ends with a one-line ``SUMMARY``):
1. prefill latency per model / GPU / TP: the model at the tables' grid points, and held out
   (leave-one-out: drop a point, rebuild the model from the rest, predict it; the ends of a grid
   are then extrapolations), plus linear against log-log interpolation on interior points;
1c. between the grid points, where the tables' own source was measured (Vidur's A100 op profiles,
   every 8-16 tokens): the model's GEMM and elementwise part against that source;
2. decode-step latency the same way, leaving out a whole batch row or context column at a time;
2b. the Splitwise measurements' own noise, from their raw repeats (the floor under sections 1-2);
3. end-to-end batch latency against LLM-Inference-Bench's measured vLLM runs (Llama-3-8B);
4. the roofline formula against the tables;
5. the cost of one ``step_s`` call;
6. against dense measurements on a real H200 (``benchmarks/gpu_profile.py``, committed under
   ``benchmarks/results/gpu_profile``): the runs' repeat noise and the tool's two versions against
   each other, the interpolation rebuilt from the measurements' own grid points and held out
   between them, and the simulated engine's level.
Errors are (model / measured - 1) in %. Kernel-table figures compare the GPU time only (the tables
leave out vLLM's CPU work); Splitwise figures are end-to-end on both sides.
"""

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from workers.sim import perf as perf_mod
from workers.sim.models import gpu_spec, model_spec
from workers.sim.perf import (KernelTables, MeasuredTotals, PerfModel, StepOverhead,
                              default_data_dir, read_table)

KERNEL = [("llama-3-8b", g) for g in ("a100", "h100", "h200")] + [("llama-2-7b", g)
                                                                  for g in ("a100", "h100")]
SPLITWISE = [("llama-2-70b", g, tp) for g in ("a100", "h100") for tp in (2, 4, 8)]
TARGET = 5.0
SPLITWISE_RAW = Path("calibration") / "splitwise_perf_model" / "perf_model.csv"
#: The A100 tables' linear column is a sum of Vidur's per-layer op profiles, which are measured
#: every 8-16 tokens: the points between the tables' grid values that the tables were built from.
VIDUR = {("llama-3-8b", "a100"): "a100/meta-llama/Meta-Llama-3-8B",
         ("llama-2-7b", "a100"): "a100/meta-llama/Llama-2-7b-hf"}
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
LAYERS = 32
MEASURED = Path(__file__).parent / "results" / "gpu_profile"
#: Multiply-adds per token of Llama-3-8B's 32 layers' GEMMs (QKV, O, gate_up, down).
LINEAR_MACS = LAYERS * 4096 * (6144 + 4096 + 2 * 14336 + 14336)
#: Bytes of one layer's keys (or values) per token of Llama-3-8B: 8 KV heads of 128, bf16.
KV_BYTES = 8 * 128 * 2


def err(sim: float, meas: float) -> float:
    return 100.0 * (sim / meas - 1.0)


def stats(errs: list[float]) -> str:
    a = np.abs(errs) if errs else np.zeros(1)
    return f"{a.max():6.1f} {a.mean():6.1f}"


def over(errs: list[float]) -> int:
    return sum(abs(e) > TARGET for e in errs)


def summary(family: str, grid: list[float], interior: list[float], ends: list[float]) -> str:
    """One family's grid, interior held-out (the target) and end held-out figures."""
    return (f"{family}: grid max {max(map(abs, grid)):.1f}% mean {np.mean(np.abs(grid)):.1f}%, "
            f"held-out interior max {max(map(abs, interior)):.1f}% mean "
            f"{np.mean(np.abs(interior)):.1f}% ({over(interior)}/{len(interior)} > 5%), ends "
            f"(extrapolated) max {max(map(abs, ends)):.1f}% ({over(ends)}/{len(ends)} > 5%)")


def interp(xs: list[float], ys: list[float], x: float, loglog: bool) -> float:
    if loglog:
        return math.exp(np.interp(math.log(x), np.log(xs), np.log(ys)))
    return float(np.interp(x, xs, ys))


def method_loo(xs: list[float], ys: list[float], loglog: bool) -> list[float]:
    """Leave-one-out over interior points of one series, plain interpolation of the totals."""
    return [err(interp(xs[:i] + xs[i + 1:], ys[:i] + ys[i + 1:], xs[i], loglog), ys[i])
            for i in range(1, len(xs) - 1)]


def roofline_fit(xs: list[float], ys: list[float], x: float) -> float:
    """y(x) from ``a + b n + c n^2`` (fixed step cost, weights-bound linear work, attention),
    least squares on the relative error over all the knots, then each knot's ratio to the fit
    interpolated in log n, so the knots are hit exactly and the fit shapes the gaps."""
    n, y = np.asarray(xs, float), np.asarray(ys, float)
    coef = np.linalg.lstsq(np.stack([n ** 0, n, n * n], axis=1) / y[:, None], np.ones_like(y),
                           rcond=None)[0]
    fit = np.stack([n ** 0, n, n * n], axis=1) @ coef
    return float(coef @ [1.0, x, x * x]) * float(np.interp(math.log(x), np.log(n), y / fit))


#: Other ways to predict a held-out prefill total from the rest of its series, for comparison.
ALTERNATIVES = {
    "linear": lambda xs, ys, x: interp(xs, ys, x, False),
    "log-log": lambda xs, ys, x: interp(xs, ys, x, True),
    "monotone cubic": lambda xs, ys, x: perf_mod.Curve(xs, ys)(x),
    "a+bn+cn^2 fit": roofline_fit,
}


def alternatives_loo(xs: list[float], ys: list[float], i: int) -> dict[str, float]:
    """Each alternative's error on point i of the totals, predicted from the other points."""
    rest_x, rest_y = xs[:i] + xs[i + 1:], ys[:i] + ys[i + 1:]
    return {name: err(f(rest_x, rest_y, xs[i]), ys[i]) for name, f in ALTERNATIVES.items()}


def neighbours(xs: list[float], ys: list[float], i: int) -> str:
    """The held-out point and its two neighbours as cost per token (us), and the ratio from one
    doubling-ish step to the next: what a curve through the neighbours would have to bend to."""
    per = [f"{xs[k]}:{1e3 * ys[k] / xs[k]:.1f}" for k in (i - 1, i, i + 1)]
    steps = [f"{ys[k + 1] / ys[k]:.2f}" for k in (i - 1, i)]
    return f"us/token {' '.join(per)}, step ratios {' '.join(steps)}"


class Tables:
    def __init__(self, data_dir: Path) -> None:
        t = data_dir / perf_mod.TABLES
        self.dir = t
        self.prefill = {m: read_table(t / f) for m, f in perf_mod.PREFILL_TABLES.items()}
        self.decode = read_table(t / perf_mod.DECODE_TABLE)
        self.sw_prefill = read_table(t / perf_mod.SPLITWISE_PREFILL)
        self.sw_decode = read_table(t / perf_mod.SPLITWISE_DECODE)
        self.validation = read_table(t / perf_mod.VALIDATION)

    def kernel_rows(self, model: str, gpu: str) -> tuple[list[dict], list[dict]]:
        label = gpu_spec(gpu).label
        return ([r for r in self.prefill[model] if r["gpu"] == label],
                [r for r in self.decode if r["gpu"] == label])

    def splitwise_rows(self, model: str, gpu: str, tp: int) -> tuple[list[dict], list[dict]]:
        label, hw = perf_mod.SPLITWISE_MODELS[model], perf_mod.SPLITWISE_GPUS[gpu]

        def mine(r):
            return r["model"] == label and r["hardware"] == hw and int(r["tensor_parallel"]) == tp
        return [r for r in self.sw_prefill if mine(r)], [r for r in self.sw_decode if mine(r)]


def kernel_backend(model: str, gpu: str, prefill: list[dict], decode: list[dict]) -> KernelTables:
    donor = model != "llama-3-8b"
    scale = model_spec(model).kv_bytes_per_token / model_spec("llama-3-8b").kv_bytes_per_token
    return KernelTables.from_rows(prefill, decode, decode_is_donor=donor,
                                  kv_context_scale=scale if donor else 1.0)


def section_prefill(tables: Tables) -> None:
    print("\n== 1. prefill latency (batch 1) ==")
    print(f"{'config':24} {'n':>3} {'grid max':>8} {'mean':>6} | {'LOO max':>7} {'mean':>6} "
          f"{'>5%':>4} {'ends':>8} | {'lin max':>7} {'mean':>6} {'loglog max':>10} {'mean':>6} | "
          "held-out >5% at")
    acc = {k: ([], [], []) for k in ("kernel", "splitwise")}  # grid, interior, ends
    others = {k: {a: [] for a in ALTERNATIVES} for k in acc}  # interior, per alternative
    misses = []
    lin_all, log_all = [], []
    configs = [(m, g, 1) for m, g in KERNEL] + SPLITWISE
    for model, gpu, tp in configs:
        if tp == 1:
            pre, dec = tables.kernel_rows(model, gpu)
            key, meas_key = "prompt_tokens", "prefill_ms"

            def build(p, _dec=dec, _model=model, _gpu=gpu):
                n_out = {int(r["prompt_tokens"]) for r in pre} - {int(r["prompt_tokens"]) for r in p}
                d = [r for r in _dec if int(r["batch_size"]) not in n_out] or _dec
                return kernel_backend(_model, _gpu, p, d)
        else:
            pre, dec = tables.splitwise_rows(model, gpu, tp)
            key, meas_key = "prompt_tokens", "prefill_ms_median"

            def build(p, _dec=dec, _model=model, _gpu=gpu, _tp=tp):
                return MeasuredTotals.from_rows(p, _dec, gpu_spec(_gpu), model_spec(_model), _tp)
        if not pre:
            continue
        pre = sorted(pre, key=lambda r: int(r[key]))
        xs = [int(r[key]) for r in pre]
        ys = [float(r[meas_key]) for r in pre]
        full = build(pre)
        grid = [err(full.gpu_ms(n, 0, 1, 0, 0), y) for n, y in zip(xs, ys)]
        loo, bad = [], []
        for i, (n, y) in enumerate(zip(xs, ys)):
            e = err(build(pre[:i] + pre[i + 1:]).gpu_ms(n, 0, 1, 0, 0), y)
            loo.append(e)
            if abs(e) > TARGET:
                bad.append(f"{n}{'(end)' if i in (0, len(xs) - 1) else ''}:{e:+.0f}")
        interior, ends = loo[1:-1], [loo[0], loo[-1]]
        lin, log = method_loo(xs, ys, False), method_loo(xs, ys, True)
        name = f"{model} {gpu}" + (f" tp{tp}" if tp > 1 else "")
        gemm = [float(r["linear_and_elementwise_ms"]) for r in pre] if tp == 1 else None
        for i in range(1, len(xs) - 1):
            alt = alternatives_loo(xs, ys, i)
            for a, e in alt.items():
                others["kernel" if tp == 1 else "splitwise"][a].append(e)
            if abs(loo[i]) > TARGET:
                misses.append((name, xs[i], loo[i], alt, neighbours(xs, ys, i),
                               gemm and neighbours(xs, gemm, i)))
        family = acc["kernel" if tp == 1 else "splitwise"]
        family[0].extend(grid)
        family[1].extend(interior)
        family[2].extend(ends)
        lin_all += lin
        log_all += log
        print(f"{name:24} {len(xs):>3} {stats(grid):>15} | {stats(interior)} {over(interior):>4} "
              f"{ends[0]:+4.0f}{ends[1]:+4.0f} | {stats(lin)} {stats(log):>17} | {' '.join(bad)}")
    print("LOO: the interior points (interpolation, the +-5% target); 'ends': the first and last "
          "points, which held out are extrapolations, shown apart")
    print("SUMMARY [1 prefill] " + "; ".join(summary(f, *v) for f, v in acc.items())
          + f"; interpolating totals (interior): "
          f"linear mean {np.mean(np.abs(lin_all)):.1f}% vs log-log {np.mean(np.abs(log_all)):.1f}%")
    prefill_misses(misses, others)


def prefill_misses(misses: list[tuple], others: dict[str, dict[str, list[float]]]) -> None:
    """The interior held-out misses, each with its neighbours and what other predictors make of
    it, and how those predictors do over all interior points."""
    print("\n== 1b. prefill held-out misses (> 5%): their neighbours, other predictors ==")
    names = list(ALTERNATIVES)
    print(f"{'config':24} {'tokens':>6} {'model':>6} | " + " ".join(f"{a:>14}" for a in names)
          + " | neighbours (total; then GEMM alone for kernel tables)")
    for name, n, e, alt, total, gemm in misses:
        print(f"{name:24} {n:>6} {e:+6.1f} | " + " ".join(f"{alt[a]:+14.1f}" for a in names)
              + f" | {total}" + (f"; GEMM {gemm}" if gemm else ""))
    print("a point is a feature of its table when its cost per token is above or below both "
          "neighbours', or its step ratio breaks from the next one: a curve through the "
          "neighbours cannot bend to it (the other predictors miss it too)")
    line = []
    for family, by_alt in others.items():
        line.append(f"{family}: " + ", ".join(
            f"{a} max {max(map(abs, e)):.1f}% mean {np.mean(np.abs(e)):.1f}% ({over(e)}/{len(e)})"
            for a, e in by_alt.items()))
    print("SUMMARY [1b prefill misses] " + f"{len(misses)} interior points over 5%; other "
          "predictors on the interior totals (max, mean, points over 5%): " + "; ".join(line))


def vidur_linear_ms(path: Path) -> dict[int, float]:
    """GEMM and elementwise ms per token count, summed as the A100 tables sum it: 32 layers of the
    medians of ``VIDUR_OPS`` (one residual add), at TP 1, the mean where a count is profiled
    twice. It reproduces the tables' ``linear_and_elementwise_ms`` at their grid points."""
    sums: dict[int, list[float]] = {}
    for r in read_table(path):
        if int(r["num_tensor_parallel_workers"]) == 1:
            ms = LAYERS * sum(float(r[f"time_stats.{op}.median"]) for op in VIDUR_OPS)
            sums.setdefault(int(r["num_tokens"]), []).append(ms)
    return {n: float(np.mean(v)) for n, v in sums.items()}


def section_between(tables: Tables, data_dir: Path) -> None:
    """The model between the grid points, against the kernel profiles the tables were built
    from (the A100 tables' GEMM and elementwise part: Vidur profiles every 8-16 tokens)."""
    print("\n== 1c. between the grid points: the GEMM and elementwise part against the tables' "
          "own source (A100) ==")
    print(f"{'config':24} {'recipe at grid':>14} | {'points':>6} {'max':>6} {'mean':>6} {'>5%':>4} "
          f"| {'mean signed':>13} {'model low':>9} | worst (tokens:%)")
    line = []
    for (model, gpu), sub in VIDUR.items():
        path = data_dir / "calibration" / "vidur_profiling" / sub / "mlp.csv"
        if not path.is_file():
            print(f"{path} not found: skipped")
            continue
        pre, dec = tables.kernel_rows(model, gpu)
        grid = {int(r["prompt_tokens"]): float(r["linear_and_elementwise_ms"]) for r in pre}
        source = vidur_linear_ms(path)
        recipe = max(abs(err(source[n], y)) for n, y in grid.items())
        gemm = kernel_backend(model, gpu, pre, dec).gemm
        between = {n: err(gemm(n), y) for n, y in source.items()
                   if min(grid) < n < max(grid) and n not in grid}
        errs = list(between.values())
        worst = sorted(between.items(), key=lambda t: -abs(t[1]))[:4]
        name = f"{model} {gpu}"
        below = sum(e < 0 for e in errs)
        print(f"{name:24} {recipe:13.2f}% | {len(errs):>6} {stats(errs)} {over(errs):>4} | "
              f"{np.mean(errs):+12.1f}% {below:>4}/{len(errs):<4} | "
              + " ".join(f"{n}:{e:+.0f}" for n, e in worst))
        line.append(f"{name} {len(errs)} points max {max(map(abs, errs)):.1f}% mean "
                    f"{np.mean(np.abs(errs)):.1f}% ({over(errs)} > 5%)")
    print("recipe at grid: the largest difference between the source summed as the tables sum it "
          "and the tables' grid values; error: the model (the curve through the grid) against the "
          "source. The source climbs in steps (a GEMM adds a row of tiles just past multiples "
          "of 128 tokens: 13.2 ms at 128, 18.1 at 136 for Llama-3-8B) and the grid's powers of "
          "two sit at the foot of a step, so the curve through them runs low in between")
    print("SUMMARY [1c between grid points, A100 GEMM+elementwise vs its source] "
          + "; ".join(line))


def _decode_kernel(tables: Tables, model: str, gpu: str):
    pre, dec = tables.kernel_rows(model, gpu)
    meas = {(int(r["batch_size"]), int(r["context_tokens_per_seq"])): float(r["decode_step_ms"])
            for r in dec}
    full = kernel_backend(model, gpu, pre, dec)
    loo = []
    for axis in ("batch_size", "context_tokens_per_seq"):
        values = sorted({int(r[axis]) for r in dec})
        for v in values:
            d = [r for r in dec if int(r[axis]) != v]
            p = [r for r in pre if axis != "batch_size" or int(r["prompt_tokens"]) != v]
            m = kernel_backend(model, gpu, p, d)
            loo += [(axis[:5], b, c, err(m.gpu_ms(0, 0, 1, b, c), y), v in (values[0], values[-1]))
                    for (b, c), y in meas.items() if (b if axis == "batch_size" else c) == v]
    return meas, full, loo


def _decode_splitwise(tables: Tables, model: str, gpu: str, tp: int):
    pre, dec = tables.splitwise_rows(model, gpu, tp)
    meas = {(int(r["batch_size"]), int(r["prompt_tokens"])): float(r["decode_step_ms_median"])
            for r in dec}
    spec_g, spec_m = gpu_spec(gpu), model_spec(model)
    full = MeasuredTotals.from_rows(pre, dec, spec_g, spec_m, tp)
    last_batch = max(b for b, _ in meas)
    contexts = sorted(c for b, c in meas if b == 1)
    loo = []
    for (b, c), y in meas.items():
        if (b, c) == (1, perf_mod.SPLITWISE_DECODE_CONTEXT):
            continue  # on both sweeps: its neighbours along either axis remain
        d = [r for r in dec if (int(r["batch_size"]), int(r["prompt_tokens"])) != (b, c)]
        m = MeasuredTotals.from_rows(pre, d, spec_g, spec_m, tp)
        end = b == last_batch if b > 1 else c in (contexts[0], contexts[-1])
        loo.append(("batch" if b > 1 else "conte", b, c, err(m.gpu_ms(0, 0, 1, b, c), y), end))
    return meas, full, loo


def section_decode(tables: Tables) -> None:
    print("\n== 2. decode-step latency ==")
    print(f"{'config':24} {'n':>3} {'grid max':>8} {'mean':>6} | {'LOO max':>7} {'mean':>6} "
          f"{'>5%':>4} | {'ends max':>8} {'>5%':>4} | {'lin b/c mean':>12} "
          f"{'loglog b/c mean':>15} | "
          "worst interior held-out (axis b c %)")
    acc = {k: ([], [], []) for k in ("kernel", "splitwise")}  # grid, interior, ends
    misses = []
    lin_all, log_all = [], []
    configs = [(m, g, 1) for m, g in KERNEL if m == "llama-3-8b"] + SPLITWISE
    for model, gpu, tp in configs:
        meas, full, loo = (_decode_kernel(tables, model, gpu) if tp == 1
                           else _decode_splitwise(tables, model, gpu, tp))
        grid = [err(full.gpu_ms(0, 0, 1, b, c), y) for (b, c), y in meas.items()]
        batches, contexts = sorted({b for b, _ in meas}), sorted({c for _, c in meas})
        lin, log = [], []
        for c in contexts:  # along batch, at each context that has a batch sweep
            bs = [b for b in batches if (b, c) in meas]
            if len(bs) > 2:
                lin += method_loo(bs, [meas[b, c] for b in bs], False)
                log += method_loo(bs, [meas[b, c] for b in bs], True)
        for b in batches:
            cs = [c for c in contexts if (b, c) in meas]
            if len(cs) > 2:
                lin += method_loo(cs, [meas[b, c] for c in cs], False)
                log += method_loo(cs, [meas[b, c] for c in cs], True)
        interior = [e for *_, e, end in loo if not end]
        ends = [e for *_, e, end in loo if end]
        family = acc["kernel" if tp == 1 else "splitwise"]
        family[0].extend(grid)
        family[1].extend(interior)
        family[2].extend(ends)
        lin_all += lin
        log_all += log
        worst = sorted((t for t in loo if not t[4]), key=lambda t: -abs(t[3]))[:3]
        name = f"{model} {gpu}" + (f" tp{tp}" if tp > 1 else "")
        cells = ({(int(r["batch_size"]), int(r["context_tokens_per_seq"])): r
                  for r in tables.kernel_rows(model, gpu)[1]} if tp == 1 else meas)
        misses += [(name, axis, b, c, e, decode_neighbours(cells, axis, b, c))
                   for axis, b, c, e, end in loo if not end and abs(e) > TARGET]
        print(f"{name:24} {len(meas):>3} {stats(grid):>15} | {stats(interior)} "
              f"{over(interior):>4} | {max(map(abs, ends)):8.1f} {over(ends):>4} | "
              f"{np.mean(np.abs(lin)):12.1f} {np.mean(np.abs(log)):15.1f} | "
              + " ".join(f"{a} {b} {c} {e:+.0f}" for a, b, c, e, _ in worst))
    print("LOO: kernel tables leave out a whole batch row or context column, Splitwise one point; "
          "'ends' (the first or last row / column / point of a sweep) are extrapolations, "
          "shown apart")
    print("(llama-2-7b has no decode table: its decode is derived from llama-3-8b's, not checked)")
    print("SUMMARY [2 decode] " + "; ".join(summary(f, *v) for f, v in acc.items())
          + f"; interpolating totals (interior): "
          f"linear mean {np.mean(np.abs(lin_all)):.1f}% vs log-log {np.mean(np.abs(log_all)):.1f}%")
    print("\n== 2c. decode held-out misses (> 5%) and their neighbours ==")
    for name, axis, b, c, e, near in misses:
        print(f"{name:24} {axis} b{b} c{c} {e:+6.1f}% | {near}")
    print("kernel tables: decode attention is mostly a function of the KV tokens read (b x c), so "
          "a point well above or below the other cells with the same b x c, or a GEMM step "
          "between neighbouring batches, is a feature of that row or column; Splitwise: the "
          "sweep's neighbours")
    print(f"SUMMARY [2c decode misses] {len(misses)} interior points over 5%")


def decode_neighbours(cells: dict, axis: str, b: int, c: int) -> str:
    """What surrounds a held-out decode point. Kernel cells (table rows): its attention against
    the cells reading the same KV tokens (b x c), and the GEMM time at the neighbouring batches;
    Splitwise cells (step ms): the neighbours along its sweep."""
    if not isinstance(cells[b, c], dict):
        sweep = sorted(k for k in cells if (k[1] == c if axis == "batch" else k[0] == b))
        i = sweep.index((b, c))
        return "sweep " + " ".join(f"b{kb} c{kc}:{cells[kb, kc]:.1f}" for kb, kc
                                   in sweep[max(0, i - 1):i + 2])
    attention = {k: float(r["attention_ms"]) for k, r in cells.items()}
    peers = [f"b{kb} c{kc}:{v:.2f}" for (kb, kc), v in sorted(attention.items())
             if kb * kc == b * c and kb != b]
    batches = sorted({kb for kb, _ in cells})
    i = batches.index(b)
    gemm = [f"b{kb}:{float(cells[kb, c]['linear_and_elementwise_ms']):.2f}"
            for kb in batches[max(0, i - 1):i + 2]]
    return (f"attention {attention[b, c]:.2f} ms, same b*c {' '.join(peers) or '-'}; "
            f"GEMM {' '.join(gemm)}")


def ratio(ms: dict, a: int, b: int) -> str:
    """ms[b] / ms[a] to two decimals, or '-' where either is missing."""
    return f"{ms[b] / ms[a]:.2f}" if a in ms and b in ms else "-"


def reversal(ys: list[float]) -> float:
    """Largest drop, in %, from one point of a sweep to the next (more work measured faster)."""
    return max([100.0 * (1 - b / a) for a, b in zip(ys, ys[1:]) if b < a], default=0.0)


def section_noise(tables: Tables, data_dir: Path) -> None:
    """How far the Splitwise measurements disagree with themselves, from the raw repeats."""
    print("\n== 2b. measurement noise of the Splitwise totals (raw perf_model.csv) ==")
    raw_path = data_dir / SPLITWISE_RAW
    if not raw_path.is_file():
        print(f"{raw_path} not found: skipped")
        return
    print(f"{'config':24} {'repeat MAD % prefill':>20} {'decode':>13} | "
          f"{'512-token prefill':>17} | "
          f"{'reversals % prefill':>19} {'batch':>6} {'context':>7} | "
          f"{'2048->4096 tokens':>17}")
    print(f"{'':24} {'median':>10} {'max':>9} {'median':>6} {'max':>6} | {'across 7 runs':>17} | "
          f"{'':>34} | {'batch 1':>7} {'b x 512':>8}")
    floors, flips = [], []
    for model, gpu, tp in SPLITWISE:
        label, hw = perf_mod.SPLITWISE_MODELS[model], perf_mod.SPLITWISE_GPUS[gpu]
        raw = [r for r in read_table(raw_path) if r["model"] == label and r["hardware"] == hw
               and int(r["tensor_parallel"]) == tp]
        points: dict[tuple, list[dict]] = {}
        for r in raw:
            points.setdefault((r["prompt_size"], r["batch_size"], r["token_size"]), []).append(r)

        def mad(rs: list[dict], col: str) -> float:
            v = np.array([float(r[col]) for r in rs])
            return 100.0 * float(np.median(np.abs(v - np.median(v))) / np.median(v))

        pre_mad = [mad(rs, "prompt_time") for rs in points.values()]
        dec_mad = [mad(rs, "token_time") for rs in points.values()]
        # the same prefill (512 tokens, batch 1) is timed again at every output length
        runs = [np.median([float(r["prompt_time"]) for r in rs])
                for (p, b, _), rs in points.items() if p == "512" and b == "1"]
        across = 100.0 * (max(runs) / min(runs) - 1)
        pre, dec = tables.splitwise_rows(model, gpu, tp)
        pre_ys = [float(r["prefill_ms_median"])
                  for r in sorted(pre, key=lambda r: int(r["prompt_tokens"]))]
        by_batch = [float(r["decode_step_ms_median"]) for r in sorted(dec, key=lambda r: int(
            r["batch_size"])) if int(r["prompt_tokens"]) == perf_mod.SPLITWISE_DECODE_CONTEXT]
        by_ctx = [float(r["decode_step_ms_median"]) for r in sorted(dec, key=lambda r: int(
            r["prompt_tokens"])) if int(r["batch_size"]) == 1]
        rev = (reversal(pre_ys), reversal(by_batch), reversal(by_ctx))
        by_tokens = {int(r["prompt_tokens"]): float(r["prefill_ms_median"]) for r in pre}
        batched = {int(b): np.median([float(r["prompt_time"]) for r in rs])
                   for (p, b, _), rs in points.items() if p == "512"}
        step = (ratio(by_tokens, 2048, 4096), ratio(batched, 4, 8))
        floors += [float(np.median(pre_mad)), float(np.median(dec_mad)), across]
        flips += rev
        name = f"{model} {gpu} tp{tp}"
        print(f"{name:24} {np.median(pre_mad):10.2f} {max(pre_mad):9.1f} {np.median(dec_mad):6.2f} "
              f"{max(dec_mad):6.1f} | {across:16.1f}% | {rev[0]:19.1f} {rev[1]:6.1f} "
              f"{rev[2]:7.1f} | {step[0]:>7} {step[1]:>8}")
    print("repeat MAD: median absolute deviation of the ~5 repeats of one setting, % of their "
          "median (the tables hold the medians); 512-token prefill: max/min of its medians at the "
          "7 output lengths whose runs time it again; reversals: largest drop from one sweep "
          "point to the next in the tables (more work measured faster), pooled away by the "
          "monotone fit; 2048->4096 tokens: prefill time ratio from 2048 to 4096 tokens in one "
          "step, in the batch-1 table and in the raw batched runs of 512-token prompts (4 -> 8 "
          "prompts): the same jump in an independent sweep is the serving stack's, not noise")
    print(f"SUMMARY [2b noise] Splitwise repeat noise (median MAD) and run-to-run spread of the "
          f"same point: at most {max(floors):.1f}%; reversals along the sweeps up to "
          f"{max(flips):.1f}%: "
          "held-out errors well above that are the curves' own structure (kinks, reversals), "
          "not measurement noise")


def simulate_batch(perf: PerfModel, batch: int, input_len: int, output_len: int,
                   chunk: int | None = None, overhead: bool = True) -> float:
    """One prefill of batch x input_len tokens (or chunks of ``chunk`` tokens), then
    output_len - 1 decode steps of ``batch`` sequences whose context grows by one each step."""
    step = perf.step_s if overhead else perf.gpu_step_s
    total, left = 0.0, batch * input_len
    size = chunk or left
    while left > 0:
        n = min(size, left)
        total += step(n, 0, 0, 0, prefill_seqs=max(1, round(n / input_len)))
        left -= n
    for i in range(1, output_len):
        total += step(0, 0, batch, input_len + i)
    return total


def section_e2e(tables: Tables, data_dir: Path) -> None:
    print("\n== 3. end-to-end batch latency vs LLM-Inference-Bench (vLLM, Llama-3-8B) ==")
    rows = tables.validation
    fit = StepOverhead.fit([r for r in rows if r["gpu"].startswith("H100")])
    print(f"CPU overhead per step fitted to the H100 rows: {fit.base_ms:.3f} ms + "
          f"{fit.per_seq_ms:.4f} ms/seq + {fit.per_kilotoken_ms:.4f} ms per 1k context tokens")
    print(f"{'gpu':6} {'B':>3} {'in':>5} {'out':>5} {'meas s':>8} {'kernels s':>9} {'(err)':>6} "
          f"{'sim s':>8} {'err %':>6} {'chunk8k s':>9} {'err %':>6}")
    errs: dict[str, list[float]] = {"h100": [], "a100": []}
    kernel_errs: dict[str, list[float]] = {"h100": [], "a100": []}
    chunk_errs: list[float] = []
    models = {g: PerfModel.load(g, "llama-3-8b", data_dir=data_dir) for g in ("a100", "h100")}
    for r in rows:
        gpu = "h100" if r["gpu"].startswith("H100") else "a100"
        b, i, o = int(r["batch_size"]), int(r["input_len"]), int(r["output_len"])
        meas = float(r["measured_latency_s"])
        kern = simulate_batch(models[gpu], b, i, o, overhead=False)
        sim = simulate_batch(models[gpu], b, i, o)
        chunked = simulate_batch(models[gpu], b, i, o, chunk=8192)
        errs[gpu].append(err(sim, meas))
        kernel_errs[gpu].append(err(kern, meas))
        if gpu == "h100":
            chunk_errs.append(err(chunked, meas))
        print(f"{gpu:6} {b:>3} {i:>5} {o:>5} {meas:8.3f} {kern:9.3f} {err(kern, meas):+6.0f} "
              f"{sim:8.3f} {err(sim, meas):+6.1f} {chunked:9.3f} {err(chunked, meas):+6.1f}")
    print("prefill: one step of B x input_len tokens (vLLM without chunked prefill, as these runs "
          "were); 'chunk8k' chunks it by max_num_batched_tokens=8192.")
    print("A100 rows were measured on A100-SXM4-40GB (1.555 TB/s) against the A100-80GB model "
          "(2.039 TB/s): expect ~25% low from bandwidth alone; B=64, 2048/2048 exceeds 40 GB of KV.")
    h100_rows = [r for r in rows if r["gpu"].startswith("H100")]
    held_out = []
    for k, r in enumerate(h100_rows):  # refit the overhead without row k, then predict row k
        ovh = StepOverhead.fit(h100_rows[:k] + h100_rows[k + 1:])
        base = models["h100"]
        m = PerfModel(base.gpu, base.model, base.tp, base.backend, ovh, base.source)
        held_out.append(err(simulate_batch(m, int(r["batch_size"]), int(r["input_len"]),
                                           int(r["output_len"])), float(r["measured_latency_s"])))
    h, a = np.array(errs["h100"]), np.array(errs["a100"])
    print(f"SUMMARY [3 e2e] H100: |err| max {np.abs(h).max():.1f}% mean {np.abs(h).mean():.1f}% "
          f"({sum(np.abs(h) <= 15)}/{len(h)} within 15%; kernel sums alone mean "
          f"{np.mean(kernel_errs['h100']):+.1f}%; chunked-8k max {np.abs(chunk_errs).max():.1f}%; "
          f"overhead fit leaving the row out: max {np.abs(held_out).max():.1f}% mean "
          f"{np.mean(np.abs(held_out)):.1f}%); "
          f"A100(-40GB measured) mean {a.mean():+.1f}% (kernel sums alone "
          f"{np.mean(kernel_errs['a100']):+.1f}%)")


def section_formula(tables: Tables, data_dir: Path) -> None:
    print("\n== 4. roofline formula vs tables (GPU time, ms) ==")
    print(f"{'config':22} {'point':18} {'table':>8} {'formula':>8} {'err %':>6}")
    errs: dict[str, list[float]] = {"llama-3-8b": [], "llama-2-7b": [], "llama-2-70b": []}
    for model, gpu, tp in [(m, g, 1) for m, g in KERNEL] + SPLITWISE:
        table = PerfModel.load(gpu, model, tp, data_dir=data_dir)
        formula = PerfModel.load(gpu, model, tp, data_dir=data_dir / "absent")
        sizes = {"llama-3-8b": (1024, 4096, 16384), "llama-2-7b": (1024, 2048, 4096)}
        points = [(f"prefill {n}", (n, 0, 0, 0)) for n in sizes.get(model, (1024, 4096, 8192))]
        if model != "llama-2-7b":
            batches = (1, 64, 256) if tp == 1 else (1, 16, 64)
            ctx = 1024 if tp == 1 else 512
            points += [(f"decode b{b} c{ctx}", (0, 0, b, ctx)) for b in batches]
        for label, args in points:
            t, f = table.gpu_step_s(*args) * 1e3, formula.gpu_step_s(*args) * 1e3
            e = err(f, t)
            errs[model].append(e)
            print(f"{model + ' ' + gpu + (f' tp{tp}' if tp > 1 else ''):22} {label:18} "
                  f"{t:8.1f} {f:8.1f} {e:+6.1f}")
    print("SUMMARY [4 formula] " + "; ".join(
        f"{m}{' (headline points)' if m == 'llama-3-8b' else ''} |err| max "
        f"{max(map(abs, e)):.1f}% mean {np.mean(np.abs(e)):.1f}% (formula {np.mean(e):+.1f}% "
        "on average)" for m, e in errs.items())
        + "; the Splitwise 70B totals include an older serving stack's per-step overhead")


def section_speed(data_dir: Path) -> None:
    print("\n== 5. cost of step_s ==")
    rng = random.Random(0)
    calls = [(rng.choice((0, 0, 0, 512, 2048, 8192)), rng.randint(0, 20000), rng.randint(0, 256),
              rng.uniform(64, 20000)) for _ in range(200_000)]
    line = []
    for gpu, model, tp in (("h100", "llama-3-8b", 1), ("h100", "llama-2-70b", 4)):
        for d in (data_dir, data_dir / "absent"):
            p = PerfModel.load(gpu, model, tp, data_dir=d)
            step = p.step_s
            start = time.perf_counter()
            for a in calls:
                step(*a)
            us = (time.perf_counter() - start) / len(calls) * 1e6
            line.append(f"{model} {gpu} tp{tp} {p.source} {us:.2f} us")
            print(f"{model:12} {gpu} tp{tp} {p.source:8} {us:6.2f} us/call")
    print("SUMMARY [5 speed] " + "; ".join(line))


class Run(NamedTuple):
    """One ``gpu_profile`` run: its rows, whether its elementwise steps were fused, and the
    tool's version that made it (``gpu_profile.VERSION``)."""
    prefill: list[dict]
    decode: list[dict]
    fused: bool
    version: int


def measured_runs(gpu: str = "h200") -> dict[str, Run]:
    """Each committed ``gpu_profile`` run of one GPU, by its folder's name."""
    runs = {}
    for folder in sorted(MEASURED.glob("*")) if MEASURED.is_dir() else []:
        pre = sorted(folder.glob(f"llama3_8b_{gpu}*_prefill_measured.csv"))
        dec = sorted(folder.glob(f"llama3_8b_{gpu}*_decode_measured.csv"))
        meta = sorted(folder.glob(f"llama3_8b_{gpu}*_measured.json"))
        if pre and dec and meta:
            info = json.loads(meta[0].read_text())
            runs[folder.name] = Run(list(read_table(pre[0])), list(read_table(dec[0])),
                                    # (no such keys: runs made before --fused, or version 2)
                                    info.get("fused", False), info.get("version", 1))
    return runs


def _pre_ms(rows: list[dict]) -> dict[int, float]:
    return {int(r["prompt_tokens"]): float(r["prefill_ms"]) for r in rows}


def _dec_rows(rows: list[dict]) -> dict[tuple[int, int], dict]:
    return {(int(r["batch_size"]), int(r["context_tokens_per_seq"])): r for r in rows}


def _dec_ms(rows: list[dict]) -> dict[tuple[int, int], float]:
    return {k: float(r["decode_step_ms"]) for k, r in _dec_rows(rows).items()}


def section_measured(tables: Tables) -> None:
    print("\n== 6. against dense measurements on a real H200 (benchmarks/gpu_profile.py) ==")
    runs = measured_runs()
    if not runs:
        print(f"no measurements under {MEASURED}: run benchmarks/gpu_profile.py on an H200")
        return
    pre_t, dec_t = tables.kernel_rows("llama-3-8b", "h200")
    line = (_repeat_noise(runs) + _held_out(runs, pre_t, dec_t) + _held_out_sweep(runs)
            + _level(runs, pre_t, dec_t))
    print("SUMMARY [6 measured H200] " + "; ".join(line))


def _repeat_noise(runs: dict[str, Run]) -> list[str]:
    """6a: two runs of a kind, made by one version of the tool, against each other; then the
    versions against each other (version 2 times attention in place: version 1's decode split
    put in the GEMMs' column time that was attention's)."""
    line = []
    for fused, version in sorted({(run.fused, run.version) for run in runs.values()}):
        same = [name for name, run in runs.items() if (run.fused, run.version) == (fused, version)]
        if len(same) < 2:
            continue
        p1, d1, *_ = runs[same[0]]
        p2, d2, *_ = runs[same[1]]
        a, b = _pre_ms(p1), _pre_ms(p2)
        noise_p = [abs(err(a[n], b[n])) for n in a if n in b]
        a, b = _dec_ms(d1), _dec_ms(d2)
        noise_d = [abs(err(a[k], b[k])) for k in a if k in b]
        print(f"6a. repeat noise ({same[0]} vs {same[1]}, their common points): prefill median "
              f"{np.median(noise_p):.2f}% max {max(noise_p):.1f}% ({len(noise_p)} points); decode "
              f"median {np.median(noise_d):.2f}% max {max(noise_d):.1f}% ({len(noise_d)} points)")
        line.append(f"{'fused' if fused else 'unfused'} v{version} repeat noise median "
                    f"{np.median(noise_p):.2f}% prefill, {np.median(noise_d):.2f}% decode")
    unfused = {v: [r for r in runs.values() if not r.fused and r.version == v] for v in (1, 2)}
    if unfused[1] and unfused[2]:
        old, new = (_dec_rows(unfused[v][0].decode) for v in (1, 2))
        cells = [k for k in new if k in old]
        shift = {col: [float(new[k][col]) - float(old[k][col]) for k in cells]
                 for col in ("attention_ms", "linear_and_elementwise_ms")}
        total = [abs(err(float(new[k]["decode_step_ms"]), float(old[k]["decode_step_ms"])))
                 for k in cells]
        # one layer's K and V for a cell, against the H200's 50 MB L2
        in_l2 = [b * c * 2 * KV_BYTES < 50e6 for b, c in cells]
        attn = np.array(shift["attention_ms"])
        print(f"6a'. unfused decode, version 2 against version 1 ({len(cells)} points): totals "
              f"median {np.median(total):.2f}%; attention column median {np.median(attn):+.3f} ms "
              f"(where a layer's KV cache fits in L2 {np.median(attn[in_l2]):+.3f}, elsewhere "
              f"{np.median(attn[~np.array(in_l2)]):+.3f}), GEMMs+elementwise median "
              f"{np.median(shift['linear_and_elementwise_ms']):+.3f} ms")
        line.append(f"decode attention timed in place {np.median(shift['attention_ms']):+.3f} ms "
                    f"(median) against version 1")
    return line


def _held_out(runs: dict[str, Run], pre_t: list[dict], dec_t: list[dict]) -> list[str]:
    """6b: the model rebuilt from a run's rows at the tables' grid, against its other rows."""
    print("6b. the model's interpolation rebuilt from each run's points at the tables' grid, held "
          "out at its points between them")
    grid_n = {int(r["prompt_tokens"]) for r in pre_t}
    grid_bc = set(_dec_ms(dec_t))
    line = []
    for name, (pre, dec, *_) in runs.items():
        model = KernelTables.from_rows(
            [r for r in pre if int(r["prompt_tokens"]) in grid_n],
            [r for r in dec if (int(r["batch_size"]), int(r["context_tokens_per_seq"])) in grid_bc])
        ms = _pre_ms(pre)
        held_p = {n: err(model.gpu_ms(n, 0, 1, 0, 0), y) for n, y in ms.items() if n not in grid_n}
        held_d = [err(model.gpu_ms(0, 0, 0, *k), y) for k, y in _dec_ms(dec).items()
                  if k not in grid_bc]
        print(f"  {name:10} prefill {len(held_p)} held out: {stats(list(held_p.values()))} "
              f"(max, mean |%|), {over(list(held_p.values()))} > 5%; decode {len(held_d)}: "
              f"{stats(held_d)}, {over(held_d)} > 5%")
        xs = sorted(ms)
        for n in sorted(held_p, key=lambda n: -abs(held_p[n]))[:4]:
            i = xs.index(n)
            print(f"    {n:>5} tokens {held_p[n]:+5.1f}% | measured ms around it: "
                  + " ".join(f"{xs[k]}:{ms[xs[k]]:.1f}" for k in (i - 1, i, i + 1)
                             if 0 <= k < len(xs)))
        line.append(f"{name} held out prefill max {max(map(abs, held_p.values())):.1f}% "
                    f"({over(list(held_p.values()))}/{len(held_p)} > 5%), decode max "
                    f"{max(map(abs, held_d)):.1f}% ({over(held_d)}/{len(held_d)} > 5%)")
    return line


def _held_out_sweep(runs: dict[str, Run]) -> list[str]:
    """6b': each point of a run's 64-token sweep from the line through its two neighbours."""
    print("6b'. a grid 64 tokens apart (each run's sweep, as far as it goes), each point held "
          "out and interpolated linearly between its neighbours")
    line = []
    for name, (pre, *_) in runs.items():
        ms = _pre_ms(pre)
        xs = [64]
        while xs[-1] + 64 in ms and xs[-1] < 4096:  # as far as the sweep is unbroken
            xs.append(xs[-1] + 64)
        if len(xs) < 16:
            continue  # no sweep in this run
        held = [err(float(np.interp(xs[i], xs[:i] + xs[i + 1:],
                                    [ms[x] for x in xs[:i] + xs[i + 1:]])), ms[xs[i]])
                for i in range(1, len(xs) - 1)]
        print(f"  {name:10} {len(held)} held out: {stats(held)} (max, mean |%|), "
              f"{over(held)} > 5%")
        line.append(f"{name} 64-token grid held out max {max(map(abs, held)):.1f}% "
                    f"({over(held)}/{len(held)} > 5%)")
    return line


def _level(runs: dict[str, Run], pre_t: list[dict], dec_t: list[dict]) -> list[str]:
    """6c: the simulated engine's GPU time (the shared tables) against each run."""
    print("6c. the simulated engine (GPU time from the shared tables) against each run")
    sim = kernel_backend("llama-3-8b", "h200", pre_t, dec_t)
    lin_t = {int(r["prompt_tokens"]): float(r["linear_and_elementwise_ms"]) for r in pre_t}
    line = []
    for name, (pre, dec, *_) in runs.items():
        ms = _pre_ms(pre)
        e_p = {n: err(sim.gpu_ms(n, 0, 1, 0, 0), y) for n, y in ms.items()}
        short = [e for n, e in e_p.items() if n <= 128]
        long_ = [e for n, e in e_p.items() if n >= 1024]
        e_d = [err(sim.gpu_ms(0, 0, 0, *k), y) for k, y in _dec_ms(dec).items()]
        top = max(ms)
        lin = {int(r["prompt_tokens"]): float(r["linear_and_elementwise_ms"]) for r in pre}
        tflops, tflops_t = (2 * LINEAR_MACS * top / (t[top] * 1e-3) / 1e12 for t in (lin, lin_t))
        print(f"  {name:10} prefill mean {np.mean(list(e_p.values())):+.1f}% (<=128 tokens "
              f"{np.mean(short):+.1f}%, >=1024 {np.mean(long_):+.1f}%), decode mean "
              f"{np.mean(e_d):+.1f}% (range {min(e_d):+.1f}..{max(e_d):+.1f}%); GEMMs+elementwise "
              f"at {top} tokens: {tflops:.0f} TFLOP/s measured, {tflops_t:.0f} in the tables")
        line.append(f"sim vs {name}: prefill >=1024 tokens {np.mean(long_):+.1f}%, decode "
                    f"{np.mean(e_d):+.1f}%")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    data_dir = parser.parse_args().data_dir or default_data_dir()
    if not (data_dir / perf_mod.TABLES / perf_mod.DECODE_TABLE).is_file():
        print(f"calibration tables not found under {data_dir}: only the speed section runs")
        section_speed(data_dir)
        return
    tables = Tables(data_dir)
    section_prefill(tables)
    section_between(tables, data_dir)
    section_decode(tables)
    section_noise(tables, data_dir)
    section_e2e(tables, data_dir)
    section_formula(tables, data_dir)
    section_speed(data_dir)
    section_measured(tables)


if __name__ == "__main__":
    main()
