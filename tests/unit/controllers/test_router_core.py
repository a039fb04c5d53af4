"""Tests of controllers.router.core.RouterCore: admission, placement and resumption as one object.

The fleet is built from WorkerStatus heartbeats through ``observe``; every time is passed in.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from controllers.router.candidates import TYPICAL_CONTEXT_TOKENS, perf_model
from controllers.router.admission import Denial
from controllers.router import core as core_module
from controllers.router.core import NO_WORKER_GIVE_UP_S, Emit, RouterCore
from router_factories import MODEL, T0, request_factory, status_factory
from schemas import commands
from schemas.limits import MAX_ATTEMPTS
from schemas.commands import TenantLimit
from schemas.config import ConfigSet, GovernorConfig
from schemas.events import (
    Cancelled, Completed, Failed, KvBlocksEvicted, KvBlocksStored, Rejected, Requeued, Started,
)
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk


def core_factory(workers: int = 2, *, at: int = T0, config: GovernorConfig | None = None,
                 **status_fields: Any) -> RouterCore:
    """A core that has heard one heartbeat at ``at`` from each of ``workers`` workers w0, w1, …
    (slot = index)."""
    core = RouterCore(config or GovernorConfig())
    for i in range(workers):
        core.observe(status_factory(f"w{i}", i, at=at, **status_fields), at)
    return core


def heartbeat(core: RouterCore, at: int, *workers: int, **fields: Any) -> None:
    for i in workers:
        core.observe(status_factory(f"w{i}", i, at=at, **fields), at)


def chunk(request_id: str, offset: int, count: int, *, worker: str = "w0",
          final: bool = False, attempt: int = 1) -> ResponseChunk:
    return ResponseChunk(event_time_ms=T0, request_id=request_id, worker_id=worker,
                         token_offset=offset, tokens=list(range(offset, offset + count)),
                         final=final, finish_reason="length" if final else None,
                         attempt=attempt)


def cmd(kind: type, **fields: Any) -> Any:
    return kind(event_time_ms=T0, command_id="c1", **fields)


def worker_of(decision) -> str:
    assert decision.dispatch is not None, decision
    return decision.dispatch.worker_id


# --- placement through the core ------------------------------------------------------------------

def test_route_dispatches_to_a_live_warm_worker() -> None:
    core = RouterCore(GovernorConfig(), router_id="router-9")
    core.observe(status_factory("w3", 3), T0)
    req = request_factory("r1")
    decision = core.route(req, T0 + 10)
    d = decision.dispatch
    assert d is not None and not decision.waits and decision.denial is None
    assert (d.worker_id, d.slot, d.attempt, d.resume_from_token, d.router_id) == (
        "w3", 3, 1, 0, "router-9")
    assert (d.request, d.event_time_ms) == (req, T0 + 10)
    assert set(decision.scores) == set(core.policy.__self__.weights)
    assert "r1" in core.in_flight
    assert core.ledger.requests("w3") == 1


@pytest.mark.parametrize(
    ("statuses", "now_ms", "model"),
    [
        ([], T0, MODEL),  # no worker at all
        ([dict()], T0 + 3_001, MODEL),  # heard from too long ago
        ([dict(models_loaded=["llama-2-7b"])], T0, MODEL),  # not serving the model
        ([dict(state="loading")], T0, MODEL),
        ([dict(state="draining")], T0, MODEL),
        ([dict(state="stopped")], T0, MODEL),
        ([dict(state="sleeping")], T0, MODEL),
        ([dict(state="starting")], T0, MODEL),
    ],
)
def test_route_waits_without_a_live_warm_worker(statuses: list[dict], now_ms: int,
                                                model: str) -> None:
    core = RouterCore()
    for i, fields in enumerate(statuses):
        core.observe(status_factory(f"w{i}", i, **fields), T0)
    decision = core.route(request_factory(model=model), now_ms)
    assert decision.waits
    assert decision.dispatch is None and decision.denial is None
    assert core.in_flight == {}


@pytest.mark.parametrize("state", ["loading", "draining", "stopped", "sleeping"])
def test_route_skips_workers_that_take_no_work(state: str) -> None:
    core = RouterCore()
    core.observe(status_factory("busy-but-warm", 5, running=30, waiting=10), T0)
    core.observe(status_factory("idle", 0, state=state), T0)
    assert all(worker_of(core.route(request_factory(f"r{n}"), T0)) == "busy-but-warm"
               for n in range(3))


def test_open_breaker_excludes_a_worker_until_closed() -> None:
    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0)
    assert [worker_of(core.route(request_factory(f"r{n}"), T0)) for n in range(3)] == ["w1"] * 3
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="closed"), T0)
    assert worker_of(core.route(request_factory("r3"), T0)) == "w0"  # idle again, lower slot


def test_open_breaker_on_the_only_worker_makes_requests_wait() -> None:
    core = core_factory(1)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0)
    decision = core.route(request_factory(), T0)
    assert decision.waits


def test_half_open_breaker_takes_one_probe_at_a_time() -> None:
    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="half_open"), T0)
    assert worker_of(core.route(request_factory("probe"), T0)) == "w0"
    assert worker_of(core.route(request_factory("r2"), T0)) == "w1"  # the probe is pending
    core.observe(Started(event_time_ms=T0, request_id="probe", worker_id="w0"), T0)
    assert worker_of(core.route(request_factory("r3"), T0)) == "w1"  # not in a heartbeat yet
    core.observe(status_factory("w0", 0, at=T0 + 1, running=1), T0 + 1)  # it counts the probe
    assert worker_of(core.route(request_factory("r4"), T0 + 1)) == "w1"  # (w0 before 7 Dec)
    core.observe(status_factory("w0", 0, at=T0 + 2), T0 + 2)  # the probe ended
    assert worker_of(core.route(request_factory("r5"), T0 + 2)) == "w0"


# --- admission through the core ------------------------------------------------------------------

def _ttft(gpu: str, prompt_tokens: int) -> float:
    """The router's predicted TTFT on an idle worker: one prefill step of the whole prompt."""
    return perf_model(gpu, MODEL).step_s(prompt_tokens, 0, 0, TYPICAL_CONTEXT_TOKENS,
                                         prefill_seqs=1)


def test_a_deadline_no_worker_can_meet_is_rejected_early_without_a_retry_hint() -> None:
    core = core_factory(2, gpu_type="a100")
    best = _ttft("a100", 8_000)
    assert best > 0.1  # the deadline below is out of reach
    req = request_factory(prompt_tokens=8_000, deadline_ms=T0 + 100)
    decision = core.route(req, T0)
    assert decision.denial is not None and decision.dispatch is None
    assert decision.denial.reason == "deadline_unreachable"
    assert f"predicted TTFT {best:.3g}s" in decision.denial.detail
    assert "exceeds 0.085s, 85% of the time left before its deadline (0.1s;" in \
        decision.denial.detail
    assert decision.denial.retry_after_s is None  # the deadline does not move: no retry helps
    assert core.in_flight == {}
    # the same prompt with time enough is placed
    ok = request_factory("r2", prompt_tokens=8_000, deadline_ms=T0 + int(best * 1000) + 500)
    assert core.route(ok, T0).dispatch is not None


def test_a_ttft_target_tighter_than_the_deadline_bounds_the_budget() -> None:
    core = core_factory(1)
    req = request_factory(prompt_tokens=8_000, deadline_ms=T0 + 60_000, ttft_slo_s=0.01)
    assert _ttft("h100", 8_000) > 0.01
    denial = core.route(req, T0).denial
    assert denial.reason == "deadline_unreachable" and "its TTFT target (0.01s;" in denial.detail


@pytest.mark.parametrize(("by_target", "bound"), [
    (False, "exceeds {:.3g}s, 85% of the time left before its deadline ({:.3g}s;"),
    (True, "exceeds {:.3g}s, 85% of its TTFT target ({:.3g}s;"),
])
def test_an_early_rejection_names_the_bound_the_prediction_exceeds(
        by_target: bool, bound: str) -> None:
    """A prediction under the budget but over the share of it the router allows (its deadline
    filter's headroom): the client is told the bound it missed (before 6 Dec, "predicted TTFT
    1.85s on the best worker exceeds its TTFT target, 2.00s", seen against governor up)."""
    best = _ttft("h100", 8_000)
    budget_ms = int(best / 0.9 * 1000)  # best < budget < best / 0.85
    budget = budget_ms / 1000
    req = (request_factory(prompt_tokens=8_000, deadline_ms=T0 + 60_000, ttft_slo_s=budget)
           if by_target else request_factory(prompt_tokens=8_000, deadline_ms=T0 + budget_ms))
    denial = core_factory(1).route(req, T0).denial
    assert best < budget and denial is not None and denial.reason == "deadline_unreachable"
    assert bound.format(0.85 * budget, budget) in denial.detail, denial.detail


def test_no_deadline_means_no_early_rejection() -> None:
    core = core_factory(1, gpu_type="a100")
    req = request_factory(prompt_tokens=8_000, ttft_slo_s=0.01)  # a target, not a deadline
    assert core.route(req, T0).dispatch is not None


def test_an_expired_deadline_is_rejected_by_admission() -> None:
    core = core_factory(1)
    req = request_factory(deadline_ms=T0 + 5)
    denial = core.route(req, T0 + 5).denial
    assert denial is not None and denial.reason == "deadline_unreachable"


def test_a_request_whose_deadline_passed_waiting_for_a_worker_is_no_capacity() -> None:
    """Held for want of a worker (a pool scaled to zero) until its deadline passed: the
    autoscaler wakes a pool on ``no_capacity``, so that is what it is told."""
    core = RouterCore(GovernorConfig())
    req = request_factory(deadline_ms=T0 + 3_000, task_id="t1", steps_total=2)
    assert core.route(req, T0).waits
    denial = core.route(req, T0 + 3_000).denial
    assert denial is not None and denial.reason == "no_capacity"
    assert denial.retry_after_s is None and "no live worker serves" in denial.detail
    # its deadline has passed: the task fails with it
    later = core.route(request_factory("r2", task_id="t1", step=2, steps_total=2), T0 + 3_001)
    assert later.denial is not None and later.denial.reason == "task_failed"


def test_tenant_limits_from_config_rate_limit_through_the_core() -> None:
    limit = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    core = core_factory(2, config=GovernorConfig(tenants={"a": limit}))
    assert core.route(request_factory("r1", tenant="a"), T0).dispatch is not None
    denial = core.route(request_factory("r2", tenant="a"), T0).denial
    assert denial is not None and denial.reason == "rate_limited"
    assert denial.retry_after_s == 1.0
    assert core.route(request_factory("r3", tenant="b"), T0).dispatch is not None


def test_a_tenants_priority_is_the_least_its_requests_are_served_at() -> None:
    gold = TenantLimit(requests_per_s=100, tokens_per_s=1e9, priority=9)
    core = core_factory(2, config=GovernorConfig(tenants={"gold": gold}))
    core.observe(cmd(commands.SetLoadShedLevel, min_value=0.5), T0)
    # shedding everything worth under 0.5 that no worker serves at once: a priority-9 request
    # is worth 0.5, the same request of a tenant with no class 0
    busy = {"waiting": 200, "running": 256, "kv_blocks_used": 9_000, "kv_blocks_free": 0}
    heartbeat(core, T0, 0, 1, **busy)
    served = core.route(request_factory("r1", tenant="gold", priority=2), T0)
    assert served.dispatch is not None and served.dispatch.request.priority == 9
    shed = core.route(request_factory("r2", tenant="other", priority=2), T0).denial
    assert shed is not None and shed.reason == "load_shed"
    higher = core.route(request_factory("r3", tenant="gold", priority=9), T0)
    assert higher.dispatch is not None


def test_a_waiting_request_is_charged_to_its_tenant_once() -> None:
    """A request that waits for a worker is routed again and again; only its placement takes
    from the tenant's bucket, so a tenant's only request is not rate-limited by itself."""
    limit = TenantLimit(requests_per_s=0.5, tokens_per_s=1e6, burst_s=2)  # one request of burst
    core = RouterCore(GovernorConfig(tenants={"a": limit}))
    req = request_factory("r1", tenant="a")
    assert core.route(req, T0).waits
    assert core.route(req, T0 + 1_000).waits
    heartbeat(core, T0 + 1_500, 0)
    assert core.route(req, T0 + 1_500).dispatch is not None
    later = core.route(request_factory("r2", tenant="a"), T0 + 1_500).denial
    assert later is not None and later.reason == "rate_limited"


def test_a_waiting_request_counts_once_towards_the_retry_budget() -> None:
    core = RouterCore(GovernorConfig(retry_budget_ratio=1.0, retry_budget_min_per_s=0.0))
    req = request_factory("r1")
    for t in range(5):
        assert core.route(req, T0 + t).waits
    heartbeat(core, T0 + 5, 0)
    assert core.route(req, T0 + 5).dispatch is not None
    assert core.retry_budget.allowance((T0 + 5) / 1000) == pytest.approx(1.0)


def test_round_robin_applies_no_admission() -> None:
    limit = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    core = core_factory(2, gpu_type="a100", config=GovernorConfig(
        routing_policy="round_robin", tenants={"a": limit}))
    core.observe(cmd(commands.SetLoadShedLevel, min_value=0.9), T0)
    reqs = [request_factory(f"r{n}", tenant="a") for n in range(3)]  # over the limit, low value
    reqs.append(request_factory("late", prompt_tokens=8_000, deadline_ms=T0 + 1))  # unreachable
    assert [worker_of(core.route(r, T0)) for r in reqs] == ["w0", "w1", "w0", "w1"]


# --- optimistic accounting -----------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["governor", "least_loaded"])
def test_a_burst_between_heartbeats_spreads_over_the_fleet(policy: str) -> None:
    core = core_factory(4, config=GovernorConfig(routing_policy=policy))
    placed = Counter(worker_of(core.route(request_factory(f"r{n}"), T0 + n)) for n in range(12))
    assert placed == {"w0": 3, "w1": 3, "w2": 3, "w3": 3}
    assert [core.ledger.requests(f"w{i}") for i in range(4)] == [3, 3, 3, 3]


