"""Tests of controllers.router.admission: token buckets, shedding by value, expired deadlines."""

from __future__ import annotations

import pytest

from controllers.router.admission import SHED_BUDGET_SHARE, Admission, TokenBucket, request_value
from router_factories import T0, request_factory
from schemas.commands import TenantLimit

# --- the token bucket ----------------------------------------------------------------------------


def test_a_new_bucket_is_full() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=4.0, now_s=10.0)
    assert bucket.wait_s(4.0, 10.0) == 0.0
    assert bucket.wait_s(4.5, 10.0) == float("inf")  # more than it can ever hold


@pytest.mark.parametrize(
    ("taken", "amount", "now_s", "wait_s"),
    [
        # rate 2/s, burst 4, created at t=0
        (4, 1, 0.0, 0.5),  # empty: (1 - 0) / 2
        (4, 1, 0.25, 0.25),  # refilled 0.5: (1 - 0.5) / 2
        (4, 1, 0.5, 0.0),
        (4, 4, 1.0, 1.0),  # refilled 2: (4 - 2) / 2
        (3, 2, 0.0, 0.5),  # level 1: (2 - 1) / 2
        (4, 4, 100.0, 0.0),  # refill caps at the burst
    ],
)
def test_bucket_wait_math(taken: float, amount: float, now_s: float, wait_s: float) -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=4.0, now_s=0.0)
    bucket.take(taken)
    assert bucket.wait_s(amount, now_s) == pytest.approx(wait_s)


def test_refill_never_exceeds_the_burst() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=4.0, now_s=0.0)
    bucket.take(1)
    bucket.wait_s(1, 1_000.0)
    assert bucket.level == 4.0


def test_wait_takes_nothing_and_time_going_back_refills_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=2.0, now_s=5.0)
    bucket.take(2)
    assert bucket.wait_s(1, 4.0) == pytest.approx(1.0)  # an earlier clock reading: still empty
    assert bucket.wait_s(1, 5.5) == pytest.approx(0.5)
    assert bucket.wait_s(1, 5.5) == pytest.approx(0.5)  # asking twice takes nothing


# --- rate limits per tenant ----------------------------------------------------------------------

def _at(ms: int) -> int:
    return T0 + ms


def test_tenant_over_its_requests_per_second() -> None:
    # 2 requests/s with a 1 s burst: 2 requests at once, the third waits (1 - 0) / 2 = 0.5 s
    admission = Admission({"a": TenantLimit(requests_per_s=2, tokens_per_s=1e6, burst_s=1)})
    req = request_factory(tenant="a")
    assert admission.admit(req, _at(0)) is None
    assert admission.admit(req, _at(0)) is None
    denial = admission.admit(req, _at(0))
    assert denial is not None and denial.reason == "rate_limited"
    assert denial.retry_after_s == 0.5
    assert "requests/s" in denial.detail and "a" in denial.detail
    # 100 ms later 0.2 has come back: (1 - 0.2) / 2 = 0.4 s
    assert admission.admit(req, _at(100)).retry_after_s == pytest.approx(0.4)
    assert admission.admit(req, _at(500)) is None  # exactly when it said


def test_tenant_over_its_tokens_per_second() -> None:
    # 100 tokens/s with a 2 s burst = 200; each request costs 100 prompt + 20 output = 120
    admission = Admission({"b": TenantLimit(requests_per_s=1000, tokens_per_s=100, burst_s=2)})
    req = request_factory(tenant="b", prompt_tokens=100, max_tokens=20)
    assert admission.admit(req, _at(0)) is None  # 200 - 120 = 80 left
    denial = admission.admit(req, _at(0))
    assert denial is not None and denial.reason == "rate_limited"
    assert denial.retry_after_s == round((120 - 80) / 100, 3)
    assert "tokens/s" in denial.detail
    later = admission.admit(req, _at(250))  # 80 + 25 = 105: (120 - 105) / 100
    assert later is not None and later.retry_after_s == pytest.approx(0.15)
    assert admission.admit(req, _at(400)) is None


