"""The placer: filters, then weighted scorers, then the best candidate.

The framework, not the plugins, clamps each score to [0, 1], weights and sums them; ties go to
the less loaded worker, then the lower slot, so placement is deterministic.
"""

from dataclasses import dataclass

from controllers.router.candidates import Candidate
from controllers.router.filters import DEFAULT_FILTERS, FILTERS
from controllers.router.scorers import DEFAULT_WEIGHTS, SCORERS, PlacementContext


@dataclass(frozen=True)
class Placement:
    chosen: Candidate | None
    scores: dict[str, float]  # the chosen candidate's score per scorer
    filtered_out_by: str | None = None  # the filter that left no candidate


def _unknown(kind: str, names: list[str], known) -> str:
    """``unknown scorer 'x'; known: a, b`` (``names`` are not in ``known``)."""
    return (f"unknown {kind}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}; "
            f"known: {', '.join(sorted(known))}")


class Placer:
    def __init__(self, weights: dict[str, float] | None = None,
                 filters: tuple[str, ...] = DEFAULT_FILTERS) -> None:
        self.set_weights(weights or DEFAULT_WEIGHTS)
        unknown = [f for f in filters if f not in FILTERS]
        if unknown:
            raise ValueError(_unknown("filter", unknown, FILTERS))
        self.filters = [(name, FILTERS[name]) for name in filters]

    def set_weights(self, weights: dict[str, float]) -> None:
        unknown = [name for name in weights if name not in SCORERS]
        if unknown:
            raise ValueError(_unknown("scorer", unknown, SCORERS))
        self.weights = {name: w for name, w in weights.items() if w > 0}

    def place(self, ctx: PlacementContext, cands: list[Candidate]) -> Placement:
        for name, keep in self.filters:
            kept = keep(ctx, cands)
            if not kept:
                return Placement(None, {}, filtered_out_by=name)
            cands = kept
        per_scorer = {name: _clamped(SCORERS[name](ctx, cands)) for name in self.weights}
        totals = [0] * len(cands)
        for name, scores in per_scorer.items():  # summed per candidate in scorer order
            weight = self.weights[name]
            totals = [total + weight * score for total, score in zip(totals, scores)]
        best = max(range(len(cands)),
                   key=lambda i: (totals[i], -cands[i].load, -cands[i].worker.slot))
        return Placement(cands[best], {name: round(s[best], 3) for name, s in per_scorer.items()})


def _clamped(scores: list[float]) -> list[float]:
    """Each score as ``min(1.0, max(0.0, s))`` gives it (NaN: 0.0), without two calls a score."""
    return [s if 0.0 < s < 1.0 else (1.0 if s >= 1.0 else 0.0) for s in scores]
