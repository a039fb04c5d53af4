"""Placement scorers: one or more per axis of placement. Each returns a score in [0, 1] per
candidate; the placer clamps, weights and sums them.

| name | axis | prefers |
|---|---|---|
| price | 1. GPU generation and price | more tokens per dollar (speed from the performance model / price) |
| kv_headroom | 2. memory headroom | more free KV blocks |
| prefix | 3. KV-cache state | more leading prefix blocks already cached |
| warmth | 4. weight warmth | a loaded model over one still loading |
| priority | 5. tenant priority | for high-priority requests, the least loaded workers |
| latency | 6. latency budget | a predicted TTFT well inside the time left |
| workflow | 7. workflow context | the worker that served the task's earlier steps, more so late in a task |
| load | (balance) | fewer running, waiting and pending requests |
| decode_deadlines | (the requests already there) | for a prompt whose prefill takes several engine steps, a worker where it pushes fewer requests in flight past their deadline (``1 / (1 + Candidate.deadlines_at_risk)``) |
| pool_weight | (slow controller) | pools the routing-weights controller favours |
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from controllers.router.candidates import Candidate
from workers.sim.perf import PerfModel
from schemas.requests import InferenceRequest


@dataclass(frozen=True)
class PlacementContext:
    request: InferenceRequest
    now_ms: int
    budget_s: float  # time left until the deadline, or the TTFT target when there is none
    has_deadline: bool
    pool_weights: dict[str, float] = field(default_factory=dict)
    shed_share: float | None = None  # below the shedding level: the share of its budget it may use


Scorer = Callable[[PlacementContext, list[Candidate]], list[float]]

#: The routing weight of a pool with no signal yet (``controllers.weights``): unknown is not bad.
NO_SIGNAL_WEIGHT = 1.0


@lru_cache(maxsize=256)
def _decode_speed(perf: PerfModel) -> float:
    """Decode steps per second at a typical batch: a GPU's speed for price comparisons."""
    return 1.0 / perf.decode_step_s(32, 1024)


def price(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    def tokens_per_usd(c: Candidate) -> float:
        speed = _decode_speed(c.perf)
        return speed / c.price_per_hour if c.price_per_hour > 0 else float("inf")

    values = [tokens_per_usd(c) for c in cands]
    best = max(values)
    return [1.0 if best == float("inf") and v == best else (v / best if best else 0.0)
            for v in values]


def kv_headroom(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    out = []
    for c in cands:
        total = c.worker.kv_blocks_used + c.worker.kv_blocks_free
        if not total:
            out.append(0.5)
            continue
        pending_blocks = c.pending * (ctx.request.prompt_tokens // 16 + 1)
        out.append(max(0.0, 1.0 - (c.worker.kv_blocks_used + pending_blocks) / total))
    return out


def prefix(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    blocks = len(ctx.request.prefix_hashes)
    return [c.overlap_blocks / blocks if blocks else 0.0 for c in cands]


def warmth(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    return [1.0 if c.worker.state == "warm" else 0.3 if c.worker.state == "loading" else 0.0
            for c in cands]


def load(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    most = max(c.load for c in cands)
    return [1.0 - c.load / (most + 1) for c in cands]


def priority(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    p = ctx.request.priority / 9
    return [p * s + (1 - p) * 0.5 for s in load(ctx, cands)]


def latency(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    budget = max(ctx.budget_s, 1e-3)
    return [min(1.0, max(0.0, 1.0 - c.predicted_ttft_s / budget)) for c in cands]


def workflow(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    r = ctx.request
    weight = 0.5 + 0.5 * (r.step / r.steps_total)
    return [weight if c.affinity else 0.0 for c in cands]


def decode_deadlines(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    return [1.0 / (1 + c.deadlines_at_risk) for c in cands]


def pool_weight(ctx: PlacementContext, cands: list[Candidate]) -> list[float]:
    """Each pool's routing weight relative to the best; a pool the weights leave out (a new
    one, until the controllers' next tick names it) weighs what one with no signal yet does."""
    if not ctx.pool_weights:
        return [1.0] * len(cands)
    weights = [ctx.pool_weights.get(c.worker.pool, NO_SIGNAL_WEIGHT) for c in cands]
    best = max(max(ctx.pool_weights.values()), max(weights)) or 1.0
    return [weight / best for weight in weights]


#: The registry: scorer name -> scorer. Renamed scorers keep their old name here as an alias.
SCORERS: dict[str, Scorer] = {
    "price": price,
    "kv_headroom": kv_headroom,
    "prefix": prefix,
    "warmth": warmth,
    "priority": priority,
    "latency": latency,
    "workflow": workflow,
    "load": load,
    "pool_weight": pool_weight,
    "decode_deadlines": decode_deadlines,
}

#: Default weights (config key ``router_weights``).
DEFAULT_WEIGHTS: dict[str, float] = {
    "price": 1.0,
    "kv_headroom": 0.5,
    "prefix": 2.0,
    "warmth": 1.0,
    "priority": 0.5,
    "latency": 2.0,
    "workflow": 1.0,
    "load": 1.5,
    "pool_weight": 0.5,
    "decode_deadlines": 2.0,
}