def test_a_denied_request_takes_nothing_from_the_buckets() -> None:
    admission = Admission({"a": TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)})
    req = request_factory(tenant="a")
    assert admission.admit(req, _at(0)) is None
    for ms in (0, 100, 200, 900, 999):
        assert admission.admit(req, _at(ms)) is not None
    assert admission.admit(req, _at(1_000)) is None


def test_refund_gives_back_what_admit_took() -> None:
    # 2 requests of burst; 300 tokens of burst, each request costs 100 + 50
    admission = Admission({"a": TenantLimit(requests_per_s=1, tokens_per_s=150, burst_s=2)})
    req = request_factory(tenant="a", prompt_tokens=100, max_tokens=50)
    assert admission.admit(req, _at(0)) is None
    assert admission.admit(req, _at(0)) is None
    assert admission.admit(req, _at(0)) is not None
    admission.refund(req)
    assert admission.admit(req, _at(0)) is None
    admission.refund(req)
    admission.refund(req)
    admission.refund(req)  # more refunds than takes: capped at the burst
    assert [admission.admit(req, _at(0)) is None for _ in range(3)] == [True, True, False]
    Admission().refund(req)  # an unlimited tenant: nothing to give back


def test_tenants_have_their_own_buckets_and_unknown_tenants_are_unlimited() -> None:
    admission = Admission({"a": TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)})
    assert admission.admit(request_factory(tenant="a"), _at(0)) is None
    assert admission.admit(request_factory(tenant="a"), _at(0)) is not None
    assert all(admission.admit(request_factory(tenant="other", prompt_tokens=100_000), _at(0))
               is None for _ in range(1_000))


def test_setting_the_same_limits_keeps_the_buckets_new_limits_reset_them() -> None:
    limit = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    admission = Admission({"a": limit})
    req = request_factory(tenant="a")
    assert admission.admit(req, _at(0)) is None
    admission.set_limits({"a": limit})  # a level-triggered controller re-sends the same limits
    assert admission.admit(req, _at(0)) is not None
    admission.set_limits({"a": TenantLimit(requests_per_s=2, tokens_per_s=1e6, burst_s=1)})
    assert admission.admit(req, _at(0)) is None
    admission.set_limits({})
    assert all(admission.admit(req, _at(0)) is None for _ in range(10))


# --- value and shedding --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("fields", "value"),
    [
        ({}, 0.0),
        ({"priority": 9}, 0.5),
        ({"priority": 3}, 0.5 * 3 / 9),
        ({"task_id": "t", "step": 1, "steps_total": 5}, 0.0),
        ({"task_id": "t", "step": 4, "steps_total": 5}, 0.4 * 3 / 4),
        ({"task_id": "t", "step": 5, "steps_total": 5}, 0.4),
        ({"deadline_ms": T0 + 10_000}, 0.1),
        ({"priority": 9, "task_id": "t", "step": 5, "steps_total": 5, "deadline_ms": T0 + 1},
         1.0),
    ],
)
def test_request_value(fields: dict, value: float) -> None:
    assert request_value(request_factory(**fields)) == pytest.approx(value)


@pytest.mark.parametrize(
    ("higher", "lower"),
    [
        ({"priority": 9}, {"priority": 0}),
        ({"task_id": "t", "step": 4, "steps_total": 5},
         {"task_id": "t", "step": 1, "steps_total": 5}),
        ({"deadline_ms": T0 + 5_000}, {}),
        ({"priority": 5, "deadline_ms": T0 + 5_000}, {"priority": 5}),
    ],
)
def test_request_value_ordering(higher: dict, lower: dict) -> None:
    assert request_value(request_factory(**higher)) > request_value(request_factory(**lower))