def test_reports_take_dispatches_off_the_ledger() -> None:
    core = core_factory(1)
    for n in range(3):
        core.route(request_factory(f"r{n}", prompt_tokens=100), T0)
    core.observe(Started(event_time_ms=T0, request_id="r0", worker_id="w0"), T0)
    core.observe(Requeued(event_time_ms=T0, request_id="r1", worker_id="w0", tokens_done=0), T0)
    # Started alone leaves r0 pending until a heartbeat stamped after it counts it.
    assert (core.ledger.requests("w0"), core.ledger.prompt_tokens("w0")) == (2, 200)
    core.observe(status_factory("w0", 0, at=T0 + 1), T0 + 1)
    assert (core.ledger.requests("w0"), core.ledger.prompt_tokens("w0")) == (1, 100)


def test_a_continuation_is_pending_with_the_tokens_it_resumes_after() -> None:
    """A continuation's prompt holds the tokens generated before it: its worker prefills them
    (and its heartbeats count them in its backlog once it takes it). Before, the ledger counted
    its prompt alone, and requests placed meanwhile were predicted to start sooner there."""
    core = core_factory(2)
    req = request_factory("x", prompt_tokens=1_000, max_tokens=8_000)
    core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, attempt=2,
                          resume_from_token=3_000, router_id="router-1"), T0)
    assert core.ledger.prompt_tokens("w0") == 4_000
    core.observe(Requeued(event_time_ms=T0, request_id="x", worker_id="w0", attempt=2,
                          tokens_done=3_500), T0)
    assert (core.ledger.requests("w0"), core.ledger.prompt_tokens("w0")) == (0, 0)


def test_another_routers_dispatch_is_accounted_for() -> None:
    core = core_factory(2)
    other = Dispatch(event_time_ms=T0, request=request_factory("x"), worker_id="w0", slot=0,
                     router_id="router-1")
    core.observe(other, T0)
    assert core.ledger.requests("w0") == 1 and "x" in core.in_flight
    assert worker_of(core.route(request_factory("r1"), T0)) == "w1"


def test_another_routers_dispatch_read_after_the_requests_end_is_not_taken_in_flight() -> None:
    """Its Started and Completed (telemetry topic) read before the Dispatch (dispatch topic):
    the request stays ended, and w0 is not charged with it for good."""
    core = core_factory(2)
    other = Dispatch(event_time_ms=T0, request=request_factory("x"), worker_id="w0", slot=0,
                     router_id="router-1")
    core.observe(Started(event_time_ms=T0, request_id="x", worker_id="w0"), T0)
    core.observe(Completed(event_time_ms=T0 + 5, request_id="x", worker_id="w0",
                           prompt_tokens=256, output_tokens=32, e2e_s=0.1), T0 + 5)
    core.observe(other, T0 + 6)
    assert "x" not in core.in_flight and core.ledger.requests("w0") == 0


def test_another_routers_continuation_read_after_the_old_attempts_late_failure_is_tracked(
) -> None:
    """The replaced attempt's Failed (no attempt on it) read before router-1's continuation:
    the continuation is newer than what ended, and is taken in flight."""
    core = core_factory(2)
    req = request_factory("x")
    core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, attempt=1,
                          router_id="router-1"), T0)
    core.observe(Failed(event_time_ms=T0 + 5, request_id="x", worker_id="w0",
                        reason="engine_error", detail="lost"), T0 + 5)
    core.observe(Dispatch(event_time_ms=T0 + 6, request=req, worker_id="w1", slot=1, attempt=2,
                          router_id="router-1"), T0 + 6)
    assert core.in_flight["x"].dispatch.attempt == 2 and core.ledger.requests("w1") == 1


@pytest.mark.parametrize("end", ["completed", "cancelled"])
def test_a_continuation_read_after_its_own_end_is_not_taken_in_flight(end: str) -> None:
    """Attempt 2's end (telemetry topic) read before its Dispatch (dispatch topic): the end of
    attempt 2, or an end that names no attempt, ends it too (not only the attempt this router
    had seen), else it would be tracked, and one day recalled and served again."""
    core = core_factory(2)
    req = request_factory("x")
    if end == "completed":
        core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0,
                              attempt=1, router_id="router-1"), T0)
        core.observe(Completed(event_time_ms=T0 + 5, request_id="x", worker_id="w1",
                               attempt=2, prompt_tokens=256, output_tokens=32, e2e_s=0.1), T0 + 5)
    else:  # nothing seen of it before its end
        core.observe(Cancelled(event_time_ms=T0 + 5, request_id="x", reason="client"), T0 + 5)
    core.observe(Dispatch(event_time_ms=T0 + 6, request=req, worker_id="w1", slot=1, attempt=2,
                          router_id="router-1"), T0 + 6)
    assert "x" not in core.in_flight and core.ledger.requests("w1") == 0


def test_a_late_older_attempt_does_not_replace_the_newer_one() -> None:
    core = core_factory(2)
    req = request_factory("r1")
    newer = Dispatch(event_time_ms=T0, request=req, worker_id="w1", slot=1, attempt=2)
    older = Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, attempt=1)
    core.observe(newer, T0)
    core.observe(older, T0)
    assert core.in_flight["r1"].dispatch == newer
    assert (core.ledger.requests("w0"), core.ledger.requests("w1")) == (0, 1)


# --- prefix affinity -----------------------------------------------------------------------------

def test_requests_go_where_kv_events_say_their_prefix_is() -> None:
    core = core_factory(3)
    hashes = list(range(100, 108))
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w2", block_size=16,
                                block_hashes=hashes), T0)
    shared = [request_factory(f"s{n}", prompt_tokens=128, prefix_hashes=hashes) for n in range(3)]
    assert [worker_of(core.route(r, T0)) for r in shared] == ["w2"] * 3
    other = request_factory("o", prompt_tokens=128, prefix_hashes=list(range(200, 208)))
    assert worker_of(core.route(other, T0)) == "w0"
    core.observe(KvBlocksEvicted(event_time_ms=T0, worker_id="w2", block_hashes=hashes), T0)
    again = request_factory("s9", prompt_tokens=128, prefix_hashes=hashes)
    assert worker_of(core.route(again, T0)) == "w1"  # no cache anywhere: the idlest



def test_kv_events_of_a_worker_never_heard_of_are_not_kept() -> None:
    """A worker is placed nothing before its first heartbeat: KV events under any other id
    (made up, or of no worker of this fleet) were kept for ever, 8,192 blocks a record (300
    such records took a live router from 67 MB to 964 MB)."""
    core = core_factory(1)
    for n in range(50):
        phantom = f"phantom-{n}"
        core.observe(KvBlocksStored(event_time_ms=T0, worker_id=phantom, block_size=16,
                                    block_hashes=list(range(n * 8_192, (n + 1) * 8_192))), T0)
        core.observe(KvBlocksEvicted(event_time_ms=T0, worker_id=f"{phantom}-e",
                                     block_hashes=[1]), T0)
    assert core.prefix.deepest_holders([0]) == set() and len(core.prefix._holders) == 0
    assert not any(core.prefix.is_exact(f"phantom-{n}{e}") for n in range(50) for e in ("", "-e"))
    hashes = list(range(100, 108))  # the fleet's own worker is taken as before
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w0", block_size=16,
                                block_hashes=hashes), T0)
    assert core.prefix.overlap("w0", hashes) == 8


def test_kv_said_directly_is_taken_as_the_kv_events() -> None:
    """``kv_stored`` and ``kv_evicted`` (the offline simulator's way) take what the messages
    would: nothing of a worker never heard of, nor blocks stored before its start."""
    core = core_factory(2)
    core.kv_stored("phantom", [1, 2], T0)
    core.kv_evicted("phantom", [1])
    assert not core.prefix.is_exact("phantom") and core.prefix.deepest_holders([1]) == set()
    core.kv_stored("w0", [1, 2, 3], T0)
    core.kv_evicted("w0", [3])
    assert core.prefix.overlap("w0", [1, 2, 3]) == 2
    heartbeat(core, T0 + 1_000, 1, started_ms=T0 + 900)  # w1 started again at T0 + 900
    core.kv_stored("w1", [1, 2], T0 + 500)
    core.kv_stored("w1", [7, 8], T0 + 950)
    assert core.prefix.overlap("w1", [1, 2]) == 0 and core.prefix.overlap("w1", [7, 8]) == 2


def _short_beside_a_long_prefix(short_deadline_ms: int | None) -> tuple[RouterCore, list[int]]:
    """w0 holds 2,000 of a 60,000-token prompt's 3,750 blocks; a short request ``s`` (32 tokens
    to generate) is placed on w0 first."""
    core = core_factory(2)
    hashes = list(range(1_000, 1_000 + 3_750))
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w0", block_size=16,
                                block_hashes=hashes[:2_000]), T0)
    short = request_factory("s", prompt_tokens=256, max_tokens=32, deadline_ms=(
        None if short_deadline_ms is None else T0 + short_deadline_ms))
    assert worker_of(core.route(short, T0)) == "w0"
    return core, hashes


def _long(hashes: list[int]) -> InferenceRequest:
    return request_factory("l", prompt_tokens=60_000, max_tokens=32, prefix_hashes=hashes,
                           deadline_ms=T0 + 30_000)


@pytest.mark.parametrize(("short_deadline_ms", "long_goes_to"), [
    (1_500, "w1"),  # the long prefill (about 1.5 s) on w0 would make the short answer late
    (10_000, "w0"),  # time to spare: the long prompt goes where its prefix is
    (None, "w0"),  # no deadline to protect
    (200, "w0"),  # bound to miss anyway (32 tokens of decode take longer): nothing to save
])
def test_a_long_prefill_goes_where_it_makes_no_decoding_request_late(
        short_deadline_ms: int | None, long_goes_to: str) -> None:
    core, hashes = _short_beside_a_long_prefix(short_deadline_ms)
    assert worker_of(core.route(_long(hashes), T0)) == long_goes_to


@pytest.mark.parametrize(("answers_read", "long_goes_to"), [
    (True, "w1"),  # its tenant's answers run 32 tokens: the long prefill would make it late
    (False, "w0"),  # none read yet: 256 expected, bound to miss anyway, nothing to save
])
def test_a_decoding_request_is_weighed_by_how_long_its_tenants_answers_run_not_its_cap(
        answers_read: bool, long_goes_to: str) -> None:
    """A client's max_tokens is a cap: taken for the answer, 4,000 tokens left would make the
    short request look bound to miss its deadline whatever went beside it."""
    core = core_factory(2)
    for i in range(64 if answers_read else 0):  # answers of 32 tokens of the same 4,000 cap
        placed = core.route(request_factory(f"done{i}", max_tokens=4_000), T0).dispatch
        core.observe(Completed(event_time_ms=T0, request_id=f"done{i}", tenant="default",
                               model=MODEL, worker_id=placed.worker_id, prompt_tokens=256,
                               output_tokens=32, finish_reason="stop", e2e_s=0.5), T0)
    hashes = list(range(1_000, 1_000 + 3_750))
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w0", block_size=16,
                                block_hashes=hashes[:2_000]), T0)
    short = request_factory("s", prompt_tokens=256, max_tokens=4_000, deadline_ms=T0 + 1_500)
    assert worker_of(core.route(short, T0)) == "w0"
    assert worker_of(core.route(_long(hashes), T0)) == long_goes_to


@pytest.mark.parametrize("how", ["streamed whole", "ended before its cap", "handed back",
                                 "cancelled"])
def test_a_request_no_longer_decoding_on_a_worker_is_not_protected_there(how: str) -> None:
    core, hashes = _short_beside_a_long_prefix(1_500)
    if how == "streamed whole":  # (its Completed not read yet)
        core.observe(chunk("s", 0, 32, final=True), T0)
    elif how == "ended before its cap":  # 10 of at most 32 tokens, then its end of sequence
        core.observe(chunk("s", 0, 10, final=True).model_copy(update={"finish_reason": "stop"}),
                     T0)
    elif how == "handed back":
        core.observe(Requeued(event_time_ms=T0, request_id="s", worker_id="w0", tokens_done=0),
                     T0)
    else:
        core.cancel(CancelRequest(event_time_ms=T0, request_id="s", reason="client"), T0)
    assert worker_of(core.route(_long(hashes), T0)) == "w0"


def test_a_continuations_prefill_counts_the_tokens_it_resumes_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 6,000-token prompt resumed after 4,000 tokens prefills 10,000: more than one step, so
    the requests decoding beside it are weighed; resumed after 1,000, it fits one step."""
    core, _ = _short_beside_a_long_prefix(1_000)
    weighed = []
    original = core_module.mark_deadlines_at_risk
    monkeypatch.setattr(core_module, "mark_deadlines_at_risk", lambda req, cands, by, now, resumed:
                        weighed.append(resumed) or original(req, cands, by, now, resumed))
    request = request_factory("c", prompt_tokens=6_000, max_tokens=8_000, deadline_ms=T0 + 60_000)
    for resume_from in (4_000, 1_000):
        assert core._place(request, T0, attempt=2, resume_from=resume_from,
                           exclude=None).dispatch is not None
    assert weighed == [4_000]


@pytest.mark.parametrize("how", ["restarted", "stopped", "crashed"])
def test_a_worker_that_restarts_or_stops_holds_no_prefix_any_more(how: str) -> None:
    """Its blocks went with its engine: a restart under the same id (a new ``started_ms``), a
    stop or a crash forgets them, heartbeats of the same incarnation (and late older ones) do
    not; a stopped worker's blocks are not kept for good either."""
    core = core_factory(2)
    hashes = list(range(100, 108))
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w1", block_size=16,
                                block_hashes=hashes), T0)
    heartbeat(core, T0 + 500, 0, 1)
    assert core.prefix.overlap("w1", hashes) == 8
    change = {"restarted": dict(started_ms=T0 + 900)}.get(how, dict(state=how))
    heartbeat(core, T0 + 1_000, 1, **change)
    heartbeat(core, T0 + 800, 1)  # an older one, read late
    assert core.prefix.overlap("w1", hashes) == 0
    assert not core.prefix.is_exact("w1") and core.prefix.deepest_holders(hashes) == set()


