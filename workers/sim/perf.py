"""Performance model of the simulated GPU engine: how long one engine step takes.

The simulated engine asks ``PerfModel.step_s`` once per iteration. Where measured tables exist
(``shared/data/calibration/tables``, read in place; ``GOVERNOR_DATA_DIR`` overrides the folder)
the model interpolates them; elsewhere it falls back to the roofline in ``workers.sim.models``
(``source`` says which).

Kernel tables (Llama-3-8B on A100-80GB / H100 / H200, Llama-2-7B prefill on A100 / H100) split a
step into GEMMs+elementwise (a function of the tokens in the step), attention and lm_head. A mixed
(chunked-prefill) step is composed from those parts::

    gemm(prefill_tokens + decode_seqs)
    + prefill_seqs * prefill_attention(sqrt(n^2 + 2 n c))   n, c = tokens, context per sequence
    + decode_attention(decode_seqs, decode_context)
    + lm_head(decode_seqs + prefill_seqs)                    one sampled token per sequence
    + CPU overhead                                           (StepOverhead, fitted below)

``sqrt(n^2 + 2 n c)`` is the fresh prompt with the same causal attention work (n*c + n^2/2) as a
chunk of n tokens after c cached ones. Llama-2-7B has no decode table: its decode attention is
Llama-3-8B's at ``kv_context_scale`` times the context (same layers, query heads and head_dim; four
times the KV heads, so four times the bytes per token), its lm_head Llama-3-8B's scaled to its own
prefill lm_head.

Splitwise totals (Llama-2-70B, TP 2/4/8, A100 / H100) are end-to-end measurements (no overhead is
added): prefill vs tokens at batch 1, decode vs batch at context 512 and vs context at batch 1.
Their shared cell (batch 1, context 512) takes the context sweep's monotone fit in both, so batch
1 follows that fit at every context (the raw cell sits 9% above its context neighbours on A100
TP2, and anchoring the context curve on it lifted the whole batch-1 row). Decode elsewhere:
batch curve + batch-1 context curve + the extra KV bytes the other sequences read at
``kv_bw_eff`` of HBM bandwidth. A mixed step is the larger of the decode step and the
prefill curve at ``prefill_tokens + decode_seqs`` plus the attention those curves leave out.

Interpolation (``benchmarks/fidelity.py`` measures it on held-out grid points):
- GEMM time vs tokens (kernel tables) and the Splitwise prefill totals vs tokens: ``KneeCurve``,
  a smoothed roofline (flat while the weights read bounds it, then a line through the origin
  once compute does) fitted per GPU, hitting every knot and following the fitted shape between
  them. A chord across the knee cut its corner: held out, 512 tokens on H100 came out 14% high;
- prefill attention and lm_head: the monotone cubic through the knots (``pchip_slopes``);
- decode attention: piecewise linear along context per batch row, linear across rows (neither
  the cubic nor a KV-tokens roofline with interpolated residuals did better held out, and the
  cubic moved the end-to-end figures);
- Splitwise decode curves: the monotone cubic.
Interpolating totals in log-log space was worse on every table. Before interpolating, series are
made non-decreasing (isotonic fit; across decode batches a running max) so a bigger step never
costs less; each interpolant keeps that order. Beyond the grid: above the last point linear with
the last segment's chord slope, except prefill attention, which grows as tokens^2 (constant
attention throughput, i.e. linear in attention work); below the first point flat
(``KneeCurve``: its knee, scaled to the first point), except decode attention, which falls along
the first segment towards 0 (the KV read shrinks with the context).
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import os
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.sim.models import GpuSpec, ModelSpec, gpu_spec, model_spec, roofline_ms

logger = logging.getLogger(__name__)

DATA_DIR_ENV = "GOVERNOR_DATA_DIR"
TABLES = Path("calibration") / "tables"
PREFILL_TABLES = {"llama-3-8b": "llama3_8b_prefill_latency_vs_tokens.csv",
                  "llama-2-7b": "llama2_7b_prefill_latency_vs_tokens.csv"}
DECODE_TABLE = "llama3_8b_decode_step_latency_vs_batch.csv"  # Llama-3-8B; Llama-2-7B borrows it
SPLITWISE_PREFILL = "splitwise_measured_prefill_ms_batch1.csv"
SPLITWISE_DECODE = "splitwise_measured_decode_step_ms.csv"
VALIDATION = "validation_vs_llm_inference_bench_vllm_llama3_8b.csv"
SPLITWISE_MODELS = {"llama-2-70b": "llama2-70b"}
SPLITWISE_GPUS = {"a100": "a100-80gb", "h100": "h100-80gb"}
SPLITWISE_DECODE_CONTEXT = 512  # the batch sweep's context
#: Cold start (an assumption, not calibrated): process start, CUDA init and CUDA-graph capture,
#: then the weights read at this rate per GPU (local NVMe / page cache).
LOAD_FIXED_S = 20.0
LOAD_BYTES_PER_S = 2e9


def default_data_dir() -> Path:
    """``$GOVERNOR_DATA_DIR``, else ``../shared/data`` next to the repository."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


