"""Admission: the checks a request passes before it is queued. Pure: time is passed in.

- Per-tenant token buckets, one for requests/s and one for tokens/s (prompt + max output), with a
  burst of ``burst_s`` seconds of rate (and at least one request); a tenant without limits is not
  limited. A request larger than its tenant's token burst is refused without a retry hint. A
  tenant's ``priority`` (its service class) is the least priority its requests are served at.
  A tenant's limit is the fleet's: a router that reads a share of the request topic's partitions
  (several routers in one group) fills its buckets at that share of the rate, with that share
  of the burst (at least one request), so that the routers together admit the tenant's rate
  (its requests, keyed by id, spread evenly over the partitions). A request within the
  tenant's token burst but above a router's share of it is admitted once that router's token
  bucket is full, which it leaves in debt.
- Load shedding: while the shedding controller has set a minimum value, a request worth less is
  served only by a worker predicted to give it its first token within a share of its budget
  that falls with its value under the level (``shed_share``; the placer's ``shed`` filter);
  where none is, it is rejected at once. A request's value weighs its priority, how far its
  task has progressed (step 4 of 5 is worth protecting) and whether it carries a deadline.
- Deadlines: a request whose deadline has passed, or that no worker is predicted to meet (the
  placer's deadline filter), is rejected at once instead of waiting in a queue.
Every denial names a machine-readable reason and, where it helps, when to retry.
"""

import math
from dataclasses import dataclass

from schemas.commands import TenantLimit
from schemas.limits import MAX_LATENCY_S
from schemas.events import RejectReason
from schemas.requests import InferenceRequest


@dataclass(frozen=True, slots=True)
class Denial:
    reason: RejectReason
    detail: str
    retry_after_s: float | None = None


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float, now_s: float = 0.0) -> None:
        self.rate = rate_per_s
        self.capacity = burst
        self.level = burst
        self.updated_s = now_s

    def _refill(self, now_s: float) -> None:
        if now_s > self.updated_s:
            self.level = min(self.capacity, self.level + (now_s - self.updated_s) * self.rate)
            self.updated_s = now_s

    def wait_s(self, amount: float, now_s: float) -> float:
        """Seconds until ``amount`` is available (0 when it is now); takes nothing."""
        self._refill(now_s)
        if amount > self.capacity:
            return float("inf")
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float) -> None:
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)

    def rescale(self, rate_per_s: float, burst: float, now_s: float) -> None:
        """A new rate and burst, the bucket as full (in proportion) as it was."""
        self._refill(now_s)
        fill = self.level / self.capacity if self.capacity > 0 else 1.0
        self.rate, self.capacity = rate_per_s, burst
        self.level = fill * burst


#: The share of its budget (time to its deadline, or its TTFT target) that a request just below
#: the shedding level may be predicted to need for its first token; it falls with the square
#: root of the request's value under the level. Under pressure, low-value work is served only
#: where it fits with time to spare, leaving the slack to the work worth more, instead of being
#: turned away wholesale. Chosen with `governor bench` at high load and the mixed-value burst
#: scenario (tests/e2e): a flat share (0.35, 0.5 or 0.7) let in enough low-value work to crowd
#: out high-value work in the burst; a share in proportion to the value gave the lowest-value
#: work (every request of the Azure trace) 0.07 of its budget, turning away requests that would
#: have met their SLO. The square root keeps the burst's high-value work within its SLO and
#: serves more of a workload whose requests are all worth the same
#: (benchmarks/results/ANALYSIS.md).
SHED_BUDGET_SHARE = 0.35


def value_of(priority: int, step: int, steps_total: int, has_deadline: bool) -> float:
    """What serving a request is worth relative to others, in [0, 1]: its priority, how far its
    task has come (the last step of five is worth protecting), and whether it has a deadline."""
    progress = (step - 1) / (steps_total - 1) if steps_total > 1 else 0.0
    return 0.5 * priority / 9 + 0.4 * progress + 0.1 * has_deadline


def request_value(request: InferenceRequest) -> float:
    return value_of(request.priority, request.step, request.steps_total,
                    request.deadline_ms is not None)