def test_kv_events_stamped_before_a_workers_start_are_not_taken() -> None:
    """Read back after a restart (the telemetry topic before the KV topic), or read late: a
    dead incarnation's stored blocks are not the new one's."""
    core = core_factory(2)
    heartbeat(core, T0 + 1_000, 1, started_ms=T0 + 900)  # w1 started again at T0 + 900
    for at, hashes in ((T0 + 500, [1, 2]), (T0 + 950, [7, 8])):
        core.observe(KvBlocksStored(event_time_ms=at, worker_id="w1", block_size=16,
                                    block_hashes=hashes), T0 + 1_000)
    assert core.prefix.overlap("w1", [1, 2]) == 0 and core.prefix.overlap("w1", [7, 8]) == 2


def test_a_worker_silent_for_a_minute_holds_no_prefix_any_more() -> None:
    """Killed and its slot not taken again: it says nothing more, and its blocks would keep it
    among a prefix's deepest holders for good."""
    from controllers.router.core import GONE_AFTER_S

    core = core_factory(2)
    hashes = list(range(100, 108))
    core.observe(KvBlocksStored(event_time_ms=T0, worker_id="w1", block_size=16,
                                block_hashes=hashes), T0)
    gone = T0 + int(GONE_AFTER_S * 1000)
    heartbeat(core, gone, 0)
    core.resume(gone)
    assert core.prefix.overlap("w1", hashes) == 8  # silent, not yet gone
    heartbeat(core, gone + 1, 0)
    core.resume(gone + 1)
    assert core.prefix.deepest_holders(hashes) == set()
    core.observe(KvBlocksStored(event_time_ms=T0 + 100, worker_id="w1", block_size=16,
                                block_hashes=hashes), gone + 2)  # sent before, read late
    assert core.prefix.deepest_holders(hashes) == set()
    heartbeat(core, gone + 3, 1)  # it was only cut off: heard again, its KV events count
    core.observe(KvBlocksStored(event_time_ms=gone + 4, worker_id="w1", block_size=16,
                                block_hashes=hashes), gone + 4)
    assert core.prefix.deepest_holders(hashes) == {"w1"}


def test_without_kv_events_routing_history_estimates_the_cache() -> None:
    core = core_factory(3)
    hashes = list(range(100, 108))
    first = core.route(request_factory("s0", prompt_tokens=128, prefix_hashes=hashes), T0)
    assert worker_of(first) == "w0"
    second = core.route(request_factory("s1", prompt_tokens=128, prefix_hashes=hashes), T0)
    assert worker_of(second) == "w0"
    assert second.scores["prefix"] == 1.0


# --- resumption ----------------------------------------------------------------------------------

def _in_flight_on_w0(core: RouterCore, request_id: str = "r1", **fields: Any) -> Dispatch:
    decision = core.route(request_factory(request_id, **fields), T0)
    assert worker_of(decision) == "w0"
    return decision.dispatch


def _stream_ended(emits: list, finish_reason: str, request_id: str = "r1",
                  token_offset: int | None = None) -> list:
    """The emits after the first, which must end ``request_id``'s response stream: a final
    chunk with no tokens, to the request's reply topic (``stream_end``)."""
    first, *rest = emits
    end = first.message
    assert isinstance(end, ResponseChunk) and first.slot is None
    assert (end.request_id, end.tokens, end.final, end.finish_reason) == (
        request_id, [], True, finish_reason)
    assert token_offset is None or end.token_offset == token_offset
    return rest


def _lifecycle(emits: list) -> list:
    """The emits that are not the end of a response stream."""
    return [e for e in emits if not isinstance(e.message, ResponseChunk)]


def _superseded(emits: list, why: str, request_id: str = "r1", attempt: int = 1) -> list:
    """The emits after the first, which must tell w0's slot (0) that ``attempt`` is superseded:
    a worker that takes that slot over later must not serve it again."""
    first, *rest = emits
    cancel = first.message
    assert isinstance(cancel, CancelRequest) and first.slot == 0
    assert (cancel.request_id, cancel.attempt, cancel.reason) == (
        request_id, attempt, f"superseded: {why}")
    return rest


def test_a_late_hand_back_of_an_older_attempt_does_not_move_the_continuation() -> None:
    core = core_factory(2)
    req = request_factory("r1")
    core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w1", slot=1, attempt=2,
                          router_id=core.router_id), T0)
    core.observe(Requeued(event_time_ms=T0, request_id="r1", worker_id="w0", attempt=1,
                          tokens_done=5), T0)
    assert not core.in_flight["r1"].handed_back
    assert core.resume(T0 + 1) == []  # attempt 2 runs on a live worker: nothing to resume
    core.observe(Requeued(event_time_ms=T0, request_id="r1", worker_id="w1", attempt=2,
                          tokens_done=7), T0)
    assert core.in_flight["r1"].handed_back and core.in_flight["r1"].tokens_done == 7


def _back_from_silence(core: RouterCore, loaded: dict[str, Any]) -> tuple[str, str]:
    """r1 on w0; w0 goes silent and r1 continues (attempt 2) on w1 or w2, which hands it back;
    w0 is heard again, and the third worker with ``loaded``. Returns (attempt 2's worker, the
    third)."""
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 5), T0 + 100)
    heartbeat(core, T0 + 3_500, 1, 2)
    [cont] = _superseded(core.resume(T0 + 3_500), "its worker went silent")
    second = cont.message.worker_id
    third = "w2" if second == "w1" else "w1"
    core.observe(Requeued(event_time_ms=T0 + 3_600, request_id="r1", worker_id=second,
                          attempt=2, tokens_done=7), T0 + 3_600)
    heartbeat(core, T0 + 3_700, 0)
    core.observe(status_factory(third, int(third[1]), at=T0 + 3_700, **loaded), T0 + 3_700)
    return second, third


def _third_attempt(core: RouterCore) -> Dispatch:
    supersede, cont = core.resume(T0 + 3_700)
    assert (supersede.message.attempt, supersede.message.reason) == (2, "superseded: handed back")
    assert isinstance(cont.message, Dispatch) and cont.message.attempt == 3
    return cont.message


def test_a_continuation_avoids_a_worker_whose_replaced_attempt_may_still_end() -> None:
    """w0, silent, was replaced without handing r1 back: it may still report attempt 1's end.
    A ``Failed`` from a worker older than its ``attempt`` names none, so attempt 3 placed on w0
    would be ended by attempt 1's late failure (the router failing the request, and its task,
    while attempt 3 runs on to complete it: two ends). Before, attempt 3 went to w0, the idlest."""
    core = core_factory(3)
    second, third = _back_from_silence(core, dict(running=40, waiting=30))
    third_attempt = _third_attempt(core)
    assert third_attempt.worker_id == third
    core.observe(Failed(event_time_ms=T0 + 3_800, request_id="r1", worker_id="w0",
                        reason="engine_error", detail="late"), T0 + 3_800)
    assert core.in_flight["r1"].dispatch == third_attempt  # attempt 3 goes on
    assert core.in_flight["r1"].unended == frozenset()  # attempt 1's end is read


def test_a_worker_whose_replaced_attempt_ended_takes_a_continuation_again() -> None:
    """w0 handed attempt 1 back (it read the supersede), or no other worker can take the
    request: attempt 3 may go to w0."""
    core = core_factory(3)
    _back_from_silence(core, dict(running=40, waiting=30))
    core.observe(Requeued(event_time_ms=T0 + 3_650, request_id="r1", worker_id="w0",
                          attempt=1, tokens_done=5), T0 + 3_650)
    assert _third_attempt(core).worker_id == "w0"
    alone = core_factory(3)
    _back_from_silence(alone, dict(state="draining"))
    assert _third_attempt(alone).worker_id == "w0"


@pytest.mark.parametrize("kind", [Failed, Cancelled])
def test_a_late_end_of_a_replaced_attempt_on_the_continuations_worker_is_told_by_attempt(
        kind: type) -> None:
    """w0, silent, was replaced without handing r1 back, and is the only worker that can take
    attempt 3: attempt 1's late end, naming its attempt, does not end attempt 3 there (before
    7 Dec a ``Failed`` or ``Cancelled`` named no attempt, and w0's was taken for attempt 3's,
    failing the request while attempt 3 ran on); attempt 3's own end does."""
    fields = dict(reason="engine_error") if kind is Failed else dict(reason="gone")
    core = core_factory(3)
    _back_from_silence(core, dict(state="draining"))
    third_attempt = _third_attempt(core)
    assert third_attempt.worker_id == "w0"
    core.observe(kind(event_time_ms=T0 + 3_800, request_id="r1", worker_id="w0", attempt=1,
                      **fields), T0 + 3_800)
    assert core.in_flight["r1"].dispatch == third_attempt  # attempt 3 goes on
    assert core.resume(T0 + 3_900) == []
    core.observe(kind(event_time_ms=T0 + 4_000, request_id="r1", worker_id="w0", attempt=3,
                      **fields), T0 + 4_000)
    assert "r1" not in core.in_flight


def test_an_end_that_names_no_attempt_is_told_by_its_worker_as_before() -> None:
    """From a worker older than the field: attempt 1's late failure on attempt 3's worker ends
    attempt 3 (why continuations avoid such a worker where they can); on another, nothing."""
    core = core_factory(3)
    second, _ = _back_from_silence(core, dict(state="draining"))
    _third_attempt(core)
    core.observe(Failed(event_time_ms=T0 + 3_800, request_id="r1", worker_id=second,
                        reason="engine_error"), T0 + 3_800)
    assert "r1" in core.in_flight
    core.observe(Failed(event_time_ms=T0 + 3_800, request_id="r1", worker_id="w0",
                        reason="engine_error"), T0 + 3_800)
    assert "r1" not in core.in_flight


def test_a_continuation_past_its_deadline_is_still_placed() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64, deadline_ms=T0 + 10_000)
    core.observe(Requeued(event_time_ms=T0 + 20_000, request_id="r1", worker_id="w0",
                          tokens_done=30), T0 + 20_000)
    heartbeat(core, T0 + 20_000, 0, 1)
    (cont,) = _superseded(core.resume(T0 + 20_000), "handed back")  # late rather than never
    assert isinstance(cont.message, Dispatch) and cont.message.resume_from_token == 30


def test_streamed_counts_tokens_as_the_chunk_that_carries_them() -> None:
    runs = [(0, 5), (5, 4), (3, 4), (20, 3), (9, 1)]  # in order, a duplicate, a gap, in order
    by_chunk, by_count = core_factory(2), core_factory(2)
    _in_flight_on_w0(by_chunk, max_tokens=64)
    _in_flight_on_w0(by_count, max_tokens=64)
    for offset, count in runs:
        by_chunk.observe(chunk("r1", offset, count), T0 + 100)
        by_count.streamed("r1", offset, count)
        assert by_count.in_flight["r1"].tokens_done == by_chunk.in_flight["r1"].tokens_done
    assert by_count.in_flight["r1"].tokens_done == 10
    by_count.streamed("r9", 0, 5)  # not in flight: ignored
    assert "r9" not in by_count.in_flight


def test_a_replaced_attempts_late_chunks_do_not_move_the_resume_offset() -> None:
    """A worker the router gave up on streams on until it reads the supersede: its chunks past
    what the newer attempt sent are dropped by a reader, so a later continuation must not start
    after them (the stream would have a gap)."""
    core = core_factory(3)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 7), T0 + 100)
    heartbeat(core, T0 + 3_500, 1, 2)
    [emit] = _superseded(core.resume(T0 + 3_500), "its worker went silent")
    assert emit.message.attempt == 2 and emit.message.resume_from_token == 7
    core.observe(chunk("r1", 7, 3, worker="w0"), T0 + 3_600)  # attempt 1, late
    assert core.in_flight["r1"].tokens_done == 7
    core.observe(chunk("r1", 7, 2, worker=emit.message.worker_id, attempt=2), T0 + 3_700)
    assert core.in_flight["r1"].tokens_done == 9


def test_requests_of_a_silent_worker_resume_elsewhere_from_the_last_offset() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    for c in (chunk("r1", 0, 5), chunk("r1", 5, 4), chunk("r1", 3, 4),  # a duplicate
              chunk("r1", 20, 3)):  # after a gap: not what the client has
        core.observe(c, T0 + 100)
    assert core.resume(T0 + 3_000) == []  # w0 still within its heartbeat timeout
    heartbeat(core, T0 + 3_500, 1)
    [emit] = _superseded(core.resume(T0 + 3_500), "its worker went silent")
    d = emit.message
    assert isinstance(d, Dispatch) and emit.slot == 1
    assert (d.worker_id, d.slot, d.attempt, d.resume_from_token) == ("w1", 1, 2, 9)
    assert d.request.request_id == "r1"
    assert core.in_flight["r1"].dispatch == d
    assert core.resume(T0 + 3_500) == []  # it is on w1 now


def test_a_stream_to_a_clients_own_topic_resumes_where_the_heartbeats_said_it_was() -> None:
    """Its chunks go to its ``reply_to`` topic, which the router does not read: the worker's
    heartbeats say how far it went (another worker's or attempt's word does not count)."""
    from schemas.events import StreamProgress

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64, reply_to="client-7.replies")
    heartbeat(core, T0 + 400, 0, reply_progress=[StreamProgress(request_id="r1", tokens_sent=9)])
    heartbeat(core, T0 + 450, 1, reply_progress=[StreamProgress(request_id="r1", tokens_sent=30)])
    heartbeat(core, T0 + 500, 0, reply_progress=[
        StreamProgress(request_id="r1", attempt=2, tokens_sent=40)])
    assert core.in_flight["r1"].tokens_done == 9
    heartbeat(core, T0 + 5_000, 1)
    (cont,) = _superseded(core.resume(T0 + 5_000), "its worker went silent")
    assert (cont.message.worker_id, cont.message.resume_from_token) == ("w1", 9)


def test_a_requeued_request_resumes_on_another_worker_and_its_old_slot_drops_it() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 3), T0)
    core.observe(Requeued(event_time_ms=T0, request_id="r1", worker_id="w0", tokens_done=7), T0)
    emits = _superseded(core.resume(T0 + 10), "handed back")
    assert [type(e.message) for e in emits] == [Dispatch]
    d = emits[0].message
    assert (d.worker_id, d.attempt, d.resume_from_token) == ("w1", 2, 7)