# --- interpolation -----------------------------------------------------------------------------

def isotonic(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def pchip_slopes(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """Knot slopes of the monotone cubic (PCHIP, Fritsch-Carlson with Fritsch-Butland's weighted
    harmonic mean): 0 at a local extremum or beside a flat segment, so the cubic never overshoots
    its knots and is monotone wherever the data are. Ends: the one-sided three-point estimate,
    clipped to keep the sign of the end segment and at most 3x its chord slope."""
    n = len(xs)
    h = [x1 - x0 for x0, x1 in zip(xs, xs[1:])]
    d = [(y1 - y0) / w for y0, y1, w in zip(ys, ys[1:], h)]
    if n == 2:
        return [d[0], d[0]]
    m = [0.0] * n
    for k in range(1, n - 1):
        if d[k - 1] * d[k] > 0:
            w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
            m[k] = (w1 + w2) / (w1 / d[k - 1] + w2 / d[k])

    def end(h0: float, h1: float, d0: float, d1: float) -> float:
        s = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
        if s * d0 <= 0:
            return 0.0
        if d0 * d1 < 0 and abs(s) > 3 * abs(d0):
            return 3 * d0
        return s

    m[0] = end(h[0], h[1], d[0], d[1])
    m[-1] = end(h[-1], h[-2], d[-1], d[-2])
    return m


class Curve:
    """y(x) through the knots (pure Python: fast for one scalar at a time).

    Between knots: the monotone cubic through them (``pchip_slopes``), or with
    ``shape="linear"`` straight segments. Below the first knot: flat, or with ``low="linear"``
    the first segment's chord slope, down to 0. Above the last: the last segment's chord slope,
    or with ``tail="quadratic"`` y_last * (x/x_last)^2; ``tail_slope`` overrides the slope.
    """

    __slots__ = ("xs", "ys", "_chords", "_cubic", "_quadratic", "_low_linear", "_tail")

    def __init__(self, xs: Sequence[float], ys: Sequence[float], tail: str = "linear",
                 low: str = "flat", shape: str = "pchip", tail_slope: float | None = None) -> None:
        if not xs or len(xs) != len(ys) or any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError("a curve needs increasing xs and as many ys")
        self.xs = tuple(float(x) for x in xs)
        self.ys = tuple(float(y) for y in ys)
        self._chords = tuple((y1 - y0) / (x1 - x0) for x0, x1, y0, y1
                             in zip(self.xs, self.xs[1:], self.ys, self.ys[1:])) or (0.0,)
        # per segment (slope at its left knot, t^2 and t^3 coefficients), t = x - x_i
        if shape == "pchip" and len(self.xs) > 1:
            m = pchip_slopes(self.xs, self.ys)
            self._cubic = tuple(
                (m[i], (3 * d - 2 * m[i] - m[i + 1]) / w, (m[i] + m[i + 1] - 2 * d) / (w * w))
                for i, (d, w) in enumerate(zip(self._chords,
                                               (b - a for a, b in zip(self.xs, self.xs[1:])))))
        else:
            self._cubic = tuple((d, 0.0, 0.0) for d in self._chords)
        self._quadratic = tail == "quadratic"
        self._low_linear = low == "linear"
        self._tail = max(0.0, self._chords[-1] if tail_slope is None else tail_slope)

    def __call__(self, x: float) -> float:
        xs = self.xs
        if x <= xs[0]:
            if self._low_linear:
                return max(0.0, self.ys[0] - self._chords[0] * (xs[0] - x))
            return self.ys[0]
        i = bisect_right(xs, x) - 1
        if i >= len(xs) - 1:
            if self._quadratic:
                return self.ys[-1] * (x / xs[-1]) ** 2
            return self.ys[-1] + self._tail * (x - xs[-1])
        t = x - xs[i]
        b, c2, c3 = self._cubic[i]
        return self.ys[i] + t * (b + t * (c2 + t * c3))


#: Sharpness exponents tried when fitting a KneeCurve (1: the two costs add; large: a hard max).
KNEE_SHARPNESS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)


class KneeCurve:
    """y(x) for a cost that is flat while one resource bounds it and then grows along a line
    through the origin once another takes over (a GEMM streams its weights until the tokens make
    it compute-bound; a serving stack's fixed step cost until prefill work dominates):

        knee(x) = (w^p + (f x)^p)^(1/p)      a smoothed max(w, f x); w, f, p fitted to the knots
        y(x)    = y_i + (y_i+1 - y_i) * (knee(x) - knee(x_i)) / (knee(x_i+1) - knee(x_i))

    between knots x_i and x_i+1: the knots are hit exactly and the fitted shape decides how the
    step from one knot to the next is spread (a chord across the knee would cut the corner).
    Non-decreasing knots give a non-decreasing curve. Where the knee is flat to rounding,
    straight segments; below the first knot the knee scaled to it (down to knee(0), the floor);
    above the last, the last segment's chord slope, as ``Curve`` does. With fewer than three
    knots, or no fit, it is a linear ``Curve``.
    ``tabulated()`` is what the engine calls: the same curve precomputed as a linear ``Curve``.
    """

    __slots__ = ("xs", "ys", "_w", "_f", "_p", "_knees", "_linear")

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self._linear = Curve(xs, ys, shape="linear")
        self.xs, self.ys = self._linear.xs, self._linear.ys
        self._w, self._f, self._p = self.fit(self.xs, self.ys) if len(self.xs) > 2 else (0, 0, 0)
        self._knees = tuple(self.knee(x) for x in self.xs) if self._p else ()

    @staticmethod
    def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
        """(w^p, f^p, p): for each p in KNEE_SHARPNESS, least squares on the relative error of
        y^p = w^p + f^p x^p (linear in w^p, f^p); keep the p with the least squared relative error
        of y. (0, 0, 0) when no p gives positive coefficients."""
        import numpy as np  # load time only

        x, y = np.asarray(xs, float), np.asarray(ys, float)
        best = (math.inf, 0.0, 0.0, 0.0)
        for p in KNEE_SHARPNESS:
            coef = np.linalg.lstsq(np.stack([1 / y ** p, x ** p / y ** p], axis=1),
                                   np.ones_like(x), rcond=None)[0]
            if coef.min() <= 0:
                continue
            loss = float(np.sum(((coef[0] + coef[1] * x ** p) ** (1 / p) / y - 1) ** 2))
            if loss < best[0]:
                best = (loss, float(coef[0]), float(coef[1]), p)
        return best[1], best[2], best[3]

    def knee(self, x: float) -> float:
        return (self._w + self._f * x ** self._p) ** (1 / self._p)

    def __call__(self, x: float) -> float:
        xs = self.xs
        if not self._p or x >= xs[-1]:
            return self._linear(x)
        if x <= xs[0]:
            return self.ys[0] * self.knee(max(x, 0.0)) / self._knees[0]
        i = bisect_right(xs, x) - 1
        k0, k1 = self._knees[i], self._knees[i + 1]
        if k1 - k0 > 1e-9 * k1:
            share = (self.knee(x) - k0) / (k1 - k0)
        else:  # the knee is flat here (to rounding): straight between the knots
            share = (x - xs[i]) / (xs[i + 1] - xs[i])
        return self.ys[i] + (self.ys[i + 1] - self.ys[i]) * share

    def tabulated(self, per_segment: int = 16) -> Curve:
        """This curve through ``per_segment`` evenly spaced points per knot interval (and from 0
        to the first knot), as a linear ``Curve``: the hot path's cost stays that of a linear
        Curve; on the calibration tables it is within 0.05% of the exact curve."""
        if not self._p:
            return self._linear
        knots = (0.0,) + self.xs if self.xs[0] > 0 else self.xs
        xs = [x0 + (x1 - x0) * j / per_segment for x0, x1 in zip(knots, knots[1:])
              for j in range(per_segment)] + [self.xs[-1]]
        return Curve(xs, [self(x) for x in xs], shape="linear",
                     tail_slope=self._linear._chords[-1])


class Grid:
    """y(batch, context): a Curve over context per batch row, linear across rows and past the last."""

    __slots__ = ("batches", "rows")

    def __init__(self, batches: Sequence[float], rows: Sequence[Curve]) -> None:
        self.batches = tuple(float(b) for b in batches)
        self.rows = tuple(rows)

    def __call__(self, batch: float, context: float) -> float:
        bs, rows = self.batches, self.rows
        if batch <= bs[0] or len(bs) == 1:
            return rows[0](context)
        i = min(bisect_right(bs, batch) - 1, len(bs) - 2)
        y0 = rows[i](context)
        return y0 + (rows[i + 1](context) - y0) * (batch - bs[i]) / (bs[i + 1] - bs[i])


def monotone_grid(batches: Sequence[float], contexts: Sequence[float],
                  values: Sequence[Sequence[float]]) -> Grid:
    """Isotonic along context per row, then a running max across batches: monotone in both."""
    rows = [isotonic(row) for row in values]
    for r in range(1, len(rows)):
        rows[r] = [max(a, b) for a, b in zip(rows[r - 1], rows[r])]
    return Grid(batches, [Curve(contexts, row, low="linear", shape="linear") for row in rows])


# --- CPU-side overhead -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepOverhead:
    """vLLM's CPU work per step (scheduling, input preparation, sampling, detokenisation), in ms:

        base_ms + per_seq_ms * sequences + per_kilotoken_ms * context_tokens / 1000

    The context term stands for per-block work (block tables and slot mappings are rebuilt every
    step) and whatever the kernel sums miss that grows with the KV read. Fitted by least squares to
    ``implied_overhead_ms_per_step`` of the H100 rows of the LLM-Inference-Bench validation table
    (the A100 rows ran on A100-40GB and mix bandwidth into the ratio); the defaults are that fit.
    """

    base_ms: float = 1.015
    per_seq_ms: float = 0.0412
    per_kilotoken_ms: float = 0.0163

    def ms(self, seqs: float, context_tokens: float) -> float:
        return self.base_ms + self.per_seq_ms * seqs + self.per_kilotoken_ms * context_tokens / 1e3

    @classmethod
    def fit(cls, rows: Sequence[dict]) -> "StepOverhead":
        """Fit to validation rows (batch_size, input_len, output_len, implied overhead per step)."""
        import numpy as np  # load time only

        x = np.array([[1.0, float(r["batch_size"]),
                       float(r["batch_size"]) * (float(r["input_len"]) + float(r["output_len"]) / 2)
                       / 1e3] for r in rows])
        y = np.array([float(r["implied_overhead_ms_per_step"]) for r in rows])
        base, per_seq, per_kilotoken = np.linalg.lstsq(x, y, rcond=None)[0]
        return cls(float(base), float(per_seq), float(per_kilotoken))


NO_OVERHEAD = StepOverhead(0.0, 0.0, 0.0)


# --- the three sources of step time ------------------------------------------------------------

def _remembered(memo: dict[int, float], curve: Curve, x: int) -> float:
    """``curve(x)``, interpolated once per ``x`` (``memo`` is bounded like the step memo)."""
    y = memo.get(x)
    if y is None:
        if len(memo) >= STEP_MEMO:
            memo.clear()
        y = memo[x] = curve(x)
    return y


class KernelTables:
    """Step time composed from kernel-sum tables (GEMMs, attention, lm_head), in ms."""

    def __init__(self, gemm: Curve, prefill_attention: Curve, decode_attention: Grid,
                 lm_head: Curve, kv_context_scale: float = 1.0) -> None:
        self.gemm, self.prefill_attention = gemm, prefill_attention
        self.decode_attention, self.lm_head = decode_attention, lm_head
        self.kv_context_scale = kv_context_scale
        # The GEMM and lm_head terms depend on token and sequence counts alone, which recur from
        # step to step (the contexts do not, so whole steps rarely recur): each count's value is
        # interpolated once, then looked up.
        self._gemm_ms: dict[int, float] = {}
        self._lm_head_ms: dict[int, float] = {}

    def gpu_ms(self, prefill_tokens: int, prefill_context: float, prefill_seqs: int,
               decode_seqs: int, decode_context: float) -> float:
        ms = _remembered(self._gemm_ms, self.gemm, prefill_tokens + decode_seqs)
        sampled = decode_seqs
        if prefill_tokens > 0:
            k = prefill_seqs if prefill_seqs > 0 else 1
            n = prefill_tokens / k
            ms += k * self.prefill_attention(math.sqrt(n * n + 2.0 * n * prefill_context / k))
            sampled += k
        if decode_seqs > 0:
            ms += self.decode_attention(decode_seqs, decode_context * self.kv_context_scale)
        return ms + _remembered(self._lm_head_ms, self.lm_head, sampled)

    @classmethod
    def from_rows(cls, prefill: Sequence[dict], decode: Sequence[dict], *,
                  decode_is_donor: bool = False, kv_context_scale: float = 1.0) -> "KernelTables":
        """``prefill``/``decode``: table rows of one GPU. A donor decode table (another model's)
        lends its attention and lm_head shape only; the GEMM curve then comes from prefill alone."""
        prefill = sorted(prefill, key=lambda r: int(r["prompt_tokens"]))
        gemm = {int(r["prompt_tokens"]): float(r["linear_and_elementwise_ms"]) for r in prefill}
        batches = sorted({int(r["batch_size"]) for r in decode})
        contexts = sorted({int(r["context_tokens_per_seq"]) for r in decode})
        cell = {(int(r["batch_size"]), int(r["context_tokens_per_seq"])): r for r in decode}
        lm_head = [float(cell[b, contexts[0]]["lm_head_ms"]) for b in batches]
        if decode_is_donor:
            own = float(prefill[0]["lm_head_ms"])
            lm_head = [own * v / lm_head[0] for v in lm_head]
        else:
            for b in batches:
                gemm.setdefault(b, float(cell[b, contexts[0]]["linear_and_elementwise_ms"]))
        tokens = sorted(gemm)
        attention = [[float(cell[b, c]["attention_ms"]) for c in contexts] for b in batches]
        return cls(
            gemm=KneeCurve(tokens, isotonic([gemm[t] for t in tokens])).tabulated(),
            prefill_attention=Curve([int(r["prompt_tokens"]) for r in prefill],
                                    isotonic([float(r["attention_ms"]) for r in prefill]),
                                    tail="quadratic"),
            decode_attention=monotone_grid(batches, contexts, attention),
            lm_head=Curve(batches, isotonic(lm_head)),
            kv_context_scale=kv_context_scale,
        )


class MeasuredTotals:
    """Step time from end-to-end measured totals (Splitwise), in ms; see the module docstring."""

    def __init__(self, prefill: Curve, decode_by_batch: Curve, decode_by_context: Curve,
                 gpu: GpuSpec, model: ModelSpec, tp: int) -> None:
        self.prefill, self.decode_by_batch, self.decode_by_context = (
            prefill, decode_by_batch, decode_by_context)
        self._ref = self.decode_by_context(SPLITWISE_DECODE_CONTEXT)
        self._kv_ms_per_token = (1e3 * model.kv_bytes_per_token_per_gpu(tp)
                                 / (gpu.hbm_bytes_per_s * gpu.kv_bw_eff))
        self._attn_ms_per_work = (1e3 * 4 * model.n_layers * model.n_heads * model.head_dim
                                  / tp / (gpu.peak_bf16_flops * gpu.attention_mfu))

    def decode_ms(self, seqs: int, context: float) -> float:
        extra_kv = (seqs - 1) * max(0.0, context - SPLITWISE_DECODE_CONTEXT)
        return (self.decode_by_batch(seqs) + self.decode_by_context(context) - self._ref
                + extra_kv * self._kv_ms_per_token)

    def gpu_ms(self, prefill_tokens: int, prefill_context: float, prefill_seqs: int,
               decode_seqs: int, decode_context: float) -> float:
        decode = self.decode_ms(decode_seqs, decode_context) if decode_seqs > 0 else 0.0
        if prefill_tokens <= 0:
            return decode
        k = prefill_seqs if prefill_seqs > 0 else 1
        ms = (self.prefill(prefill_tokens + decode_seqs)
              + prefill_tokens * prefill_context / k * self._attn_ms_per_work
              + decode_seqs * decode_context * self._kv_ms_per_token)
        return max(ms, decode)

    @classmethod
    def from_rows(cls, prefill: Sequence[dict], decode: Sequence[dict], gpu: GpuSpec,
                  model: ModelSpec, tp: int) -> "MeasuredTotals":
        prefill = sorted(prefill, key=lambda r: int(r["prompt_tokens"]))
        by_batch = sorted((int(r["batch_size"]), float(r["decode_step_ms_median"])) for r in decode
                          if int(r["prompt_tokens"]) == SPLITWISE_DECODE_CONTEXT)
        by_context = sorted((int(r["prompt_tokens"]), float(r["decode_step_ms_median"]))
                            for r in decode if int(r["batch_size"]) == 1)
        prefill_ms = KneeCurve([int(r["prompt_tokens"]) for r in prefill],
                               isotonic([float(r["prefill_ms_median"]) for r in prefill]))
        context_ms = Curve([c for c, _ in by_context], isotonic([v for _, v in by_context]))
        # batch 1 at the batch sweep's context is the context sweep's point too: one value for
        # it, the context sweep's monotone fit, so that decode_ms(1, c) is that fit
        anchor = context_ms(SPLITWISE_DECODE_CONTEXT)
        batch_ms = isotonic([anchor if b == 1 else v for b, v in by_batch])
        return cls(prefill_ms.tabulated(), Curve([b for b, _ in by_batch], batch_ms), context_ms,
                   gpu, model, tp)


class Roofline:
    """The formula fallback (``workers.sim.models.roofline_ms``), in ms."""

    def __init__(self, gpu: GpuSpec, model: ModelSpec, tp: int) -> None:
        self.gpu, self.model, self.tp = gpu, model, tp

    def gpu_ms(self, prefill_tokens: int, prefill_context: float, prefill_seqs: int,
               decode_seqs: int, decode_context: float) -> float:
        return roofline_ms(self.gpu, self.model, self.tp, prefill_tokens, prefill_context,
                           prefill_seqs, decode_seqs, decode_context)


# --- loading -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def read_table(path: Path) -> tuple[dict, ...]:
    with open(path, newline="") as f:
        return tuple(csv.DictReader(f))


def _table(data_dir: Path, name: str) -> tuple[dict, ...] | None:
    path = data_dir / TABLES / name
    return read_table(path) if path.is_file() else None


def _backend(gpu: GpuSpec, model: ModelSpec, tp: int, data_dir: Path):
    """(backend, overhead, source, detail) from the tables where they cover the combination."""
    validation = _table(data_dir, VALIDATION)
    overhead = (StepOverhead.fit([r for r in validation if r["gpu"].startswith("H100")])
                if validation else StepOverhead())
    if tp == 1 and model.name in PREFILL_TABLES:
        prefill = _table(data_dir, PREFILL_TABLES[model.name])
        decode = _table(data_dir, DECODE_TABLE)
        prefill = [r for r in prefill or () if r["gpu"] == gpu.label]
        decode = [r for r in decode or () if r["gpu"] == gpu.label]
        if prefill and decode:
            donor = model.name != "llama-3-8b"
            scale = model.kv_bytes_per_token / model_spec("llama-3-8b").kv_bytes_per_token
            tables = KernelTables.from_rows(prefill, decode, decode_is_donor=donor,
                                            kv_context_scale=scale if donor else 1.0)
            detail = ("kernel tables" + (f"; decode attention from llama-3-8b at {scale:g}x "
                                         "context" if donor else ""))
            return tables, overhead, "tables", detail
    if model.name in SPLITWISE_MODELS and gpu.name in SPLITWISE_GPUS:
        label, hw = SPLITWISE_MODELS[model.name], SPLITWISE_GPUS[gpu.name]

        def mine(r: dict) -> bool:
            return (r["model"] == label and r["hardware"] == hw
                    and int(r["tensor_parallel"]) == tp)

        prefill = [r for r in _table(data_dir, SPLITWISE_PREFILL) or () if mine(r)]
        decode = [r for r in _table(data_dir, SPLITWISE_DECODE) or () if mine(r)]
        if prefill and decode:
            return (MeasuredTotals.from_rows(prefill, decode, gpu, model, tp), NO_OVERHEAD,
                    "tables", "splitwise end-to-end totals")
    return Roofline(gpu, model, tp), overhead, "formula", "roofline"


#: Step times remembered per model (at most about 25 MiB): simulated engines ask for the same
#: steps over and over (one decoding sequence of a given context, an idle worker's prefill of a
#: prompt). Keys equal as numbers (1024 and 1024.0) give the same time, so they may share an entry.
STEP_MEMO = 1 << 17


class PerfModel:
    """Step times of one model on one GPU type at one tensor-parallel degree."""

    def __init__(self, gpu: GpuSpec, model: ModelSpec, tp: int, backend, overhead: StepOverhead,
                 source: str, detail: str = "") -> None:
        self.gpu, self.model, self.tp = gpu, model, tp
        self.backend, self.overhead = backend, overhead
        self.source, self.detail = source, detail
        self._gpu_ms = backend.gpu_ms
        self._ovh = (overhead.base_ms, overhead.per_seq_ms, overhead.per_kilotoken_ms / 1e3)
        self._steps: dict[tuple, float] = {}  # step_s by its arguments (see STEP_MEMO)

    @classmethod
    def load(cls, gpu: str, model: str, tp: int = 1, *, data_dir: Path | None = None,
             check_fit: bool = True) -> "PerfModel":
        """Tables where ``data_dir`` (default ``default_data_dir()``) has them, else the formula.

        Raises ``ValueError`` for an unknown GPU or model name, a bad ``tp``, or (``check_fit``)
        a model whose weights leave no room for KV cache at the default 0.9 memory utilisation.
        """
        gpu_, model_ = gpu_spec(gpu), model_spec(model)
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, not {tp!r}")
        backend, overhead, source, detail = _backend(gpu_, model_, tp,
                                                     data_dir or default_data_dir())
        perf = cls(gpu_, model_, tp, backend, overhead, source, detail)
        if check_fit and perf.kv_capacity_tokens() <= 0:
            raise ValueError(f"{model_.name} does not fit on {tp} x {gpu_.name}")
        if source == "formula":
            logger.info("no measured tables for %s on %s tp=%d: using the roofline formula",
                        model_.name, gpu_.name, tp)
        return perf

    @property
    def max_model_len(self) -> int | None:
        return self.model.max_model_len

    def step_s(self, prefill_tokens: int, prefill_context: float, decode_seqs: int,
               decode_context: float, prefill_seqs: int = 1) -> float:
        """Wall time of one engine iteration that prefills ``prefill_tokens`` new tokens (of
        ``prefill_seqs`` sequences whose already-computed context totals about
        ``prefill_context``) and decodes one token for each of ``decode_seqs`` sequences of mean
        context ``decode_context``; includes vLLM's CPU-side per-step overhead."""
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        key = (prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs)
        seconds = self._steps.get(key)
        if seconds is not None:
            return seconds
        ms = self._gpu_ms(prefill_tokens, prefill_context, prefill_seqs, decode_seqs,
                          decode_context)
        base, per_seq, per_token = self._ovh
        seqs = decode_seqs + (prefill_seqs if prefill_tokens > 0 else 0)
        context = decode_seqs * decode_context + prefill_context + prefill_tokens
        seconds = (ms + base + per_seq * seqs + per_token * context) * 1e-3
        if len(self._steps) >= STEP_MEMO:
            self._steps.clear()
        self._steps[key] = seconds
        return seconds

    def gpu_step_s(self, prefill_tokens: int, prefill_context: float, decode_seqs: int,
                   decode_context: float, prefill_seqs: int = 1) -> float:
        """``step_s`` without the CPU-side overhead (what the kernel tables measure)."""
        if prefill_tokens <= 0 and decode_seqs <= 0:
            return 0.0
        return self._gpu_ms(prefill_tokens, prefill_context, prefill_seqs, decode_seqs,
                            decode_context) * 1e-3

    def prefill_s(self, tokens: int) -> float:
        """Isolated prefill of one prompt: ``step_s(tokens, 0, 0, 0)``."""
        return self.step_s(tokens, 0, 0, 0)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode iteration of ``batch`` sequences: ``step_s(0, 0, batch, context)``."""
        return self.step_s(0, 0, batch, context)

    def load_s(self) -> float:
        """Seconds from a cold start until the engine can serve: LOAD_FIXED_S + weights/tp at
        LOAD_BYTES_PER_S (Llama-3-8B: 28 s; Llama-2-70B on TP 4: 37 s)."""
        return LOAD_FIXED_S + self.model.weights_bytes / self.tp / LOAD_BYTES_PER_S

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache per GPU, as vLLM sizes it:

            (memory_bytes * utilization - weights_bytes / tp - activation_reserve_bytes(tp))
            // kv_bytes_per_token_per_gpu(tp)

        ``memory_bytes``: driver-reported total (``GpuSpec``); weights: params * dtype bytes;
        reserve: ``ModelSpec.activation_reserve_bytes``; KV per GPU: kv_bytes_per_token / tp when
        tp divides the KV heads. Every TP rank holds the same tokens, so this is also the engine's.
        """
        return self.model.kv_capacity_tokens(self.gpu, self.tp, gpu_memory_utilization)

    def kv_capacity_blocks(self, block_size: int = 16, gpu_memory_utilization: float = 0.9) -> int:
        return self.kv_capacity_tokens(gpu_memory_utilization) // block_size

    def __repr__(self) -> str:
        return (f"PerfModel({self.gpu.name}, {self.model.name}, tp={self.tp}, "
                f"source={self.source!r}, {self.detail})")
