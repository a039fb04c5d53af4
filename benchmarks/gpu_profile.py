"""Measure a Llama-3-8B-shaped forward pass on this machine's GPU, at and between the grid points
of the calibration tables, and write the results in the tables' own format.

    python -m benchmarks.gpu_profile --out DIR [--gpu h200] [--fused] [--points all|grid]
                                     [--budget-s 300]

Needs PyTorch with CUDA (not a dependency of Governor: run it where a GPU and PyTorch are).
What it measures: one engine iteration of Llama-3-8B (bf16, TP 1, 32 layers, random weights; the
time of a dense forward pass does not depend on the weights' values), built from PyTorch ops:
cuBLAS GEMMs (``F.linear``), RMSNorm, rotary embedding, SiLU-and-multiply, residual adds and
PyTorch's scaled-dot-product attention (the fastest of its flash / cuDNN / memory-efficient
backends that runs, chosen once per phase and recorded). Each point is captured in a CUDA graph
and replayed, so the figures are GPU time without Python's launch gaps, as the tables' kernel
sums are. Each residual add is one step with the norm after it; ``--fused`` compiles that step,
SiLU-and-multiply and the rotary embedding into one Triton kernel each (torch.compile), as vLLM
fuses them. It is not vLLM: vLLM runs the same cuBLAS GEMMs but its own attention and fused
kernels, and adds its CPU-side scheduling (``workers.sim.perf.StepOverhead``).

Per point three graphs are timed: the whole iteration, the iteration without its attention (each
layer passes its queries on instead), and lm_head alone. Attention is the first less the second,
GEMMs and elementwise the second less lm_head. (The first version, which made four of the runs
committed on 4 Dec 2026, timed the 32 attention calls alone, back to back, so a small decode KV
cache stayed in L2 between them, and it fused one residual add of the two in a layer: see
``VERSION``.)
Written, in the columns of ``llama3_8b_{prefill,decode}_*.csv`` under the calibration tables
(STEM: ``llama3_8b_<gpu>``, ``llama3_8b_<gpu>_fused`` with ``--fused``):
- ``STEM_prefill_measured.csv``: one prompt of N tokens (lm_head on its last token), N at the
  tables' grid points, the points between them, and (``--points all``) every 64 tokens to 4096;
- ``STEM_decode_measured.csv``: a decode step of B sequences of C tokens of context, B and C at
  the tables' grid points and between them;
- ``STEM_measured.json``: the GPU, PyTorch and CUDA versions, the tool's ``version``, the
  attention backends tried.
Rows are written as they are measured; ``--budget-s`` stops early (the most telling points
first). ``python -m benchmarks.fidelity`` compares the simulated engine with these files where
they are present (section 6).
"""

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # not a dependency of Governor: main() says what is missing
    torch = F = None

HIDDEN, INTERMEDIATE, LAYERS = 4096, 14336, 32
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 8, 128, 128256
#: The calibration tables' grid points, and the points halfway between them (held out).
PREFILL_GRID = [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
BATCH_GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXT_GRID = [128, 512, 1024, 2048, 4096, 8192, 16384]
COLUMNS = ["model", "gpu", "tp", "dtype"]
TAIL = ["linear_and_elementwise_ms", "attention_ms", "lm_head_ms"]
DEVICE = "cuda"
GPU_LABELS = {"a100": "A100-SXM4-80GB", "h100": "H100-SXM", "h200": "H200-SXM"}
#: Written in each run's JSON. Version 1 (no such key) timed attention alone and fused one of a
#: layer's two residual adds; version 2 times it in place and fuses both.
VERSION = 2


def between(grid: list[int]) -> list[int]:
    """The midpoints of a grid's intervals, rounded to a multiple of 16 above 64."""
    mids = []
    for a, b in zip(grid, grid[1:]):
        m = (a + b) // 2
        mids.append(m if m < 64 else round(m / 16) * 16)
    return mids


def prefill_points(sweep: bool = True) -> list[int]:
    """Grid and midpoints first (they decide the held-out figures), then a sweep every 64."""
    first = sorted(set(PREFILL_GRID) | set(between(PREFILL_GRID)))
    return first + [n for n in range(64, 4097, 64) if sweep and n not in first]


def decode_points() -> list[tuple[int, int]]:
    batches = sorted(set(BATCH_GRID) | set(between(BATCH_GRID)))
    contexts = sorted(set(CONTEXT_GRID) | set(between(CONTEXT_GRID)))
    grid = [(b, c) for b in BATCH_GRID for c in CONTEXT_GRID]
    return grid + [(b, c) for b in batches for c in contexts if (b, c) not in grid]


def add_norm(x, residual, weight):
    """(x + residual, its RMSNorm)."""
    x = x + residual
    return x, F.rms_norm(x, (HIDDEN,), weight)


def silu_and_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(t, cos, sin, pos):
    """Rotary embedding of t [n, heads, 128] at positions pos, tables [positions, 1, 64]."""
    cos, sin = cos[pos], sin[pos]
    t1, t2 = t[..., :64], t[..., 64:]
    return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)


