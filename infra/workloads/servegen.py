"""Multi-tenant arrivals from ServeGen's per-tenant rate traces and length distributions.

Data (``shared/data/traces/servegen/<model>/``): ``chunk-<tenant>-trace.csv`` gives, per 600 s
window, the tenant's rate, CV and fitted inter-arrival distribution; ``chunk-<tenant>-dataset.json.gz``
gives, per 6 h block, empirical PMFs of input and output tokens.

How a workload is built (deterministic per ``seed``):
- the span ``[start_s, start_s + duration_s)`` of the 14-day trace is replayed from time 0;
- each tenant's arrivals in each window are a renewal process with the window's fitted shape at
  the window's rate (``infra.workloads.arrivals``); all rates are multiplied by one factor so the
  span's mean total rate is ``mean_rps`` (None: the published rates), then by ``rate_scale``;
- lengths are drawn from the tenant's PMFs of the 6 h block the window falls in; tenants without
  PMFs there (ServeGen publishes none for tenants carrying 29% of m-mid's requests) draw from the
  mixture of the other tenants' PMFs, weighted by their request counts in the span;
- tenants are named ``<model>-t<id>``. Priority rule: tenants ranked by requests in the span, the
  top quarter by volume (bulk users) get priority 2, the middle half 5, the smallest quarter 8
  (small interactive tenants are the premium class);
- no prefix hashes (ServeGen has none) and no SLOs (the simulator's defaults apply).
"""

import ast
import csv
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infra.traces import TraceError, TraceRequest
from infra.workloads.arrivals import renewal_arrivals

WINDOW_S = 600
BLOCK_S = 21_600
DEFAULT_START_S = 36 * 3600  # day 2, 12:00 of the trace: a busy, gap-free stretch
SPAN_S = 14 * 86_400  # what the trace covers


@dataclass(frozen=True)
class _Window:
    tenant: str
    start_s: int
    rate: float
    dist: str
    shape: float


def _windows(folder: Path, start_s: float, end_s: float) -> list[_Window]:
    out = []
    for path in sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(p.name.split("-")[1])):
        tenant = path.name.split("-")[1]
        with path.open(newline="") as fh:
            rows = csv.reader(fh)
            for row in rows:
                try:
                    t, rate = int(row[0]), float(row[1])
                    if rate > 0 and t + WINDOW_S > start_s and t < end_s:
                        out.append(_Window(tenant, t, rate, row[3], float(row[4] or 0)))
                except (ValueError, IndexError) as exc:  # (data of one's own: --data-dir)
                    raise TraceError(f"{path} line {rows.line_num}: not a ServeGen rate row "
                                     "(window_start_s, rate_rps, cv, dist, p1, p2): "
                                     f"{str(exc)[:200]}") from None
    return out