@pytest.mark.parametrize(
    ("shed_below", "fields", "shed"),
    [
        (0.0, {}, False),  # 0 sheds nothing
        (0.3, {}, True),
        (0.3, {"priority": 9}, False),  # 0.5
        (0.5, {"priority": 9}, False),  # not below
        (0.51, {"priority": 9}, True),
        (0.3, {"task_id": "t", "step": 5, "steps_total": 5}, False),  # 0.4: near its end, kept
        (0.3, {"task_id": "t", "step": 2, "steps_total": 5}, True),  # 0.1
    ],
)
def test_load_shedding_by_value(shed_below: float, fields: dict, shed: bool) -> None:
    admission = Admission()
    admission.shed_below = shed_below
    request = request_factory(**fields)
    assert admission.admit(request, _at(0)) is None  # the placer decides (its shed filter)
    share = admission.shed_share(request)
    assert (share is not None) == shed
    if shed:  # falling with the value under the level
        ratio = request_value(request) / shed_below
        assert share == pytest.approx(SHED_BUDGET_SHARE * ratio ** 0.5)
        assert share < SHED_BUDGET_SHARE
        denial = admission.shed_denial(request, 1.5, share, 2.0)
        assert denial.reason == "load_shed" and denial.retry_after_s > 0
        # (three significant figures: values of 0.004 read "0.00 is below 0.00" before 5 Dec)
        assert denial.detail == (
            f"value {request_value(request):.3g} is below the shedding level {shed_below:.3g} "
            f"of {request.model}, and its best predicted TTFT 1.5s exceeds {share * 2:.3g}s, the "
            f"{share:.2g} of its 2s budget a request so far below the level may take")


@pytest.mark.parametrize("late_ms", [0, 1, 60_000])
def test_an_expired_deadline_is_unreachable(late_ms: int) -> None:
    admission = Admission({"a": TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)})
    req = request_factory(tenant="a", deadline_ms=T0 + 1_000)
    denial = admission.admit(req, T0 + 1_000 + late_ms)
    assert denial is not None and denial.reason == "deadline_unreachable"
    # the rejected request took nothing: the tenant's one-request burst is still there
    assert admission.admit(request_factory(tenant="a"), T0 + 1_000 + late_ms) is None


def test_a_deadline_in_the_future_is_admitted() -> None:
    assert Admission().admit(request_factory(deadline_ms=T0 + 1_000), T0 + 999) is None


def test_a_retry_at_the_hint_is_admitted() -> None:
    # 3 requests/s, 1 s burst: the fourth at once waits 1/3 s, told 0.334 (rounded up)
    admission = Admission({"a": TenantLimit(requests_per_s=3, tokens_per_s=1e6, burst_s=1)})
    req = request_factory(tenant="a")
    for _ in range(3):
        assert admission.admit(req, _at(0)) is None
    hint = admission.admit(req, _at(0)).retry_after_s
    assert hint == 0.334
    assert admission.admit(req, _at(round(hint * 1000))) is None


@pytest.mark.parametrize(("requests_per_s", "hint_s"), [(1 / 7_200, 7_200.0),
                                                       (1 / 200_000, 86_400.0)])
def test_a_tenant_limited_below_one_request_an_hour_is_told_when_it_gets_in(
        requests_per_s: float, hint_s: float) -> None:
    """One request every two hours: a retry at the hint, two hours on, gets in. Before 7 Dec
    the hint was capped at an hour, and a retry at it was refused again. It is capped at a day
    (``MAX_LATENCY_S``, the most a ``Rejected`` carries)."""
    from schemas.events import Rejected

    limit = TenantLimit(requests_per_s=requests_per_s, tokens_per_s=1e6)
    admission = Admission({"rare": limit})
    req = request_factory(tenant="rare")
    assert admission.admit(req, _at(0)) is None
    denial = admission.admit(req, _at(0))
    assert denial.retry_after_s == hint_s
    Rejected(event_time_ms=T0, request_id="r", reason=denial.reason,
             retry_after_s=denial.retry_after_s)  # (within what the event carries)
    assert (admission.admit(req, _at(round(hint_s * 1000))) is None) == (hint_s == 7_200.0)