class Llama:
    """Random bf16 weights of Llama-3-8B's shape on the GPU, and its iteration as functions."""

    def __init__(self, max_batch: int, max_context: int, max_tokens: int,
                 fused: bool = False) -> None:
        # The elementwise steps, each one kernel when fused (Triton through torch.compile, as
        # vLLM fuses them in its own kernels), several PyTorch kernels each when not.
        self.add_norm, self.silu_and_mul, self.rotate = (
            torch.compile(f, dynamic=True, fullgraph=True) if fused else f
            for f in (add_norm, silu_and_mul, rotate))
        self.grouped = True  # SDPA's enable_gqa; False: the 8 KV heads repeated to 32 first
        dev, dt = DEVICE, torch.bfloat16

        def weight(*shape):
            return torch.randn(*shape, device=dev, dtype=dt) * 0.02

        self.layers = [dict(qkv=weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
                            o=weight(HIDDEN, HEADS * HEAD_DIM),
                            gate_up=weight(2 * INTERMEDIATE, HIDDEN),
                            down=weight(HIDDEN, INTERMEDIATE),
                            norm1=torch.ones(HIDDEN, device=dev, dtype=dt),
                            norm2=torch.ones(HIDDEN, device=dev, dtype=dt))
                       for _ in range(LAYERS)]
        self.final_norm = torch.ones(HIDDEN, device=dev, dtype=dt)
        self.lm_head = weight(VOCAB, HIDDEN)
        # One KV cache, shared by the layers: each layer reads its own region of HBM in a real
        # engine; here every layer's read is as large, and the ~436 MB of weights read between
        # two layers' attention leave nothing of it in the 50-60 MB L2.
        self.k_cache = weight(max_batch, KV_HEADS, max_context, HEAD_DIM)
        self.v_cache = weight(max_batch, KV_HEADS, max_context, HEAD_DIM)
        angles = torch.arange(max(max_tokens, max_context), device=dev, dtype=torch.float32)
        angles = angles[:, None] * (500000.0 ** (-torch.arange(0, 64, device=dev) / 64))[None]
        self.cos = angles.cos().to(dt)[:, None, :]
        self.sin = angles.sin().to(dt)[:, None, :]

    def rope(self, t, pos):
        return self.rotate(t, self.cos, self.sin, pos)

    def qkv(self, layer, h, pos):
        q, k, v = F.linear(h, layer["qkv"]).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        n = h.shape[0]
        q = self.rope(q.view(n, HEADS, HEAD_DIM), pos)
        k = self.rope(k.view(n, KV_HEADS, HEAD_DIM), pos)
        return q, k, v.view(n, KV_HEADS, HEAD_DIM)

    def layers_forward(self, x, attend):
        """The 32 layers and the final norm: each residual add fused with the norm after it,
        as vLLM does (``add_norm``)."""
        h = F.rms_norm(x, (HIDDEN,), self.layers[0]["norm1"])
        norms = [layer["norm1"] for layer in self.layers[1:]] + [self.final_norm]
        for layer, next_norm in zip(self.layers, norms):
            x, h = self.add_norm(x, F.linear(attend(layer, h), layer["o"]), layer["norm2"])
            x, h = self.add_norm(x, F.linear(self.silu_and_mul(F.linear(h, layer["gate_up"])),
                                             layer["down"]), next_norm)
        return h

    def logits(self, h):
        return F.linear(h, self.lm_head)

    def attention(self, q, k, v, causal: bool):
        """SDPA over [batch, heads, tokens, head_dim], grouped query heads."""
        if not self.grouped:
            k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=self.grouped)

    # -- prefill: one prompt of n tokens --------------------------------------------------------
    def prefill_attention(self, q, k, v):
        """q [n, 32, 128], k and v [n, 8, 128] -> [n, 4096], causal."""
        n = q.shape[0]
        out = self.attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                             v.transpose(0, 1)[None], causal=True)
        return out[0].transpose(0, 1).reshape(n, HEADS * HEAD_DIM)

    def prefill(self, x, attention: bool = True):
        """``attention`` False: the pass with each layer's attention left out (its output is
        the queries), to time the rest."""
        n = x.shape[0]
        pos = torch.arange(n, device=x.device)

        def attend(layer, h):
            q, k, v = self.qkv(layer, h, pos)
            return self.prefill_attention(q, k, v) if attention else q.reshape(n, -1)

        return self.logits(self.layers_forward(x, attend)[-1:])

    # -- decode: b sequences of c tokens of context, one new token each ---------------------------
    def decode_attention(self, q, b, c):
        """q [b, 32, 128] against the cache's first c positions of b sequences -> [b, 4096]."""
        out = self.attention(q[:, :, None], self.k_cache[:b, :, :c], self.v_cache[:b, :, :c],
                             causal=False)
        return out.reshape(b, HEADS * HEAD_DIM)

    def decode(self, x, c, attention: bool = True):
        b = x.shape[0]
        pos = torch.full((b,), c - 1, device=x.device)

        def attend(layer, h):
            q, k, v = self.qkv(layer, h, pos)
            self.k_cache[:b, :, c - 1] = k
            self.v_cache[:b, :, c - 1] = v
            return self.decode_attention(q, b, c) if attention else q.reshape(b, -1)

        return self.logits(self.layers_forward(x, attend))


