"""Placement filters: which candidates may take the request at all.

| name | removes |
|---|---|
| breaker_open | workers whose circuit breaker is open; a half-open one only takes a probe when idle of probes |
| cold_when_warm_fits | workers still loading while a warm one can meet the deadline |
| deadline | workers predicted to give the first token after its budget (its TTFT target or the time left before its deadline, whichever is less), with 15% headroom (all of them: the request is rejected early) |
| shed | for a request worth less than the shedding level: workers predicted to need more than its share of its budget (``admission.shed_share``; all of them: it is shed) |
"""

from collections.abc import Callable

from controllers.router.candidates import Candidate
from controllers.router.scorers import PlacementContext

Filter = Callable[[PlacementContext, list[Candidate]], list[Candidate]]


def breaker_open(ctx: PlacementContext, cands: list[Candidate]) -> list[Candidate]:
    # (a probe leaves ``pending`` once a heartbeat counts it: before 7 Dec the half-open
    # worker then took another request while its probe still ran)
    return [c for c in cands
            if c.breaker == "closed" or (c.breaker == "half_open" and c.load == 0)]


def cold_when_warm_fits(ctx: PlacementContext, cands: list[Candidate]) -> list[Candidate]:
    warm_fits = any(c.worker.state == "warm" and c.predicted_ttft_s <= ctx.budget_s for c in cands)
    return [c for c in cands if c.worker.state == "warm"] if warm_fits else cands


#: Share of the time left that a predicted TTFT may use: headroom for prediction error (the
#: prediction sees the fleet as of its last heartbeat, up to half a second old).
DEADLINE_HEADROOM = 0.85


def deadline(ctx: PlacementContext, cands: list[Candidate]) -> list[Candidate]:
    if not ctx.has_deadline:
        return cands
    return [c for c in cands if c.predicted_ttft_s <= DEADLINE_HEADROOM * ctx.budget_s]


def shed(ctx: PlacementContext, cands: list[Candidate]) -> list[Candidate]:
    if ctx.shed_share is None:
        return cands
    return [c for c in cands if c.predicted_ttft_s <= ctx.shed_share * ctx.budget_s]


FILTERS: dict[str, Filter] = {
    "breaker_open": breaker_open,
    "cold_when_warm_fits": cold_when_warm_fits,
    "deadline": deadline,
    "shed": shed,
}
DEFAULT_FILTERS = ("breaker_open", "cold_when_warm_fits", "deadline", "shed")