def test_a_tenant_whose_burst_is_under_one_request_may_still_send_one() -> None:
    admission = Admission({"slow": TenantLimit(requests_per_s=0.2, tokens_per_s=1e6, burst_s=2)})
    req = request_factory(tenant="slow")
    assert admission.admit(req, _at(0)) is None
    assert admission.admit(req, _at(0)).retry_after_s == 5.0  # then one per 5 s
    assert admission.admit(req, _at(5_000)) is None


def test_changing_one_tenants_limit_leaves_the_others_buckets_as_they_are() -> None:
    one = TenantLimit(requests_per_s=1, tokens_per_s=1e6, burst_s=1)
    admission = Admission({"a": one, "b": one})
    assert admission.admit(request_factory(tenant="a"), _at(0)) is None
    assert admission.admit(request_factory(tenant="b"), _at(0)) is None
    admission.set_limits({"a": one, "b": TenantLimit(requests_per_s=5, tokens_per_s=1e6)})
    assert admission.admit(request_factory(tenant="a"), _at(0)).reason == "rate_limited"
    assert admission.admit(request_factory(tenant="b"), _at(0)) is None  # a new, full bucket


# --- a router's share of the tenants' limits (several routers in one group) ----------------------


def _admitted(admission: Admission, tenant: str, count: int, at_ms: int, **fields) -> int:
    return sum(admission.admit(request_factory(tenant=tenant, **fields), at_ms) is None
               for _ in range(count))


def test_a_router_reading_half_the_requests_admits_half_the_tenants_rate() -> None:
    # 4 requests/s, 1 s burst: two routers, each with half the partitions, 2 + 2 at once and
    # 2 + 2 a second later; before, each admitted the tenant's whole rate (8 at once, twice it)
    limits = {"a": TenantLimit(requests_per_s=4, tokens_per_s=1e6, burst_s=1)}
    routers = [Admission(limits), Admission(limits)]
    for router in routers:
        router.set_share(0.5, _at(0))
    assert sum(_admitted(router, "a", 10, _at(0)) for router in routers) == 4
    assert sum(_admitted(router, "a", 10, _at(1000)) for router in routers) == 4
    alone = Admission(limits)  # one router reads every request: the whole rate
    assert _admitted(alone, "a", 10, _at(0)) == 4


def test_a_new_share_rescales_the_buckets_as_full_as_they_were() -> None:
    admission = Admission({"a": TenantLimit(requests_per_s=4, tokens_per_s=1e6, burst_s=1)})
    assert _admitted(admission, "a", 2, _at(0)) == 2  # half of the burst of 4 left
    admission.set_share(0.5, _at(0))  # a router joined: a burst of 2, half full
    assert _admitted(admission, "a", 10, _at(0)) == 1
    denial = admission.admit(request_factory(tenant="a"), _at(0))
    assert denial.reason == "rate_limited" and denial.retry_after_s == 0.5  # 1 / (4 x 0.5)
    # the other left: 0.5 s refilled 1 of 2, half full, now half of the whole burst of 4
    admission.set_share(1.0, _at(500))
    assert _admitted(admission, "a", 10, _at(500)) == 2


def test_a_request_within_the_tenants_token_burst_passes_a_routers_smaller_share() -> None:
    # 100 tokens/s, 2 s burst = 200; a router with a quarter of the partitions holds 50, and a
    # request of 120 tokens, which the tenant may send, is admitted once its bucket is full
    admission = Admission({"b": TenantLimit(requests_per_s=1000, tokens_per_s=100, burst_s=2)})
    admission.set_share(0.25, _at(0))
    big = dict(prompt_tokens=100, max_tokens=20)
    assert _admitted(admission, "b", 1, _at(0), **big) == 1  # in debt: 50 - 120 = -70
    denial = admission.admit(request_factory(tenant="b", **big), _at(0))
    assert denial.reason == "rate_limited" and denial.retry_after_s == pytest.approx(4.8)
    assert _admitted(admission, "b", 1, _at(4900), **big) == 1  # full again: 25 tokens/s
    never = admission.admit(request_factory(tenant="b", prompt_tokens=190, max_tokens=20),
                            _at(10_000))
    assert never.reason == "rate_limited" and never.retry_after_s is None  # over 200: never