class Timer:
    """Median GPU time of a function, captured once in a CUDA graph and replayed."""

    def __init__(self, reps: int, warmup: int = 3) -> None:
        self.reps, self.warmup = reps, warmup

    def ms(self, fn, reps: int | None = None) -> float:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # outside the graph once: lazy initialisation, kernel selection
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(self.warmup):
            graph.replay()
        times = []
        for _ in range(reps or self.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del graph
        return statistics.median(times)


def choose_backend(model: Llama, fn_for, timer: Timer,
                   groupings: tuple[bool, ...] = (True, False)) -> tuple[object, str, dict]:
    """The fastest SDPA backend that runs ``fn_for(backend)``, with grouped query heads if one
    takes them (else with the KV heads repeated: ``model.grouped`` is left False); also each
    one's time or error."""
    from torch.nn.attention import SDPBackend
    tried: dict[str, str] = {}
    for grouped in groupings:
        model.grouped, best = grouped, None
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION):
            name = backend.name + ("" if grouped else " (KV heads repeated)")
            try:
                ms = timer.ms(fn_for(backend), reps=5)
            except Exception as exc:  # noqa: BLE001 - an unsupported backend raises its own
                tried[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                torch.cuda.synchronize()
                continue
            tried[name] = f"{ms:.3f} ms"
            if best is None or ms < best[1]:
                best = (backend, ms, name)
        if best is not None:
            return best[0], best[2], tried
    raise SystemExit(f"no fast attention backend runs here: {tried}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the CSV and JSON files")
    ap.add_argument("--gpu", default="h200", choices=sorted(GPU_LABELS),
                    help="the calibration tables' name for this GPU (default h200)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="stop measuring after this many seconds (default 300)")
    ap.add_argument("--reps", type=int, default=10, help="timed replays per graph (default 10)")
    ap.add_argument("--fused", action="store_true",
                    help="fuse the elementwise steps (torch.compile); files named *_fused_*")
    ap.add_argument("--points", choices=("all", "grid"), default="all",
                    help="'grid': the grid and its midpoints only, without the prefill sweep")
    args = ap.parse_args()
    if torch is None:
        raise SystemExit("gpu_profile needs PyTorch with CUDA (pip install torch)")
    if not torch.cuda.is_available():
        raise SystemExit("gpu_profile needs a CUDA GPU; torch.cuda.is_available() is False")
    from torch.nn.attention import sdpa_kernel

    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    pre_points, dec_points = prefill_points(sweep=args.points == "all"), decode_points()
    max_tokens, max_context = max(pre_points), max(c for _, c in dec_points)
    model = Llama(max(b for b, _ in dec_points), max_context, max_tokens, args.fused)
    timer = Timer(args.reps)
    label = GPU_LABELS[args.gpu]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"weights and KV cache {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)

    x_pre = torch.randn(max_tokens, HIDDEN, device=DEVICE, dtype=torch.bfloat16)
    x_dec = torch.randn(max(b for b, _ in dec_points), HIDDEN, device=DEVICE, dtype=torch.bfloat16)

    def under(backend, fn):
        def run():
            with sdpa_kernel([backend]):
                fn()
        return run

    # The backend of each phase is chosen on a whole pass. Both phases share one flag for
    # grouped heads: if prefill needs the KV heads repeated, so does decode.
    n, b, c = min(4096, max_tokens), min(64, len(x_dec)), min(4096, max_context)
    pre_backend, pre_name, pre_tried = choose_backend(
        model, lambda be: under(be, lambda: model.prefill(x_pre[:n])), timer)
    dec_backend, dec_name, dec_tried = choose_backend(
        model, lambda be: under(be, lambda: model.decode(x_dec[:b], c)), timer,
        (True, False) if model.grouped else (False,))
    if not model.grouped and "repeated" not in pre_name:  # decode needed them repeated
        pre_backend, pre_name, pre_tried = choose_backend(
            model, lambda be: under(be, lambda: model.prefill(x_pre[:n])), timer, (False,))
    print(f"attention: prefill {pre_name} ({pre_tried}); decode {dec_name} ({dec_tried})",
          flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "reps": args.reps, "version": VERSION,
            "fused": args.fused,
            "prefill_attention": pre_name, "decode_attention": dec_name,
            "backends_tried": {"prefill": pre_tried, "decode": dec_tried}}
    source = (f"measured: benchmarks/gpu_profile.py{' --fused' if args.fused else ''}, "
              f"torch {torch.__version__}, CUDA graphs, SDPA {pre_name}/{dec_name}")
    stem = f"llama3_8b_{args.gpu}" + ("_fused" if args.fused else "")
    pre_path = args.out / f"{stem}_prefill_measured.csv"
    dec_path = args.out / f"{stem}_decode_measured.csv"
    with open(pre_path, "w", newline="") as pf, open(dec_path, "w", newline="") as df:
        pre_w, dec_w = csv.writer(pf), csv.writer(df)
        pre_w.writerow(COLUMNS + ["prompt_tokens"] + TAIL + ["prefill_ms", "sources"])
        dec_w.writerow(COLUMNS + ["batch_size", "context_tokens_per_seq"] + TAIL
                       + ["decode_step_ms", "sources"])
        lm_heads: dict[int, float] = {}

        def lm_head(b: int) -> float:
            if b not in lm_heads:
                lm_heads[b] = timer.ms(lambda: model.logits(x_dec[:b]))
            return lm_heads[b]

        # Attention is the whole pass less the pass without it: timed apart, 32 calls back to
        # back would find a small KV cache in L2, which the weights read between two layers'
        # attention flush in a real pass.
        def prefill(n: int) -> None:
            with sdpa_kernel([pre_backend]):
                total = timer.ms(lambda: model.prefill(x_pre[:n]))
            attn = total - timer.ms(lambda: model.prefill(x_pre[:n], attention=False))
            lm = lm_head(1)
            pre_w.writerow(["Llama-3-8B", label, 1, "bf16", n, f"{total - attn - lm:.4f}",
                            f"{attn:.4f}", f"{lm:.4f}", f"{total:.4f}", source])
            pf.flush()
            print(f"prefill {n:>6} tokens: {total:8.3f} ms (attention {attn:.3f})", flush=True)

        def decode(point: tuple[int, int]) -> None:
            b, c = point
            with sdpa_kernel([dec_backend]):
                total = timer.ms(lambda: model.decode(x_dec[:b], c))
            attn = total - timer.ms(lambda: model.decode(x_dec[:b], c, attention=False))
            lm = lm_head(b)
            dec_w.writerow(["Llama-3-8B", label, 1, "bf16", b, c, f"{total - attn - lm:.4f}",
                            f"{attn:.4f}", f"{lm:.4f}", f"{total:.4f}", source])
            df.flush()
            print(f"decode batch {b:>3} context {c:>5}: {total:8.3f} ms "
                  f"(attention {attn:.3f}, lm_head {lm:.3f})", flush=True)

        done, failed = {"prefill": 0, "decode": 0}, []
        # The two phases interleaved, so that a budget cut leaves both their grid and midpoints.
        order = interleave([("prefill", n) for n in pre_points],
                            [("decode", bc) for bc in dec_points])
        for phase, point in order:
            if time.monotonic() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopping", flush=True)
                break
            try:
                (prefill if phase == "prefill" else decode)(point)
                done[phase] += 1
            except Exception as exc:  # noqa: BLE001 - report the point and go on
                failed.append(f"{phase} {point}: {type(exc).__name__}: {exc}"[:300])
                print(f"FAILED {failed[-1]}", flush=True)
            torch.cuda.empty_cache()
    meta.update(points=done, failed=failed, seconds=round(time.monotonic() - started, 1))
    (args.out / f"{stem}_measured.json").write_text(json.dumps(meta, indent=2))
    print(f"{done['prefill']} prefill and {done['decode']} decode points, {len(failed)} failed, "
          f"in {meta['seconds']} s -> {args.out}", flush=True)
    if failed or not all(done.values()):
        sys.exit(1)


def interleave(a: list, b: list) -> list:
    """a and b merged in proportion, each keeping its order."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and i * len(b) <= j * len(a)):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


if __name__ == "__main__":
    main()
