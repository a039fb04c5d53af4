"""Placement policies by name: Governor's full placer and the baselines it is measured against.

Every policy chooses among the same candidates (``controllers.router.candidates``):
- ``governor``: filters and seven-axis weighted scorers (``placement.Placer``);
- ``round_robin``: the next live worker in slot order;
- ``least_loaded``: fewest waiting + running (+ pending) requests;
- ``kv_aware``: NVIDIA Dynamo's KV router cost, as its router design document gives it:
  ``cost = prefill_load_scale * max(prefill_blocks - overlap_score_credit * overlap_blocks, 0)
  + decode_blocks``, with prefill_blocks = (the worker's prompt tokens not yet prefilled + this
  request's input tokens) / block size, overlap_blocks = leading prompt blocks already cached on
  the worker, decode_blocks = blocks of its active sequences plus this request's; defaults
  ``prefill_load_scale = 1.0``, ``overlap_score_credit = 1.0``, temperature 0 (lowest cost wins).
"""

from collections.abc import Callable

from controllers.router.candidates import TYPICAL_PROMPT_TOKENS, Candidate
from controllers.router.placement import Placement, Placer
from controllers.router.scorers import PlacementContext

ENGINE_BLOCK = 16

Policy = Callable[[PlacementContext, list[Candidate]], Placement]


class RoundRobin:
    """Per model, the live worker next in slot order after the one last chosen (wrapping
    round), whichever workers the candidates hold this time."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # model -> slot last chosen

    def __call__(self, ctx: PlacementContext, cands: list[Candidate]) -> Placement:
        by_slot = sorted(cands, key=lambda c: c.worker.slot)
        last = self._last.get(ctx.request.model, -1)
        chosen = next((c for c in by_slot if c.worker.slot > last), by_slot[0])
        self._last[ctx.request.model] = chosen.worker.slot
        return Placement(chosen, {})


def least_loaded(ctx: PlacementContext, cands: list[Candidate]) -> Placement:
    return Placement(min(cands, key=lambda c: (c.load, c.worker.slot)), {})


class KvAware:
    def __init__(self, prefill_load_scale: float = 1.0, overlap_score_credit: float = 1.0) -> None:
        self.prefill_load_scale = prefill_load_scale
        self.overlap_score_credit = overlap_score_credit

    def cost(self, ctx: PlacementContext, c: Candidate) -> float:
        """In KV blocks of the engine's size (16 tokens), the unit Dynamo uses throughout."""
        reported = c.worker.prefill_backlog_tokens
        backlog = c.pending_prompt_tokens + (
            c.worker.waiting * TYPICAL_PROMPT_TOKENS if reported is None else reported)
        prefill_blocks = (backlog + ctx.request.prompt_tokens) / ENGINE_BLOCK
        overlap_blocks = c.overlap_blocks * ctx.request.block_size / ENGINE_BLOCK
        decode_blocks = c.worker.kv_blocks_used + ctx.request.prompt_tokens / ENGINE_BLOCK
        uncovered = max(prefill_blocks - self.overlap_score_credit * overlap_blocks, 0.0)
        return self.prefill_load_scale * uncovered + decode_blocks

    def __call__(self, ctx: PlacementContext, cands: list[Candidate]) -> Placement:
        return Placement(min(cands, key=lambda c: (self.cost(ctx, c), c.worker.slot)), {})


def make_policy(name: str, weights: dict[str, float] | None = None) -> Policy:
    if name == "governor":
        return Placer(weights).place
    if name == "round_robin":
        return RoundRobin()
    if name == "least_loaded":
        return least_loaded
    if name == "kv_aware":
        return KvAware()
    raise ValueError(f"unknown policy {name!r}; choose governor, round_robin, least_loaded or kv_aware")


POLICIES = ("governor", "round_robin", "least_loaded", "kv_aware")