def test_an_overdue_dispatch_is_recalled_then_continued_elsewhere() -> None:
    core = core_factory(2)
    old = _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 10), T0)
    expected = core.in_flight["r1"].expected_done_ms
    assert expected >= T0 + 30_000  # the floor on the expected duration
    heartbeat(core, expected, 0, 1)
    assert core.resume(expected) == []
    heartbeat(core, expected + 1, 0, 1)
    (cancel,) = core.resume(expected + 1)  # first the recall, nothing dispatched yet
    assert isinstance(cancel.message, CancelRequest)
    assert (cancel.message.request_id, cancel.message.attempt, cancel.slot) == ("r1", 1, old.slot)
    assert core.resume(expected + 2) == []  # recalled once only
    # The worker hands it back; then it continues elsewhere.
    core.observe(Requeued(event_time_ms=expected + 3, request_id="r1", worker_id="w0",
                          tokens_done=10), expected + 3)
    (cont,) = _superseded(core.resume(expected + 3), "handed back")
    assert isinstance(cont.message, Dispatch) and cont.slot == 1
    assert (cont.message.worker_id, cont.message.attempt, cont.message.resume_from_token) == (
        "w1", 2, 10)


@pytest.mark.parametrize("w0_now", [{"state": "draining"}, {"running": 0, "waiting": 0}])
@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "kv_aware"])
def test_the_baselines_leave_an_overdue_request_on_its_live_worker(policy: str,
                                                                  w0_now: dict) -> None:
    """Recalling overdue requests is governor's: a baseline router, as its authors document it,
    leaves a request where it runs until it ends or its worker dies. (In the simulator every
    request queued long on an overloaded worker was recalled and placed again, losing its
    place and its cache: 211 of round robin's on Mooncake at high load.)"""
    core = core_factory(2, config=GovernorConfig(routing_policy=policy))
    _in_flight_on_w0(core, max_tokens=64)
    expected = core.in_flight["r1"].expected_done_ms
    heartbeat(core, expected + 1, 0, 1, running=3)  # w0 serves, and holds requests
    assert core.resume(expected + 1) == []
    # Drained (or asleep), w0 will never read the dispatch in its paused partition; serving
    # and holding nothing, it lost it: either way the request is recalled, else it never ends.
    core.observe(status_factory("w0", 0, at=expected + 2, **w0_now), expected + 2)
    heartbeat(core, expected + 2, 1)
    [recall] = core.resume(expected + 2)
    assert isinstance(recall.message, CancelRequest) and recall.message.request_id == "r1"


def test_a_recall_its_live_worker_does_not_answer_is_taken_for_lost_after_a_while() -> None:
    """A worker that does not hold the attempt (its dispatch lost) ignores the recall: after
    ``RECALL_ANSWER_S`` the request is continued elsewhere, its old attempt superseded."""
    from controllers.router.core import RECALL_ANSWER_S

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 6), T0)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    (recall,) = core.resume(T0 + 2)
    assert isinstance(recall.message, CancelRequest)
    answer_by = T0 + 2 + int(RECALL_ANSWER_S * 1000)
    for at in (T0 + 5_000, answer_by):
        heartbeat(core, at, 0, 1)  # w0 alive throughout, and silent about r1
        assert core.resume(at) == []
    heartbeat(core, answer_by + 1, 0, 1)
    (cont,) = _superseded(core.resume(answer_by + 1), "its worker did not answer a recall")
    assert (cont.message.worker_id, cont.message.attempt, cont.message.resume_from_token) == (
        "w1", 2, 6)


def test_a_draining_worker_is_not_taken_to_leave_a_recall_unanswered() -> None:
    """A draining worker reads no recalls (it paused its dispatch partition) but heart-beats and
    hands back what it still runs when it stops: the wait for an answer starts again."""
    from controllers.router.core import RECALL_ANSWER_S

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    (recall,) = core.resume(T0 + 2)
    assert isinstance(recall.message, CancelRequest)
    wait = int(RECALL_ANSWER_S * 1000)
    for at in range(T0 + 1_000, T0 + 3 * wait, 1_000):
        heartbeat(core, at, 1)
        heartbeat(core, at, 0, state="draining", running=1)
        assert core.resume(at) == [], at
    assert "r1" in core.in_flight


def _recalled_from_w0(core: RouterCore) -> None:
    """r1 on w0, 6 tokens streamed, recalled at T0 + 2 (w0's breaker opened)."""
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 6), T0)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    (recall,) = core.resume(T0 + 2)
    assert isinstance(recall.message, CancelRequest)


@pytest.mark.parametrize("state", ["draining", "sleeping"])
@pytest.mark.parametrize("skew_ms", [0, -1_000, 5_000])  # the worker's clock against the router's
def test_a_recalled_request_is_lost_on_a_paused_worker_that_holds_nothing_for_a_while(
        state: str, skew_ms: int) -> None:
    """Drained or put to sleep by a command, with no end in sight, a worker that has held no
    request for ``RECALL_ANSWER_S`` (its own heartbeats' times) is not running the recalled
    one: it is continued elsewhere."""
    from controllers.router.core import RECALL_ANSWER_S

    core = core_factory(2)
    _recalled_from_w0(core)
    wait = int(RECALL_ANSWER_S * 1000)
    heartbeat(core, T0 + 500, 1)
    heartbeat(core, T0 + 500 + skew_ms, 0, state=state, waiting=1)  # something still queued
    assert core.resume(T0 + 1_000) == []
    for at in range(T0 + 1_500, T0 + 1_500 + wait, 500):  # then nothing at all, for a while
        heartbeat(core, at, 1)
        heartbeat(core, at + skew_ms, 0, state=state)
        assert core.resume(at + 250) == [], at - T0
    at = T0 + 1_500 + wait
    heartbeat(core, at, 1)
    heartbeat(core, at + skew_ms, 0, state=state)
    (cont,) = _superseded(core.resume(at + 250), "its worker did not answer a recall")
    assert (cont.message.worker_id, cont.message.attempt, cont.message.resume_from_token) == (
        "w1", 2, 6)


def test_a_paused_worker_idle_because_it_just_finished_the_request_completes_it_once() -> None:
    """The worker's heartbeat (keyed by worker) can be read before its ``Completed`` (keyed by
    request, another partition): idle for a moment is no evidence that the request is lost."""
    core = core_factory(2)
    _recalled_from_w0(core)
    heartbeat(core, T0 + 500, 1)
    heartbeat(core, T0 + 500, 0, state="draining", running=1)
    assert core.resume(T0 + 700) == []
    core.observe(chunk("r1", 6, 58, final=True), T0 + 900)  # every token, then idle
    heartbeat(core, T0 + 1_000, 1)
    heartbeat(core, T0 + 1_000, 0, state="draining")
    assert core.resume(T0 + 1_250) == []
    core.observe(Completed(event_time_ms=T0 + 1_000, request_id="r1", tenant="default",
                           model=MODEL, worker_id="w0", attempt=1, prompt_tokens=256,
                           output_tokens=64, e2e_s=1.0), T0 + 1_300)
    assert "r1" not in core.in_flight
    assert core.resume(T0 + 60_000) == []


def test_a_recalled_request_that_completes_meanwhile_is_not_continued() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    (recall,) = core.resume(T0 + 2)
    core.observe(Completed(event_time_ms=T0 + 3, request_id="r1", worker_id="w0",
                           prompt_tokens=10, output_tokens=64, e2e_s=1.0), T0 + 3)
    assert core.resume(T0 + 4) == [] and "r1" not in core.in_flight


def test_opening_a_breaker_evacuates_its_worker() -> None:
    core = core_factory(2)
    old = _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 6), T0)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    (cancel,) = core.resume(T0 + 2)  # w0 is alive and not overdue: the breaker recalls it
    assert isinstance(cancel.message, CancelRequest) and cancel.slot == old.slot
    assert cancel.message.attempt == 1 and "breaker" in cancel.message.reason
    core.observe(Requeued(event_time_ms=T0 + 3, request_id="r1", worker_id="w0", tokens_done=6),
                 T0 + 3)
    (cont,) = _superseded(core.resume(T0 + 3), "handed back")
    assert (cont.message.worker_id, cont.message.attempt, cont.message.resume_from_token) == (
        "w1", 2, 6)
    assert core.resume(T0 + 4) == []


def test_a_placement_read_after_its_workers_breaker_opened_is_evacuated_too() -> None:
    """A router's read-back takes the control topic (the open breaker) before the dispatches:
    a request placed there before the restart is moved as if it had been in flight then."""
    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0)
    core.observe(Dispatch(event_time_ms=T0, request=request_factory("r1", max_tokens=64),
                          worker_id="w0", slot=0, router_id=core.router_id), T0)
    (cancel,) = core.resume(T0 + 1)
    assert isinstance(cancel.message, CancelRequest) and "breaker" in cancel.message.reason


def test_a_baseline_policy_placing_on_an_open_breaker_does_not_recall_its_own_placement() -> None:
    """Baselines ignore breakers when they place (as their authors document them): a request
    one just placed there is not taken for one placed before the breaker opened."""
    core = core_factory(2, config=GovernorConfig(routing_policy="round_robin"))
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0)
    placed = [worker_of(core.route(request_factory(f"r{n}"), T0)) for n in range(2)]
    assert "w0" in placed
    assert core.resume(T0 + 1) == []  # no recall of its own fresh placement


def test_without_retry_budget_an_evacuated_request_stays_on_its_live_worker() -> None:
    core = core_factory(2, config=GovernorConfig(retry_budget_ratio=0.0, retry_budget_min_per_s=0.0))
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    assert core.resume(T0 + 2) == []  # no recall, and no failure: w0 still runs it
    assert core.in_flight["r1"].recall_sent_ms is None
    core.retry_budget.configure(1.0, 1.0)  # budget again: now it is recalled, and paid once
    (recall,) = core.resume(T0 + 3)
    assert isinstance(recall.message, CancelRequest)
    core.retry_budget.configure(0.0, 0.0)
    core.observe(Requeued(event_time_ms=T0 + 4, request_id="r1", worker_id="w0", tokens_done=6),
                 T0 + 4)
    (cont,) = _superseded(core.resume(T0 + 4), "handed back")
    assert isinstance(cont.message, Dispatch) and cont.message.worker_id == "w1"


def test_a_breaker_that_closes_before_its_request_could_move_leaves_it_where_it_runs() -> None:
    core = core_factory(2, config=GovernorConfig(retry_budget_ratio=0.0, retry_budget_min_per_s=0.0))
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    assert core.resume(T0 + 2) == []  # no budget to move it
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="closed"), T0 + 3)
    core.retry_budget.configure(1.0, 1.0)  # budget again, and w0 healthy: nothing to recall
    assert core.resume(T0 + 4) == []
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 5)
    assert [e.message.type for e in core.resume(T0 + 6)] == ["cancel_request"]  # open again


@pytest.mark.parametrize("how", ["restarted", "stopped", "crashed"])
def test_a_worker_that_restarts_or_stops_takes_no_breaker_state_with_it(how: str) -> None:
    """A controller that forgot it (it stopped) or restarted would never say it is closed."""
    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    assert worker_of(core.route(request_factory("a"), T0 + 2)) == "w1"
    if how == "restarted":
        heartbeat(core, T0 + 3, 0, started_ms=T0 + 2)
    else:
        heartbeat(core, T0 + 3, 0, state=how)
        heartbeat(core, T0 + 4, 0, started_ms=T0 + 3)  # the slot's worker started again
    assert core.breakers.get("w0") is None
    assert worker_of(core.route(request_factory("b", priority=9), T0 + 5)) == "w0"


@pytest.mark.parametrize("restarted", [False, True])
def test_a_worker_silent_for_a_minute_keeps_its_breaker_state_unless_it_restarted(
        restarted: bool) -> None:
    """Cut off for a minute, not restarted (its ``started_ms`` as before): the controllers hold
    its breaker open still, and the router keeps it open. Before 7 Dec the router took the
    worker's start for the time it was taken for gone, and heard again, for a restart: it
    dropped the open state and placed requests there until the controllers restated it."""
    from controllers.router.core import GONE_AFTER_S

    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    gone = T0 + int(GONE_AFTER_S * 1000) + 1
    heartbeat(core, gone, 1)
    core.resume(gone)  # w0 taken for gone: its prefix cache forgotten
    heartbeat(core, gone + 1, 1)
    # heard again
    heartbeat(core, gone + 1, 0, **(dict(started_ms=gone - 1_000) if restarted else {}))
    assert core.breakers.get("w0") == (None if restarted else "open")
    assert worker_of(core.route(request_factory("a", priority=9), gone + 2)) == \
        ("w0" if restarted else "w1")


def test_a_heartbeat_stamped_far_ahead_keeps_its_worker_as_it_was_a_bounded_time() -> None:
    """w0's host clock stepped an hour ahead for one heartbeat (NTP set it right): taken at its
    own time, every later heartbeat looked old, its "stopped" too, and w0 stayed live (its
    requests never resumed, new ones placed on it) for the hour. It counts as heard at most
    ``MAX_AHEAD_MS`` ahead of the router's clock."""
    from controllers.router.fleet import MAX_AHEAD_MS

    core = core_factory(2)
    _in_flight_on_w0(core)
    core.observe(status_factory("w0", 0, at=T0 + 3_600_000, running=1), T0 + 1)
    heartbeat(core, T0 + 10, 0, state="stopped")  # older than that one yet: left out
    late = T0 + 1 + MAX_AHEAD_MS + core.fleet.heartbeat_timeout_ms + 1
    heartbeat(core, late, 1)
    assert [w.worker_id for w in core.fleet.live(late)] == ["w1"]
    [dispatch] = _superseded(core.resume(late), "its worker went silent")
    assert isinstance(dispatch.message, Dispatch) and dispatch.message.worker_id == "w1"