def _pmf(text: str, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A PMF's lengths and probabilities (normalised), or None where it has none; a
    ``ValueError`` naming ``field`` and the problem where it is no PMF (a length below 0, a
    probability below 0 or not finite, or all 0: numpy would fail on drawing)."""
    table = ast.literal_eval(text) if text else {}
    if not table:
        return None
    if not isinstance(table, dict):
        raise ValueError(f"{field}: not a {{length: probability}} table: {text[:80]!r}")
    for length, p in table.items():
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"{field}: length {length!r} is not an integer >= 0")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not p >= 0 \
                or p == float("inf"):
            raise ValueError(f"{field}: length {length} has probability {p!r}; expected a "
                             "finite number >= 0")
    values = np.fromiter(table.keys(), dtype=np.int64)
    probs = np.fromiter(table.values(), dtype=np.float64)
    with np.errstate(over="ignore"):  # (a sum past 1.8e308: refused below, as inf)
        total = probs.sum()
    if not 0 < total < float("inf"):
        raise ValueError(f"{field}: its probabilities sum to {total:g}; expected a finite "
                         "sum above 0")
    return values, probs / total


def _lengths(folder: Path, tenant: str, block: int) -> tuple | None:
    path = folder / f"chunk-{tenant}-dataset.json.gz"
    if not path.exists():
        return None
    try:
        with gzip.open(path, "rt") as fh:
            fields = json.load(fh).get(str(block))
        if not fields:
            return None
        inputs = _pmf(fields.get("input_tokens", ""), "input_tokens")
        outputs = _pmf(fields.get("output_tokens", ""), "output_tokens")
    except (OSError, EOFError, ValueError, SyntaxError, AttributeError, OverflowError) as exc:
        raise TraceError(f"{path}: not ServeGen length distributions (block {block}): "
                         f"{str(exc)[:200]}") from None
    return (inputs, outputs) if inputs and outputs else None


def _priorities(counts: dict[str, int]) -> dict[str, int]:
    ranked = sorted(counts, key=lambda t: (-counts[t], int(t)))
    n = len(ranked)
    return {t: 2 if r < n / 4 else (5 if r < 3 * n / 4 else 8) for r, t in enumerate(ranked)}


#: The most requests a built workload holds (it is built in memory: about 1 GB).
MAX_REQUESTS = 2_000_000


#: Where ``--data-dir`` points when it is not given, as the errors of a folder without the data
#: a workload is built from say it.
TRACES_DIR_DEFAULT = ("default: $GOVERNOR_DATA_DIR/traces, else ../shared/data/traces next to "
                      "the checkout")


def _no_data(data_dir: Path, model: str) -> str:
    """Why there is no ServeGen data of ``model`` in ``data_dir``, naming what to change."""
    models = sorted(p.name for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []
    if not models:
        return (f"no ServeGen data in {data_dir}: give --data-dir the traces folder that holds "
                f"servegen/ ({TRACES_DIR_DEFAULT})")
    choices = f"{', '.join(models[:-1])} or {models[-1]}" if len(models) > 1 else models[0]
    return f"--model {model!r}: no ServeGen data of it in {data_dir}; choose {choices}"


def servegen_workload(data_dir: Path, model: str = "m-mid", *, start_s: float = DEFAULT_START_S,
                      duration_s: float = 600.0, mean_rps: float | None = None,
                      rate_scale: float = 1.0, seed: int = 0,
                      progress: Callable[[int], None] | None = None) -> list[TraceRequest]:
    """The span's requests, sorted by arrival (see the module's docstring); ``progress``, where
    given, is called with how many are built so far, after each tenant's block of them."""
    folder = Path(data_dir) / model
    if not folder.is_dir():
        raise TraceError(_no_data(Path(data_dir), model))
    end_s = start_s + duration_s
    if end_s > SPAN_S:  # (its rate would be averaged over a stretch with no data)
        raise TraceError(f"ServeGen covers {SPAN_S:,} s (14 days): --start-s {start_s:.0f} and "
                         f"--duration {duration_s:g} end at {end_s:,.0f} s, past it")
    windows = _windows(folder, start_s, end_s)
    if not windows:
        raise TraceError(f"ServeGen {model}: no traffic in [{start_s}, {end_s}) s")
    published = sum(w.rate * (min(w.start_s + WINDOW_S, end_s) - max(w.start_s, start_s))
                    for w in windows) / duration_s
    factor = (mean_rps / published if mean_rps else 1.0) * rate_scale
    expected = published * factor * duration_s
    if expected > MAX_REQUESTS:  # about 500 bytes of memory a request while it is built
        raise TraceError(
            f"ServeGen {model}: {duration_s:g} s at {published * factor:,.1f} requests/s is about "
            f"{expected:,.0f} requests, over the {MAX_REQUESTS:,} a workload holds; shorten "
            "--duration or set a lower --mean-rps (or --rate-scale)")
    rng = np.random.default_rng(seed)
    arrivals: dict[str, list[tuple[float, int]]] = {}
    for w in windows:
        times = renewal_arrivals(max(w.start_s, start_s), min(w.start_s + WINDOW_S, end_s),
                                 w.dist, w.shape, w.rate * factor, rng)
        block = (w.start_s // BLOCK_S) * BLOCK_S
        arrivals.setdefault(w.tenant, []).extend((t - start_s, block) for t in times)
    counts = {t: len(a) for t, a in arrivals.items() if a}
    priorities = _priorities(counts)
    pmfs = {(t, b): _lengths(folder, t, b) for t, a in arrivals.items() for b in {x for _, x in a}}
    out: list[TraceRequest] = []
    for tenant in sorted(counts, key=int):
        times = arrivals[tenant]
        for block in sorted({b for _, b in times}):
            at = [t for t, b in times if b == block]
            inputs, outputs = _draw_lengths(pmfs, tenant, block, counts, len(at), rng)
            out.extend(TraceRequest(arrival_s=round(t, 6), prompt_tokens=int(p),
                                    output_tokens=max(int(o), 1), tenant=f"{model}-t{tenant}",
                                    priority=priorities[tenant])
                       for t, p, o in zip(at, inputs, outputs))
            if progress is not None:
                progress(len(out))
    out.sort(key=lambda r: (r.arrival_s, r.tenant))
    return out


def _draw_lengths(pmfs: dict, tenant: str, block: int, counts: dict[str, int], n: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    own = pmfs.get((tenant, block))
    if own is not None:
        (iv, ip), (ov, op) = own
        return rng.choice(iv, n, p=ip), rng.choice(ov, n, p=op)
    donors = [(t, pmf) for (t, b), pmf in sorted(pmfs.items()) if b == block and pmf is not None]
    if not donors:
        raise TraceError(f"ServeGen: no length distribution at all for block {block}")
    weights = np.array([counts[t] for t, _ in donors], dtype=float)
    pick = rng.choice(len(donors), n, p=weights / weights.sum())
    inputs, outputs = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for k, (_, ((iv, ip), (ov, op))) in enumerate(donors):
        mask = pick == k
        m = int(mask.sum())
        if m:
            inputs[mask], outputs[mask] = rng.choice(iv, m, p=ip), rng.choice(ov, m, p=op)
    return inputs, outputs