class Admission:
    def __init__(self, limits: dict[str, TenantLimit] | None = None) -> None:
        self.limits: dict[str, TenantLimit] = dict(limits or {})
        self.shed_below = 0.0  # every model's shedding level, but for those of shed_by_model
        self.shed_by_model: dict[str, float] = {}
        self._buckets: dict[str, tuple[TokenBucket, TokenBucket]] = {}
        #: The share of the tenants' requests this router reads (its share of the request
        #: topic's partitions): its buckets hold that share of each tenant's limit.
        self.share = 1.0

    def set_share(self, share: float, now_ms: int) -> None:
        """This router now reads ``share`` of the requests: each tenant's buckets are
        rescaled to that share of its limit, as full (in proportion) as they were."""
        if share == self.share:
            return
        self.share = share
        for tenant, (requests, tokens) in self._buckets.items():
            rates = self._bucket_sizes(self.limits[tenant])
            requests.rescale(*rates[0], now_ms / 1000)
            tokens.rescale(*rates[1], now_ms / 1000)

    def _bucket_sizes(self, limit: TenantLimit) -> tuple[tuple[float, float], tuple[float, float]]:
        """(rate, burst) of the requests and of the tokens bucket, at this router's share."""
        share = self.share
        return ((limit.requests_per_s * share,
                 max(1.0, limit.requests_per_s * limit.burst_s * share)),
                (limit.tokens_per_s * share, limit.tokens_per_s * limit.burst_s * share))

    def set_limits(self, limits: dict[str, TenantLimit]) -> None:
        """New limits; only the tenants whose limit changed start again with a full bucket."""
        for tenant in [t for t in self._buckets if limits.get(t) != self.limits.get(t)]:
            del self._buckets[tenant]
        self.limits = dict(limits)

    def with_tenant_priority(self, request: InferenceRequest) -> InferenceRequest:
        """``request`` at no less than its tenant's configured priority (its service class;
        a request may state a higher one)."""
        limit = self.limits.get(request.tenant)
        if limit is None or limit.priority <= request.priority:
            return request
        return request.model_copy(update={"priority": limit.priority})

    def admit(self, request: InferenceRequest, now_ms: int) -> Denial | None:
        """None when the request may be queued, else why not. Takes from the tenant's buckets."""
        if request.deadline_ms is not None and request.deadline_ms <= now_ms:
            late_s = (now_ms - request.deadline_ms) / 1000
            return Denial("deadline_unreachable", f"deadline passed {late_s:.3f}s before admission")
        return self._rate_limit(request, now_ms / 1000)

    def shed_share(self, request: InferenceRequest) -> float | None:
        """None when the request is worth at least the shedding level; else the share of its
        budget within which a worker must be predicted to give it its first token: the
        further below the level, the less (``SHED_BUDGET_SHARE``)."""
        value, level = request_value(request), self.shed_level(request.model)
        if value >= level:
            return None
        return SHED_BUDGET_SHARE * math.sqrt(value / level)

    def shed_level(self, model: str) -> float:
        """The shedding level of ``model``'s requests (its own, or every model's)."""
        return self.shed_by_model.get(model, self.shed_below)

    def shed_denial(self, request: InferenceRequest, predicted_ttft_s: float, share: float,
                    budget_s: float) -> Denial:
        level = self.shed_level(request.model)
        return Denial("load_shed", f"value {request_value(request):.3g} is below the shedding "
                                   f"level {level:.3g} of {request.model}, and its best predicted "
                                   f"TTFT {predicted_ttft_s:.3g}s exceeds {share * budget_s:.3g}s, "
                                   f"the {share:.2g} of its {budget_s:.3g}s budget a request so "
                                   "far below the level may take", retry_after_s=5.0)

    def _rate_limit(self, request: InferenceRequest, now_s: float) -> Denial | None:
        limit = self.limits.get(request.tenant)
        if limit is None:
            return None
        buckets = self._buckets.get(request.tenant)
        if buckets is None:
            (r_rate, r_burst), (t_rate, t_burst) = self._bucket_sizes(limit)
            buckets = self._buckets[request.tenant] = (
                TokenBucket(r_rate, r_burst, now_s), TokenBucket(t_rate, t_burst, now_s))
        requests, tokens = buckets
        cost = request.prompt_tokens + request.max_tokens
        burst = limit.tokens_per_s * limit.burst_s  # the tenant's, all routers together
        if cost > burst:
            return Denial("rate_limited", f"{cost} tokens (prompt + max_tokens) exceed tenant "
                                          f"{request.tenant}'s burst of {burst:.0f} "
                                          "(tokens_per_s x burst_s): it can never be admitted")
        # (above this router's share of the burst: once its bucket is full, leaving it in debt)
        need = min(cost, tokens.capacity)
        wait = max(requests.wait_s(1, now_s), tokens.wait_s(need, now_s))
        if wait > 0:
            what = "tokens" if tokens.wait_s(need, now_s) >= wait else "requests"
            # Rounded up, so that a retry at the hint finds what it needs; at most a day, the
            # most a ``Rejected`` carries (a tenant allowed less than one request a day).
            return Denial("rate_limited", f"tenant {request.tenant} is over its {what}/s limit",
                          retry_after_s=math.ceil(round(min(wait, MAX_LATENCY_S) * 1000, 3))
                          / 1000)
        requests.take(1)
        tokens.take(cost)
        return None

    def refund(self, request: InferenceRequest) -> None:
        """Give back what ``admit`` took for ``request``: it was not placed (no live worker) and
        will be admitted again when it is routed again."""
        buckets = self._buckets.get(request.tenant)
        if buckets is not None:
            requests, tokens = buckets
            requests.give_back(1)
            tokens.give_back(request.prompt_tokens + request.max_tokens)