def test_a_worker_restarted_after_a_heartbeat_stamped_far_ahead_is_taken_as_restarted() -> None:
    from controllers.router.fleet import MAX_AHEAD_MS

    core = core_factory(2)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    core.observe(status_factory("w0", 0, at=T0 + 3_600_000), T0 + 2)
    heartbeat(core, T0 + 3, 0, started_ms=T0 + 2)  # older than that one yet: left out
    assert core.breakers.get("w0") == "open"
    t = T0 + 2 + MAX_AHEAD_MS
    heartbeat(core, t, 0, started_ms=T0 + 2)
    assert core.breakers.get("w0") is None and core._started["w0"] == T0 + 2


def test_requests_refused_do_not_enlarge_the_retry_budget() -> None:
    config = GovernorConfig(retry_budget_ratio=0.5, retry_budget_min_per_s=0.0)
    core = core_factory(1, config=config)
    for n in range(10):  # a 60k-token prompt due in 0.1 s: no worker can, placement refuses
        denial = core.route(request_factory(f"late{n}", prompt_tokens=60_000,
                                            deadline_ms=T0 + 100), T0).denial
        assert denial is not None and denial.reason == "deadline_unreachable"
    assert core.retry_budget.allowance(T0 / 1000) == 0
    assert worker_of(core.route(request_factory("served"), T0)) == "w0"
    assert core.retry_budget.allowance(T0 / 1000) == pytest.approx(0.5)


def test_a_lost_request_whose_answer_ended_before_its_cap_completes_not_resumed() -> None:
    """max_tokens is a cap: an answer that ended at its end of sequence (the final chunk) before
    it is whole too; resumed, the next worker would send a token past its end."""
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=2_000)
    core.observe(chunk("r1", 0, 40, final=True), T0)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _superseded(core.resume(T0 + 5_000), "its worker went silent")
    done = emit.message
    assert isinstance(done, Completed) and (done.output_tokens, done.finish_reason) == (40, "stop")


def test_a_lost_request_whose_stream_ended_in_an_error_is_not_taken_for_completed() -> None:
    """A worker sends a final chunk for an engine error, and its Failed after: lost between the
    two, the request was not answered."""
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=2_000)
    failed = chunk("r1", 0, 40, final=True).model_copy(update={"finish_reason": "error"})
    core.observe(failed, T0)
    heartbeat(core, T0 + 5_000, 1)
    assert not any(isinstance(e.message, Completed) for e in core.resume(T0 + 5_000))


def test_a_completion_teaches_how_long_answers_run_once_and_an_older_attempts_nothing() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=1_000)
    ended = Completed(event_time_ms=T0 + 9, request_id="r1", worker_id="w0", attempt=1,
                      prompt_tokens=256, output_tokens=100, finish_reason="stop", e2e_s=0.009)
    core.observe(ended, T0 + 9)
    core.observe(ended, T0 + 10)  # read again (its own, emitted and read back, say)
    assert core.answers._models[(MODEL, (1_000 - 1).bit_length())].count == 1
    assert core.answers.expected(request_factory("next", max_tokens=600)) == pytest.approx(60)
    core.observe(Completed(event_time_ms=T0, request_id="unknown", worker_id="w1",
                           prompt_tokens=1, output_tokens=7, e2e_s=0.1), T0 + 11)
    assert core.answers._models[(MODEL, (1_000 - 1).bit_length())].count == 1  # its cap is unknown
    dispatch = _in_flight_on_w0(core, "r2", max_tokens=1_000)
    core.observe(Requeued(event_time_ms=T0, request_id="r2", worker_id="w0", tokens_done=0), T0)
    heartbeat(core, T0 + 100, 0, 1)
    core.resume(T0 + 100)
    assert core.in_flight["r2"].dispatch.attempt == dispatch.attempt + 1
    core.observe(Completed(event_time_ms=T0 + 101, request_id="r2", worker_id="w0", attempt=1,
                           prompt_tokens=256, output_tokens=900, e2e_s=0.1), T0 + 101)
    assert core.answers._models[(MODEL, (1_000 - 1).bit_length())].count == 1  # the older attempt's


def test_a_stopped_workers_own_end_of_a_request_is_waited_for_a_moment() -> None:
    """A worker's "stopped" status and a request's Completed it sent just before are on
    different telemetry partitions: read in that order, the router took the request for lost
    and, holding every token, ended it itself, and the worker's Completed was a second end."""
    from controllers.router.fleet import STOPPED_GRACE_MS

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 8, final=True), T0)
    heartbeat(core, T0 + 10, 0, state="stopped")
    heartbeat(core, T0 + 10, 1)
    assert core.resume(T0 + 11) == []  # its own end may be on its way
    core.observe(Completed(event_time_ms=T0 + 9, request_id="r1", worker_id="w0", attempt=1,
                           prompt_tokens=256, output_tokens=8, e2e_s=0.009), T0 + 12)
    heartbeat(core, T0 + 10 + STOPPED_GRACE_MS, 1)
    assert core.resume(T0 + 10 + STOPPED_GRACE_MS) == []  # ended once, by its worker


def test_a_stopped_worker_whose_request_did_not_end_loses_it_after_the_grace() -> None:
    from controllers.router.fleet import STOPPED_GRACE_MS

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 8, final=True), T0)
    heartbeat(core, T0 + 10, 0, state="stopped")
    heartbeat(core, T0 + 10 + STOPPED_GRACE_MS, 1)
    [emit] = _superseded(core.resume(T0 + 10 + STOPPED_GRACE_MS), "its worker went silent")
    assert isinstance(emit.message, Completed) and emit.message.request_id == "r1"


def test_a_worker_reporting_its_engine_crashed_has_its_own_end_waited_for_a_moment() -> None:
    """A worker whose engine's server died heart-beats on, ``crashed``; the streams cut there
    end as they tell (a request whose last chunk came completes) on other partitions. Before,
    the router took its requests for lost at its first such heartbeat and, holding every token
    of one, ended it itself: the worker's Completed was a second end."""
    from controllers.router.fleet import STOPPED_GRACE_MS

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 8, final=True), T0)
    heartbeat(core, T0 + 10, 0, 1, state="crashed")
    heartbeat(core, T0 + 10, 1)
    assert core.resume(T0 + 11) == []  # its own end may be on its way
    heartbeat(core, T0 + 600, 0, state="crashed")
    core.observe(Completed(event_time_ms=T0 + 9, request_id="r1", worker_id="w0", attempt=1,
                           prompt_tokens=256, output_tokens=8, e2e_s=0.009), T0 + 12)
    heartbeat(core, T0 + 10 + STOPPED_GRACE_MS, 0, state="crashed")
    heartbeat(core, T0 + 10 + STOPPED_GRACE_MS, 1)
    assert core.resume(T0 + 10 + STOPPED_GRACE_MS) == []  # ended once, by its worker


def test_a_worker_reporting_its_engine_crashed_loses_its_requests_after_the_grace() -> None:
    """It goes on heart-beating ``crashed``: the grace counts from the first heartbeat that
    said so, not the latest."""
    from controllers.router.fleet import STOPPED_GRACE_MS

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 3), T0)
    for at in range(T0 + 10, T0 + 10 + STOPPED_GRACE_MS + 1, 500):
        heartbeat(core, at, 0, state="crashed")
        heartbeat(core, at, 1)
        if at < T0 + 10 + STOPPED_GRACE_MS:
            assert core.resume(at) == []
    [cont] = _superseded(core.resume(T0 + 10 + STOPPED_GRACE_MS), "its worker went silent")
    assert (cont.message.worker_id, cont.message.resume_from_token) == ("w1", 3)


def test_a_lost_request_with_every_token_sent_completes() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 5), T0)
    core.observe(chunk("r1", 5, 3, final=True), T0)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _superseded(core.resume(T0 + 5_000), "its worker went silent")
    done = emit.message
    assert isinstance(done, Completed) and emit.slot is None
    assert (done.request_id, done.worker_id, done.attempt, done.output_tokens, done.created_ms) == (
        "r1", "w0", 1, 8, T0)
    assert done.e2e_s == pytest.approx(5.0)
    assert "r1" not in core.in_flight


@pytest.mark.parametrize("then", ["its Completed", "no answer", "silence"])
def test_an_overdue_request_with_every_token_sent_is_left_to_its_live_worker(then: str) -> None:
    """The last chunk (responses topic) read before the worker's Completed (telemetry topic),
    and the breaker opened meanwhile: the router recalls it rather than publish a Completed of
    its own beside the worker's. It completes it only if the worker goes silent, or leaves the
    recall unanswered (it does not hold the request), without a Completed."""
    from controllers.router.core import RECALL_ANSWER_S

    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 8, final=True), T0)
    core.observe(cmd(commands.SetBreakerState, worker_id="w0", state="open"), T0 + 1)
    heartbeat(core, T0 + 2, 0, 1)
    (recall,) = core.resume(T0 + 2)
    assert isinstance(recall.message, CancelRequest) and "r1" in core.in_flight
    later = T0 + 3 + int(RECALL_ANSWER_S * 1000)
    if then == "its Completed":
        core.observe(Completed(event_time_ms=T0 + 3, request_id="r1", worker_id="w0",
                               prompt_tokens=256, output_tokens=8, e2e_s=0.1), T0 + 3)
        heartbeat(core, later, 0, 1)
        assert core.resume(later) == [] and "r1" not in core.in_flight
        return
    heartbeat(core, later, *((1,) if then == "silence" else (0, 1)))
    why = "its worker went silent" if then == "silence" else "its worker did not answer a recall"
    [emit] = _superseded(core.resume(later), why)
    assert isinstance(emit.message, Completed) and emit.message.output_tokens == 8


def test_a_dispatch_read_back_before_its_workers_heartbeats_is_due_by_that_worker() -> None:
    """After a restart the router reads the dispatch topic back before the telemetry topic:
    how long a request should take is set once its worker is heard (here about 11 minutes),
    not from an empty fleet, which took every request read back for overdue after the 30 s
    floor and recalled it."""
    core = RouterCore(GovernorConfig())
    req = request_factory("r1", prompt_tokens=8_000, max_tokens=4_000)
    core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, attempt=1,
                          router_id=core.router_id), T0)
    heartbeat(core, T0, 0, 1, running=64)
    for at in (T0 + 31_000, T0 + 120_000):
        heartbeat(core, at, 0, 1, running=64)
        assert core.resume(at) == []
    assert core.in_flight["r1"].expected_done_ms - T0 > 600_000


def test_a_dispatch_to_a_worker_never_heard_from_is_continued_after_the_heartbeat_timeout(
) -> None:
    core = RouterCore(GovernorConfig())
    req = request_factory("r1")
    core.observe(Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, attempt=1,
                          router_id=core.router_id), T0)
    heartbeat(core, T0 + 2_000, 1)
    assert core.resume(T0 + 2_000) == []  # w0 may yet be heard
    heartbeat(core, T0 + 3_500, 1)
    (cont,) = _superseded(core.resume(T0 + 3_500), "its worker went silent")
    assert (cont.message.worker_id, cont.message.attempt) == ("w1", 2)


def test_a_lost_request_fails_when_the_retry_budget_is_spent() -> None:
    config = GovernorConfig(retry_budget_ratio=0.0, retry_budget_min_per_s=0.0)
    core = core_factory(2, config=config)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 4), T0)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _stream_ended(_superseded(core.resume(T0 + 5_000), "its worker went silent"),
                           "error", token_offset=4)  # after the 4 tokens the client has
    failed = emit.message
    assert isinstance(failed, Failed) and emit.slot is None
    assert (failed.request_id, failed.reason, failed.worker_id, failed.created_ms) == (
        "r1", "retry_budget_exhausted", "w0", T0)
    assert "r1" not in core.in_flight
    assert core.resume(T0 + 5_000) == []


def test_set_retry_budget_command_spends_it_too() -> None:
    core = core_factory(2)
    core.observe(cmd(commands.SetRetryBudget, ratio=0.0, min_per_s=0.0), T0)
    _in_flight_on_w0(core)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _stream_ended(_superseded(core.resume(T0 + 5_000), "its worker went silent"),
                           "error")
    assert isinstance(emit.message, Failed)


def test_a_commanded_retry_budget_survives_other_settings_changing() -> None:
    core = core_factory(2)
    core.observe(cmd(commands.SetRetryBudget, ratio=0.0, min_per_s=0.0), T0)
    core.apply_config(GovernorConfig(slo={"ttft_slo_s": 3.0}))  # another setting changes
    _in_flight_on_w0(core)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _stream_ended(_superseded(core.resume(T0 + 5_000), "its worker went silent"),
                           "error")
    assert isinstance(emit.message, Failed)  # still no budget


def test_a_retry_budget_set_in_the_configuration_replaces_a_commanded_one() -> None:
    core = core_factory(2)
    core.observe(cmd(commands.SetRetryBudget, ratio=0.0, min_per_s=0.0), T0)
    core.apply_config(GovernorConfig(retry_budget_ratio=0.5))
    _in_flight_on_w0(core)
    heartbeat(core, T0 + 5_000, 1)
    [emit] = _superseded(core.resume(T0 + 5_000), "its worker went silent")
    assert isinstance(emit.message, Dispatch)  # continued: the configuration's budget


def test_a_request_lost_at_its_last_attempt_fails_rather_than_stopping_the_router() -> None:
    """A continuation past MAX_ATTEMPTS is no valid Dispatch: building one raised, stopped the
    router, and its read-back met the request again at every restart."""
    core = core_factory(2)
    core.observe(Dispatch(event_time_ms=T0, request=request_factory("r1"), worker_id="w0",
                          slot=0, router_id=core.router_id, attempt=MAX_ATTEMPTS), T0)
    core.observe(Requeued(event_time_ms=T0 + 1, request_id="r1", worker_id="w0",
                          attempt=MAX_ATTEMPTS, tokens_done=3), T0 + 1)
    [emit] = _stream_ended(_superseded(core.resume(T0 + 2), "handed back", attempt=MAX_ATTEMPTS), "error")
    assert isinstance(emit.message, Failed) and "1,000 attempts" in emit.message.detail
    assert "r1" not in core.in_flight and core.resume(T0 + 3) == []


def test_a_lost_request_waits_for_a_live_worker() -> None:
    core = core_factory(1)
    _in_flight_on_w0(core, max_tokens=64)
    assert core.resume(T0 + 5_000) == []  # nowhere to go yet
    assert "r1" in core.in_flight
    core.observe(status_factory("w7", 7, at=T0 + 5_200), T0 + 5_200)
    [emit] = _superseded(core.resume(T0 + 5_200), "its worker went silent")  # once, when placed
    assert (emit.message.worker_id, emit.message.attempt) == ("w7", 2)


def test_a_lost_request_no_worker_comes_for_fails_in_the_end() -> None:
    """Its model's only worker is gone and none comes (autoscaling off, or the controllers
    that would wake the pool restarted since): it fails, rather than waiting for good."""
    core = core_factory(1)
    _in_flight_on_w0(core, max_tokens=64)
    assert core.resume(T0 + 5_000) == []  # nowhere to go yet: it waits
    waited = T0 + 5_000 + int(NO_WORKER_GIVE_UP_S * 1000)
    assert core.resume(waited - 1) == []
    [emit] = _stream_ended(_superseded(core.resume(waited), "its worker went silent"), "error")
    assert isinstance(emit.message, Failed) and emit.message.reason == "worker_lost"
    assert "r1" not in core.in_flight


def test_a_request_whose_worker_is_heard_again_waits_anew_when_lost_later() -> None:
    """The wait for a worker counts from the latest loss, not the first one."""
    core = core_factory(1)
    _in_flight_on_w0(core, max_tokens=64)
    assert core.resume(T0 + 5_000) == []  # w0 silent, none other: it waits
    heartbeat(core, T0 + 6_000, 0)  # w0 heard again: it runs on there
    assert core.resume(T0 + 6_000) == []
    lost_again = T0 + 6_000 + int(NO_WORKER_GIVE_UP_S * 1000)  # far later, w0 silent again
    assert core.resume(lost_again) == []  # waits again, it does not fail at once
    assert "r1" in core.in_flight


@pytest.mark.parametrize(
    "terminal",
    [
        Completed(event_time_ms=T0, request_id="r1", worker_id="w0", prompt_tokens=256,
                  output_tokens=32, e2e_s=1.0),
        Failed(event_time_ms=T0, request_id="r1", reason="engine_error"),
        Cancelled(event_time_ms=T0, request_id="r1"),
        Rejected(event_time_ms=T0, request_id="r1", reason="no_capacity"),
    ],
    ids=lambda m: m.type,
)
def test_terminal_events_end_the_flight(terminal) -> None:
    core = core_factory(2)
    _in_flight_on_w0(core)
    core.observe(terminal, T0 + 1)
    assert "r1" not in core.in_flight
    assert core.ledger.requests("w0") == 0
    heartbeat(core, T0 + 5_000, 1)
    assert core.resume(T0 + 5_000) == []


def test_emit_slot_marks_dispatch_topic_messages() -> None:
    core = core_factory(2)
    _in_flight_on_w0(core)
    heartbeat(core, T0 + 5_000, 1)
    assert all(isinstance(e, Emit) and e.slot is not None for e in core.resume(T0 + 5_000))


# --- commands ------------------------------------------------------------------------------------

def _two_pools() -> RouterCore:
    core = RouterCore()
    core.observe(status_factory("a", 0, pool="p-a"), T0)
    core.observe(status_factory("b", 1, pool="p-b"), T0)
    return core


def test_routing_weights_feed_the_pool_weight_scorer() -> None:
    plain = _two_pools()
    assert worker_of(plain.route(request_factory(), T0)) == "a"  # a tie: the lower slot
    weighted = _two_pools()
    weighted.observe(cmd(commands.SetRoutingWeights, weights={"p-a": 0.05, "p-b": 1.0}), T0)
    decision = weighted.route(request_factory(), T0)
    assert worker_of(decision) == "b"
    assert decision.scores["pool_weight"] == 1.0


def test_below_the_shed_level_a_request_is_served_only_with_time_to_spare() -> None:
    core = core_factory(1)
    core.observe(cmd(commands.SetLoadShedLevel, min_value=0.3), T0)
    low = dict(priority=3)  # value 0.17: may use 0.35 x sqrt(0.17 / 0.3), 26%, of its budget
    # An idle worker: low-value work still fits well within its 2 s TTFT target.
    assert core.route(request_factory("low", **low), T0).dispatch is not None
    # Worth nothing: shed whatever the fleet's state.
    assert core.route(request_factory("zero", priority=0), T0).denial.reason == "load_shed"
    # 20k prompt tokens queued: a first token in about 0.43 s, within its 0.52 s (a share in
    # proportion to its value, 19% or 0.39 s, would shed it).
    heartbeat(core, T0 + 1, 0, prefill_backlog_tokens=20_000, waiting=2)
    assert core.route(request_factory("low1", **low), T0 + 1).dispatch is not None
    # 30k: over its share, but within a flat 35% (0.70 s), which would serve it.
    heartbeat(core, T0 + 2, 0, prefill_backlog_tokens=30_000, waiting=2)
    shed = core.route(request_factory("low2", **low), T0 + 2).denial
    assert shed is not None and shed.reason == "load_shed"
    assert "exceeds 0.522s, the 0.26 of its 2s budget" in shed.detail
    predicted = float(shed.detail.split("predicted TTFT ")[1].split("s ")[0])
    assert 0.52 < predicted < 0.70
    assert core.route(request_factory("high", priority=9), T0 + 2).dispatch is not None
    core.observe(cmd(commands.SetLoadShedLevel, min_value=0.0), T0 + 2)
    assert core.route(request_factory("low3", **low), T0 + 2).dispatch is not None


def _step(request_id: str, step: int, task: str = "t1", **fields: Any):
    return request_factory(request_id, task_id=task, step=step, steps_total=3, **fields)


@pytest.mark.parametrize("ending", ["rejected", "failed"])
def test_a_task_whose_step_was_rejected_or_failed_has_its_later_steps_refused(ending: str) -> None:
    core = core_factory(1)
    end = (Rejected(event_time_ms=T0, request_id="s1", task_id="t1", reason="load_shed")
           if ending == "rejected" else
           Failed(event_time_ms=T0, request_id="s1", task_id="t1", reason="engine_error"))
    core.observe(end, T0)
    denial = core.route(_step("s2", 2), T0).denial
    assert denial is not None and denial.reason == "task_failed" and "s1" in denial.detail
    assert denial.retry_after_s is None and core.told(_step("s2", 2), denial) == denial
    assert core.route(_step("o1", 1, task="t2"), T0).dispatch is not None  # other tasks go on
    baseline = core_factory(1, config=GovernorConfig(routing_policy="round_robin"))
    baseline.observe(end, T0)
    assert baseline.route(_step("s2", 2), T0).dispatch is not None  # no admission: served


def test_a_task_whose_step_the_router_refuses_fails_at_once() -> None:
    # Before its Rejected is read back: the task's next step may be routed first.
    core = core_factory(1)
    late = _step("s1", 1, created_ms=T0 - 5_000, deadline_ms=T0 - 1_000)
    assert core.route(late, T0).denial.reason == "deadline_unreachable"
    denial = core.route(_step("s2", 2), T0).denial
    assert denial is not None and denial.reason == "task_failed" and "s1 rejected" in denial.detail


def test_a_step_of_a_task_is_not_told_to_retry_since_its_denial_fails_the_task() -> None:
    core = core_factory(1)
    core.observe(cmd(commands.SetLoadShedLevel, min_value=0.5), T0)
    heartbeat(core, T0 + 1, 0, prefill_backlog_tokens=100_000, waiting=10)
    alone = core.route(request_factory("alone"), T0 + 1).denial
    step = core.route(_step("s1", 1), T0 + 1).denial
    assert alone.reason == step.reason == "load_shed"
    assert core.told(request_factory("alone"), alone) == alone  # a request alone may retry
    assert alone.retry_after_s is not None and alone.retry_after_s > 0
    told = core.told(_step("s1", 1), step)
    assert told.retry_after_s is None and told.detail.endswith("task t1 fails with it")
    assert told.reason == "load_shed" and told.detail.startswith(step.detail)
    baseline = core_factory(1, config=GovernorConfig(routing_policy="round_robin"))
    assert baseline.told(_step("s1", 1), step) == step  # no task is failed there


def test_a_rate_limited_step_keeps_its_hint_and_its_task_goes_on() -> None:
    """Over its tenant's rate, a step is told when to retry; the retry (a new request id) and
    the task's next step are routed, and the Rejected read back fails no task either."""
    limit = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    core = core_factory(1, config=GovernorConfig(tenants={"a": limit}))
    assert core.route(_step("s1", 1, tenant="a"), T0).dispatch is not None
    refused = _step("s2", 2, tenant="a")
    denial = core.route(refused, T0).denial
    assert denial is not None and denial.reason == "rate_limited"
    assert core.told(refused, denial) == denial and denial.retry_after_s == 1.0
    core.observe(Rejected(event_time_ms=T0, request_id="s2", task_id="t1", tenant="a",
                          reason="rate_limited", retry_after_s=1.0), T0)
    retry_at = T0 + int(denial.retry_after_s * 1000)
    assert core.route(_step("s2-retry", 2, tenant="a"), retry_at).dispatch is not None
    assert core.route(_step("s3", 3, tenant="a"), retry_at + 1_000).dispatch is not None


def test_a_step_no_worker_could_take_fails_no_task() -> None:
    core = RouterCore(GovernorConfig())  # no worker has heart-beaten yet
    assert core.route(_step("s1", 1), T0).waits
    core.observe(Rejected(event_time_ms=T0, request_id="s1", task_id="t1",
                          reason="no_capacity", retry_after_s=5.0), T0)
    denial = Denial("no_capacity", "no live worker serves m", retry_after_s=5.0)
    assert core.told(_step("s1", 1), denial) == denial
    heartbeat(core, T0 + 5_000, 0)
    assert core.route(_step("s1-retry", 1), T0 + 5_000).dispatch is not None


def test_admission_limits_merge_with_the_configured_tenants() -> None:
    one = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    core = core_factory(1, config=GovernorConfig(tenants={"a": one}))
    core.observe(cmd(commands.SetAdmissionLimits, limits={"b": one}), T0)

    def admitted(tenant: str, n: int) -> list[bool]:
        return [core.route(request_factory(f"{tenant}{i}", tenant=tenant), T0).dispatch is not None
                for i in range(n)]

    assert admitted("a", 2) == [True, False]  # from config
    assert admitted("b", 2) == [True, False]  # from the command
    assert admitted("c", 3) == [True, True, True]  # neither
    many = TenantLimit(requests_per_s=100, tokens_per_s=1e6, burst_s=1)
    core.observe(commands.SetAdmissionLimits(event_time_ms=T0 + 1, command_id="c2",
                                             limits={"a": many}), T0 + 1)  # (a later one)
    assert admitted("a", 3) == [True, True, True]  # the command overrides config for "a"


def test_apply_config_with_an_unknown_weight_raises_and_keeps_the_config() -> None:
    core = RouterCore()
    before = core.config, core.policy
    with pytest.raises(ValueError, match="no_such_scorer"):
        core.apply_config(GovernorConfig(router_weights={"no_such_scorer": 1.0}))
    assert (core.config, core.policy) == before


def test_apply_config_switches_policy_and_heartbeat_timeout() -> None:
    core = core_factory(2)
    core.apply_config(GovernorConfig(routing_policy="round_robin", worker_heartbeat_timeout_s=10))
    assert [worker_of(core.route(request_factory(f"r{n}"), T0 + 9_000)) for n in range(3)] == [
        "w0", "w1", "w0"]


def _moved_to_the_other_worker(core: RouterCore, request) -> tuple[Dispatch, Dispatch]:
    """``request`` placed, its worker silent, the router resumes it on the other one."""
    first = core.route(request, T0).dispatch
    other = 1 - first.slot
    heartbeat(core, T0 + 3_500, other)
    moved = next(e.message for e in core.resume(T0 + 3_500) if isinstance(e.message, Dispatch))
    assert moved.attempt == 2 and moved.worker_id == f"w{other}"
    return first, moved


def test_a_replaced_attempt_failing_late_leaves_the_running_one_and_its_task_alone() -> None:
    core = core_factory(2)
    first, moved = _moved_to_the_other_worker(core, _step("s1", 1))
    core.observe(Failed(event_time_ms=T0 + 3_600, request_id="s1", task_id="t1",
                        reason="engine_error", worker_id=first.worker_id), T0 + 3_600)
    assert core.in_flight["s1"].dispatch == moved  # still tracked: resumed again if w1 dies
    assert core.route(_step("s2", 2), T0 + 3_700).dispatch is not None
    # The running attempt's own failure does end it.
    core.observe(Failed(event_time_ms=T0 + 3_800, request_id="s1", task_id="t1",
                        reason="engine_error", worker_id=moved.worker_id), T0 + 3_800)
    assert "s1" not in core.in_flight
    assert core.route(_step("s3", 3), T0 + 3_900).denial.reason == "task_failed"


def test_a_replaced_attempt_completing_late_has_the_running_one_cancelled() -> None:
    core = core_factory(2)
    first, moved = _moved_to_the_other_worker(core, request_factory("r1"))
    core.observe(Completed(event_time_ms=T0 + 3_600, request_id="r1", worker_id=first.worker_id,
                           attempt=1, prompt_tokens=256, output_tokens=32, e2e_s=3.6), T0 + 3_600)
    assert "r1" not in core.in_flight
    heartbeat(core, T0 + 3_700, moved.slot)
    emits = core.resume(T0 + 3_700)
    cancels = [e for e in emits if isinstance(e.message, CancelRequest)]
    assert [(e.message.attempt, e.slot) for e in cancels] == [(2, moved.slot)]
    assert "completed" in cancels[0].message.reason
    assert core.resume(T0 + 3_800) == []  # once


def test_a_refusal_fails_only_its_own_tenants_task() -> None:
    core = core_factory(1)
    core.observe(Rejected(event_time_ms=T0, request_id="e1", task_id="t1", tenant="other",
                          reason="load_shed"), T0)
    assert core.route(_step("s1", 1, tenant="other"), T0).denial.reason == "task_failed"
    assert core.route(_step("s1", 1), T0).dispatch is not None  # tenant default, same task id


def test_a_request_refused_by_placement_is_not_charged_to_its_tenant() -> None:
    limit = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)  # one request at a time
    core = core_factory(1, config=GovernorConfig(tenants={"a": limit}))
    late = request_factory("late", tenant="a", prompt_tokens=8_000, deadline_ms=T0 + 100)
    assert core.route(late, T0).denial.reason == "deadline_unreachable"
    assert core.route(request_factory("next", tenant="a"), T0).dispatch is not None


def test_limits_commanded_by_a_controller_survive_a_configuration_change() -> None:
    one = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    config = GovernorConfig(tenants={"a": one})
    core = core_factory(1, config=config)
    core.observe(cmd(commands.SetAdmissionLimits, limits={"c": one}), T0)
    assert core.route(request_factory("c1", tenant="c"), T0).dispatch is not None
    assert core.route(request_factory("a1", tenant="a"), T0).dispatch is not None
    core.apply_config(config.model_copy(update={"worker_heartbeat_timeout_s": 4.0}))
    # Both limits hold, and neither bucket was refilled by a change to neither.
    assert core.route(request_factory("c2", tenant="c"), T0).denial.reason == "rate_limited"
    assert core.route(request_factory("a2", tenant="a"), T0).denial.reason == "rate_limited"


def test_a_step_larger_than_its_tenants_burst_fails_its_task_without_a_hint() -> None:
    small = TenantLimit(requests_per_s=10, tokens_per_s=100, burst_s=2)  # 200 tokens at most
    core = core_factory(1, config=GovernorConfig(tenants={"a": small}))
    big = _step("s1", 1, tenant="a")  # 256 + 32 tokens
    denial = core.route(big, T0).denial
    assert denial.reason == "rate_limited" and denial.retry_after_s is None
    assert "288 tokens" in denial.detail and "burst of 200" in denial.detail
    assert core.told(big, denial).detail.endswith("task t1 fails with it")
    later = core.route(_step("s1-retry", 1, tenant="a", max_tokens=8), T0 + 3_600_000).denial
    assert later.reason == "task_failed"


def test_a_client_cancel_reaches_the_worker_running_the_request() -> None:
    core = core_factory(1)
    dispatch = core.route(request_factory("r1"), T0).dispatch
    cancel = CancelRequest(event_time_ms=T0, request_id="r1")
    assert core.cancel(cancel, T0) == [Emit(cancel, dispatch.slot)]
    assert "r1" in core.in_flight  # ended by the worker's Cancelled


def test_a_client_cancel_naming_an_attempt_is_forwarded_as_the_requests_cancel() -> None:
    """An attempt on a cancel marks the router's supersedes and recalls, which a worker reading
    one beside its dispatch takes as "do not start it" without a word: a client's would strand
    the request with no terminal state."""
    core = core_factory(1)
    dispatch = core.route(request_factory("r1"), T0).dispatch
    (emit,) = core.cancel(CancelRequest(event_time_ms=T0, request_id="r1", attempt=1,
                                        reason="user closed the tab"), T0)
    assert emit.slot == dispatch.slot and emit.message.attempt is None
    assert emit.message.reason == "user closed the tab"


@pytest.mark.parametrize("where", ["handed back", "worker silent"])
def test_a_client_cancel_ends_a_request_waiting_for_its_continuation(where: str) -> None:
    core = core_factory(2)
    first = core.route(request_factory("r1"), T0).dispatch
    now = T0 + 100
    if where == "handed back":
        core.observe(Requeued(event_time_ms=now, request_id="r1", worker_id=first.worker_id,
                              attempt=1, tokens_done=5), now)
    else:
        now = T0 + 3_500
        heartbeat(core, now, 1 - first.slot)  # only the other worker still heart-beats
    emits = core.cancel(CancelRequest(event_time_ms=now, request_id="r1", reason="user left"), now)
    ended = [e.message for e in _stream_ended(emits[where == "worker silent":], "abort",
                                              token_offset=5 if where == "handed back" else 0)]
    assert [(m.type, m.request_id, m.reason) for m in ended] == [("cancelled", "r1", "user left")]
    supersedes = [e for e in emits if e.slot is not None]  # a dead worker's slot: not again
    assert len(supersedes) == (where == "worker silent")
    assert "r1" not in core.in_flight and core.resume(now + 1_000) == []


def test_a_cancel_crossing_a_recall_ends_the_request_when_it_comes_back() -> None:
    core = core_factory(2, config=GovernorConfig(retry_budget_ratio=1.0))
    first = core.route(request_factory("r1"), T0).dispatch
    late = core.in_flight["r1"].expected_done_ms + 1
    heartbeat(core, late, 0, 1)
    recall = [e.message for e in core.resume(late) if isinstance(e.message, CancelRequest)]
    assert [m.reason for m in recall] == ["recalled: overdue"]
    cancel = CancelRequest(event_time_ms=late, request_id="r1", reason="user left")
    assert core.cancel(cancel, late) == [Emit(cancel, first.slot)]  # still on its worker
    core.observe(Requeued(event_time_ms=late + 10, request_id="r1", worker_id=first.worker_id,
                          attempt=1, tokens_done=3), late + 10)  # it had handed it back
    emits = _stream_ended(core.resume(late + 20), "abort", token_offset=3)
    assert [(e.message.type, e.message.reason) for e in emits] == [("cancelled", "user left")]
    assert "r1" not in core.in_flight


def test_a_tenant_limit_set_in_the_configuration_replaces_a_commanded_one() -> None:
    one, many = (TenantLimit(requests_per_s=r, tokens_per_s=1e6, burst_s=1) for r in (1, 100))
    config = GovernorConfig(tenants={"a": one})
    core = core_factory(1, config=config)
    core.observe(cmd(commands.SetAdmissionLimits, limits={"a": one, "c": one}), T0)
    core.apply_config(config.model_copy(update={"tenants": {"a": many}}))  # set live for a
    assert [core.route(request_factory(f"a{i}", tenant="a"), T0).dispatch is not None
            for i in range(3)] == [True] * 3
    assert core.route(request_factory("c1", tenant="c"), T0).dispatch is not None
    assert core.route(request_factory("c2", tenant="c"), T0).denial.reason == "rate_limited"


def test_a_configuration_change_older_than_a_command_leaves_the_command_in_force() -> None:
    """As a restarted router meets them: the commands read back first, then the configuration's
    history, whose records may be older than the command."""
    one, many = (TenantLimit(requests_per_s=r, tokens_per_s=1e6, burst_s=1) for r in (1, 100))
    core = core_factory(1)
    core.observe(commands.SetAdmissionLimits(event_time_ms=T0, command_id="c1",
                                             limits={"a": many}), T0)
    core.observe(commands.SetRetryBudget(event_time_ms=T0, command_id="c2", ratio=0.0), T0)
    older = GovernorConfig(tenants={"a": one}, retry_budget_ratio=0.5)

    def change(config: GovernorConfig, key: str, at: int) -> None:  # a record of the topic
        core.apply_config(config, ConfigSet(event_time_ms=at, key=key, value=config.setting(key)))

    change(older, "tenants.a", T0 - 1)
    change(older, "retry_budget_ratio", T0 - 1)
    assert core.admission.limits["a"] == many and core.retry_budget.ratio == 0.0
    change(older.model_copy(update={"tenants": {"a": one, "b": one}}), "tenants.b", T0 + 1)
    assert core.admission.limits["a"] == many  # (a's limit was not set: b's was)
    change(GovernorConfig(tenants={"a": one, "b": one}, retry_budget_ratio=0.3),
           "retry_budget_ratio", T0 + 2)
    assert core.retry_budget.ratio == 0.3  # newer: the configuration's word now
    assert core.admission.limits["a"] == many
    change(GovernorConfig(tenants={"a": one, "b": one}, retry_budget_ratio=0.3), "tenants.a",
           T0 + 3)  # set to the value it had: the configuration's word too
    assert core.admission.limits["a"] == one


def test_a_cancel_for_another_routers_request_is_left_to_that_router() -> None:
    placer, other = core_factory(1), RouterCore(GovernorConfig(), router_id="router-1")
    other.observe(status_factory("w0", 0, at=T0), T0)
    dispatch = placer.route(request_factory("r1"), T0).dispatch
    other.observe(dispatch, T0)
    other.observe(Requeued(event_time_ms=T0 + 10, request_id="r1", worker_id="w0", attempt=1,
                           tokens_done=2), T0 + 10)
    cancel = CancelRequest(event_time_ms=T0 + 20, request_id="r1")
    assert other.cancel(cancel, T0 + 20) == [Emit(cancel, dispatch.slot)]  # not ended here
    assert "r1" in other.in_flight


def test_the_placing_router_ends_a_waiting_request_another_router_forwarded_a_cancel_for() -> None:
    placer, other = core_factory(1), RouterCore(GovernorConfig(), router_id="router-1")
    other.observe(status_factory("w0", 0, at=T0), T0)
    dispatch = placer.route(request_factory("r1"), T0).dispatch
    other.observe(dispatch, T0)
    cancel = CancelRequest(event_time_ms=T0 + 5, request_id="r1", reason="user left")
    # Still running on its worker: the worker reads the forward and stops it.
    assert placer.forwarded_cancel(cancel, dispatch.slot, T0 + 5) == []
    handed_back = Requeued(event_time_ms=T0 + 10, request_id="r1", worker_id="w0", attempt=1,
                           tokens_done=2)
    for core in (placer, other):
        core.observe(handed_back, T0 + 10)
    forward, = other.cancel(cancel, T0 + 20)  # read by the router that did not place it
    assert other.forwarded_cancel(forward.message, forward.slot, T0 + 20) == []  # (it reads its own forward)
    recall = CancelRequest(event_time_ms=T0 + 20, request_id="r1", attempt=1,
                           reason="recalled: overdue")
    assert placer.forwarded_cancel(recall, dispatch.slot, T0 + 20) == []  # the router's own kind: not a client's
    ended = _stream_ended(placer.forwarded_cancel(forward.message, forward.slot, T0 + 20),
                          "abort")
    assert [(e.message.type, e.message.reason, e.slot) for e in ended] == [
        ("cancelled", "user left", None)]
    assert "r1" not in placer.in_flight and placer.resume(T0 + 1_000) == []


def test_a_forwarded_cancel_crossing_a_hand_back_ends_the_request_when_it_comes_back() -> None:
    placer = core_factory(1)
    placer.route(request_factory("r1"), T0)
    cancel = CancelRequest(event_time_ms=T0 + 5, request_id="r1", reason="user left")
    assert placer.forwarded_cancel(cancel, 0, T0 + 5) == []  # running: the worker has it
    placer.observe(Requeued(event_time_ms=T0 + 10, request_id="r1", worker_id="w0", attempt=1,
                            tokens_done=2), T0 + 10)  # handed back before it read the cancel
    emits = _lifecycle(placer.resume(T0 + 20))
    assert [(e.message.type, e.message.reason) for e in emits] == [("cancelled", "user left")]


def test_a_cancel_forwarded_to_a_slot_the_request_left_is_sent_on_to_the_one_running_it() -> None:
    placer = core_factory(2)
    first = placer.route(request_factory("r1"), T0).dispatch
    placer.observe(Requeued(event_time_ms=T0 + 10, request_id="r1", worker_id=first.worker_id,
                            attempt=1, tokens_done=2), T0 + 10)
    heartbeat(placer, T0 + 20, 0, 1)
    again = [e for e in placer.resume(T0 + 20) if isinstance(e.message, Dispatch)]
    assert len(again) == 1 and again[0].slot != first.slot  # continued on the other worker
    # Another router forwarded the client's cancel to the slot it last saw: the first one.
    cancel = CancelRequest(event_time_ms=T0 + 30, request_id="r1", reason="user left")
    assert placer.forwarded_cancel(cancel, first.slot, T0 + 30) == [Emit(cancel, again[0].slot)]
    assert placer.forwarded_cancel(cancel, again[0].slot, T0 + 31) == []  # read back: no loop


def test_a_clients_cancel_survives_a_continuation_read_back_after_it() -> None:
    placer = core_factory(2)
    first = placer.route(request_factory("r1"), T0).dispatch
    cancel = CancelRequest(event_time_ms=T0 + 5, request_id="r1", reason="user left")
    assert placer.forwarded_cancel(cancel, first.slot, T0 + 5) == []
    # A restarted router reads its own continuation after the cancel (another partition).
    continuation = first.model_copy(update={"attempt": 2, "worker_id": "w1", "slot": 1})
    placer.observe(continuation, T0 + 6)
    placer.observe(Requeued(event_time_ms=T0 + 10, request_id="r1", worker_id="w1", attempt=2,
                            tokens_done=3), T0 + 10)
    emits = _lifecycle(placer.resume(T0 + 20))
    assert [(e.message.type, e.message.reason) for e in emits] == [("cancelled", "user left")]


def _orphan_handed_back(*router_ids: str, requests: tuple[str, ...] = ("r1",)
                        ) -> tuple[list[RouterCore], Dispatch]:
    """Routers ``router_ids`` that saw ``requests`` of "router-gone" handed back by w0 (the
    dispatch returned is the first's)."""
    placer = RouterCore(GovernorConfig(), router_id="router-gone")
    placer.observe(status_factory("w0", 0, at=T0), T0)
    dispatches = [placer.route(request_factory(rid), T0).dispatch for rid in requests]
    cores = [RouterCore(GovernorConfig(), router_id=rid) for rid in router_ids]
    for core in cores:
        heartbeat(core, T0, 0, 1)
        for dispatch in dispatches:
            core.observe(dispatch, T0)
            core.observe(Requeued(event_time_ms=T0 + 10, request_id=dispatch.request.request_id,
                                  worker_id="w0", attempt=1, tokens_done=2), T0 + 10)
    return cores, dispatches[0]


def test_one_live_router_resumes_a_gone_routers_request_after_a_minute() -> None:
    cores, _ = _orphan_handed_back("router-a", "router-b")
    members = frozenset({"router-a", "router-b"})
    for core in cores:
        assert core.resume(T0 + 1_000) == []  # the group's members are not known yet
        core.routers_listed(members, T0 + 1_000)
        heartbeat(core, T0 + 60_999, 0, 1)
        assert core.resume(T0 + 60_999) == []  # absent for less than ORPHAN_AFTER_S
        heartbeat(core, T0 + 61_000, 0, 1)
    adopter = cores[0].adopter("r1")
    assert {core.adopter("r1") for core in cores} == {adopter}  # every router agrees
    [other] = [core for core in cores if core.router_id != adopter]
    [mine] = [core for core in cores if core.router_id == adopter]
    assert other.resume(T0 + 61_000) == []  # not the adopter
    [emit] = _superseded(mine.resume(T0 + 61_000), "handed back")
    d = emit.message
    assert isinstance(d, Dispatch) and (d.router_id, d.attempt, d.resume_from_token) == (
        adopter, 2, 2)
    other.observe(d, T0 + 61_000)  # the continuation is the adopter's from now on, for both
    assert mine.resume(T0 + 61_500) == other.resume(T0 + 61_500) == []


def test_a_gone_routers_requests_are_spread_over_the_live_routers() -> None:
    requests = tuple(f"r{i}" for i in range(30))
    cores, _ = _orphan_handed_back("router-a", "router-b", "router-c", requests=requests)
    for core in cores:
        core.routers_listed(frozenset({"router-a", "router-b", "router-c"}), T0 + 1_000)
        heartbeat(core, T0 + 61_000, 0, 1)
    resumed = {}  # router -> the requests it continued or ended (past its retry budget)
    for core in cores:
        emits = [e.message for e in _lifecycle(core.resume(T0 + 61_000))
                 if not isinstance(e.message, CancelRequest)]  # (not the superseded attempts)
        resumed[core.router_id] = [m.request.request_id if isinstance(m, Dispatch)
                                   else m.request_id for m in emits]
    assert sorted(sum(resumed.values(), [])) == sorted(requests)  # each by exactly one
    assert all(len(mine) >= 4 for mine in resumed.values()), resumed  # none takes them all


def test_no_router_takes_a_listed_routers_request_nor_one_while_the_group_rebalances() -> None:
    (adopter,), _ = _orphan_handed_back("router-a")
    adopter.routers_listed(frozenset({"router-a", "router-gone"}), T0 + 1_000)
    heartbeat(adopter, T0 + 120_000, 0, 1)
    assert adopter.resume(T0 + 120_000) == []  # its router is in the group: it resumes it
    adopter.routers_listed(frozenset({"router-a"}), T0 + 1_000)
    adopter.routers_listed(None, T0 + 120_000)  # a rebalance began: members not known
    assert adopter.resume(T0 + 120_000) == []
    cancel = CancelRequest(event_time_ms=T0 + 120_000, request_id="r1", reason="user left")
    assert adopter.cancel(cancel, T0 + 120_000) == [Emit(cancel, 0)]  # left to its router
    adopter.routers_listed(frozenset({"router-a"}), T0 + 1_000)
    [ended] = _stream_ended(adopter.cancel(cancel, T0 + 120_000), "abort")  # adopted: ended
    # here, as its router would
    assert isinstance(ended.message, Cancelled) and "r1" not in adopter.in_flight


def test_an_adopted_request_waiting_for_a_worker_counts_as_its_adopters_continuation() -> None:
    # (the gauge governor_router_continuations_waiting counted the router's own placements
    # only: an orphan it adopted waited up to 600 s unseen)
    cores, _ = _orphan_handed_back("router-a", "router-b")
    for core in cores:
        core.routers_listed(frozenset({"router-a", "router-b"}), T0 + 1_000)
        assert core.resume(T0 + 61_000) == []  # every worker silent: none can take it
    [mine] = [core for core in cores if core.router_id == core.adopter("r1")]
    [other] = [core for core in cores if core is not mine]
    assert mine.in_flight["r1"].dispatch.router_id == "router-gone"
    assert (mine.continuations_waiting(T0 + 61_000), other.continuations_waiting(T0 + 61_000)) \
        == (1, 0)
    mine.routers_listed(frozenset({"router-a", "router-b", "router-gone"}), T0 + 62_000)
    assert mine.continuations_waiting(T0 + 62_000) == 0  # its router is back: it is its own


def test_a_gone_routers_request_read_after_the_group_was_listed_is_resumed() -> None:
    # (a router reading behind read a gone router's last placements after its group's listing:
    # the router was never counted missing, and its requests were left until a rebalance)
    placer = RouterCore(GovernorConfig(), router_id="router-gone")
    placer.observe(status_factory("w0", 0, at=T0), T0)
    dispatch = placer.route(request_factory("r1"), T0).dispatch
    adopter = RouterCore(GovernorConfig(), router_id="router-a")
    heartbeat(adopter, T0, 0, 1)
    adopter.routers_listed(frozenset({"router-a"}), T0 + 1_000)  # before it read the placement
    adopter.observe(dispatch, T0 + 5_000)
    adopter.observe(Requeued(event_time_ms=T0 + 5_000, request_id="r1", worker_id="w0",
                             attempt=1, tokens_done=2), T0 + 5_000)
    heartbeat(adopter, T0 + 64_999, 0, 1)
    assert adopter.resume(T0 + 64_999) == []  # missing for less than ORPHAN_AFTER_S
    heartbeat(adopter, T0 + 65_000, 0, 1)
    [emit] = _superseded(adopter.resume(T0 + 65_000), "handed back")
    assert (emit.message.router_id, emit.message.attempt) == ("router-a", 2)


def test_rebalances_do_not_start_a_missing_routers_time_again() -> None:
    (adopter,), _ = _orphan_handed_back("router-a")
    adopter.routers_listed(frozenset({"router-a"}), T0 + 1_000)
    for at in (T0 + 20_000, T0 + 40_000, T0 + 60_000):  # routers come and go meanwhile
        adopter.routers_listed(None, at)
        adopter.routers_listed(frozenset({"router-a", f"router-z{at}"}), at + 500)
    adopter.routers_listed(frozenset({"router-a"}), T0 + 60_500)  # (the last one left again)
    heartbeat(adopter, T0 + 61_000, 0, 1)
    [emit] = _superseded(adopter.resume(T0 + 61_000), "handed back")  # missing since T0 + 1 s
    assert emit.message.router_id == "router-a"


@pytest.mark.parametrize("policy", ["governor", "round_robin"])
def test_a_request_created_far_from_the_routers_clock_is_refused_as_invalid(policy) -> None:
    """TTFT and latency are measured from ``created_ms``: a client clock a day behind would
    count a served request as a day late, one ahead as answered at once."""
    core = RouterCore(GovernorConfig(routing_policy=policy))
    core.observe(status_factory(), T0)
    ahead = core.route(request_factory("ahead", created_ms=T0 + 11_000), T0)
    behind = core.route(request_factory("behind", created_ms=T0 - 86_400_001), T0)
    assert (ahead.denial.reason, behind.denial.reason) == ("invalid_request", "invalid_request")
    assert ahead.denial.detail == "created_ms is 11.0s ahead of the router's clock (at most 10s)"
    assert behind.denial.detail == ("created_ms is 86400s before the router's clock (at most "
                                    "86,400s)")
    assert core.route(request_factory("ok", created_ms=T0 + 9_000), T0).dispatch is not None
    assert core.route(request_factory("old", created_ms=T0 - 86_000_000), T0).dispatch is not None


def test_a_router_reading_behind_resumes_nothing_it_may_not_have_heard_the_end_of() -> None:
    """Its follower has read everything only until some seconds ago: a worker whose heartbeats
    it has not read yet is not silent, and a recall is not unanswered, until it has read that
    far (else it would continue, or itself complete, requests that ended meanwhile)."""
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    core.observe(chunk("r1", 0, 5), T0 + 100)
    heartbeat(core, T0 + 3_500, 1)
    core.fleet.heard_until_ms = T0 + 2_000  # read behind: w0's later heartbeats not read yet
    assert core.resume(T0 + 3_500) == []
    assert [w.worker_id for w in core.fleet.live(T0 + 3_500)] == ["w0", "w1"]
    core.fleet.heard_until_ms = T0 + 3_500  # read up to now: w0 is silent
    [emit] = _superseded(core.resume(T0 + 3_500), "its worker went silent")
    assert (emit.message.worker_id, emit.message.resume_from_token) == ("w1", 5)


# --- the workers' context (max_model_len) ----------------------------------------------------------

def test_a_request_goes_only_to_workers_whose_context_holds_it() -> None:
    """An engine refuses a prompt and output past its ``max_model_len`` outright (an HTTP 400
    from vLLM, the request failed, not retried): governor places it where it fits."""
    core = RouterCore()
    core.observe(status_factory("short", 0, max_model_len=8_192), T0)
    core.observe(status_factory("long", 1, max_model_len=32_768), T0)
    core.observe(status_factory("unknown", 2), T0)  # (an engine that does not say: any)
    placed = {worker_of(core.route(request_factory(f"r{n}", prompt_tokens=8_000, max_tokens=193),
                                   T0)) for n in range(6)}
    assert placed == {"long", "unknown"}
    assert worker_of(core.route(request_factory("exact", prompt_tokens=8_000, max_tokens=192),
                                T0)) in ("short", "long", "unknown")


def test_a_request_past_every_live_workers_context_is_refused_at_once_and_fails_its_task() -> None:
    core = RouterCore()
    core.observe(status_factory("short", 0, max_model_len=8_192), T0)
    core.observe(status_factory("long", 1, max_model_len=32_768), T0)
    decision = core.route(_step("s1", 1, prompt_tokens=32_000, max_tokens=1_000), T0)
    assert decision.dispatch is None and not decision.waits
    assert decision.denial == Denial(
        "invalid_request", f"32000 prompt and 1000 output tokens (33000) exceed the context of "
                           f"every live worker of {MODEL} (the longest: 32768 tokens)")
    assert core.route(_step("s2", 2), T0).denial.reason == "task_failed"
    assert core.in_flight == {}
    # the baselines place it as their authors do, blind to the context
    baseline = RouterCore(GovernorConfig(routing_policy="round_robin"))
    baseline.observe(status_factory("short", 0, max_model_len=8_192), T0)
    assert worker_of(baseline.route(request_factory(prompt_tokens=32_000), T0)) == "short"


def test_a_gone_routers_request_still_running_counts_in_its_adopters_in_flight() -> None:
    # (the gauge governor_router_in_flight counted the router's own placements only: a request
    # of a router gone, running on a live worker, was in no router's count, though the adopter
    # answers for it: it ends it, or continues it if its worker is lost)
    placer = RouterCore(GovernorConfig(), router_id="router-gone")
    placer.observe(status_factory("w0", 0, at=T0), T0)
    dispatch = placer.route(request_factory("r1"), T0).dispatch
    cores = [RouterCore(GovernorConfig(), router_id=rid) for rid in ("router-a", "router-b")]
    for core in cores:
        core.observe(dispatch, T0)
        core.routers_listed(frozenset({"router-a", "router-b"}), T0 + 1_000)
        heartbeat(core, T0 + 61_000, 0, 1)
    assert [core.answerable(T0 + 30_000) for core in cores] == [0, 0]  # (gone a while only)
    assert sorted(core.answerable(T0 + 61_000) for core in cores) == [0, 1]
    assert placer.answerable(T0 + 61_000) == 1  # (its own)


def test_a_continuation_keeps_the_stream_partition_of_the_first_attempt() -> None:
    """Its chunks go on the partition of the chunks before (``Dispatch.stream_partition``),
    whatever partitions were added to its topic since the request was placed."""
    core = core_factory(2)
    first = core.route(request_factory("r1", max_tokens=64), T0, stream_partition=3).dispatch
    core.observe(Requeued(event_time_ms=T0 + 1, request_id="r1", worker_id=first.worker_id,
                          attempt=1, tokens_done=5), T0 + 1)
    (continued,) = [e.message for e in core.resume(T0 + 10) if isinstance(e.message, Dispatch)]
    assert (first.stream_partition, continued.attempt, continued.stream_partition) == (3, 2, 3)
    assert continued.worker_id != first.worker_id


@pytest.mark.parametrize("lost", ["worker silent", "handed back"])
def test_a_lost_request_with_every_token_and_no_final_chunk_has_its_stream_ended(
        lost: str) -> None:
    """Every token streamed, the final chunk not (the vLLM adapter ends a request at the usage
    and ``[DONE]`` after its last token: its worker died, or handed it back stopping, in
    between): the router completes it, and ends its stream. Before, it published the
    Completed alone, and a client reading its stream waited for ever."""
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=8)
    core.observe(chunk("r1", 0, 8), T0)
    if lost == "handed back":
        core.observe(Requeued(event_time_ms=T0, request_id="r1", worker_id="w0", attempt=1,
                              tokens_done=8), T0)
    heartbeat(core, T0 + 5_000, *((0, 1) if lost == "handed back" else (1,)))
    why = "its worker went silent" if lost == "worker silent" else "handed back"
    [emit] = _stream_ended(_superseded(core.resume(T0 + 5_000), why), "length",
                           token_offset=8)
    assert isinstance(emit.message, Completed) and emit.message.finish_reason == "length"


@pytest.mark.parametrize("late", ["started", "requeued"])
def test_an_earlier_attempts_late_event_leaves_its_continuation_pending_on_its_worker(
        late: str) -> None:
    """The first attempt's worker, silent, continued elsewhere: its Started (read late, or sent
    again by the worker started again on its slot) or its hand-back (it read the supersede) says
    nothing of the continuation, which stays pending on its own worker until that worker's
    heartbeat counts it. Before, either took it for reported there: the next requests were
    placed as if the worker did not have it yet."""
    core = core_factory(2)
    _in_flight_on_w0(core, max_tokens=64)
    heartbeat(core, T0 + 5_000, 1)
    (cont,) = _superseded(core.resume(T0 + 5_000), "its worker went silent")
    assert cont.message.worker_id == "w1" and core.ledger.requests("w1") == 1
    event = Started(event_time_ms=T0 + 4_000, request_id="r1", worker_id="w0", attempt=1) \
        if late == "started" else Requeued(event_time_ms=T0 + 5_001, request_id="r1",
                                           worker_id="w0", attempt=1, tokens_done=0)
    core.observe(event, T0 + 5_001)
    heartbeat(core, T0 + 5_002, 1)  # (before its Started of the continuation)
    assert core.ledger.requests("w1") == 1
