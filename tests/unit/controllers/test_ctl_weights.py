"""Routing weights follow success per dollar, penalised for latency over the SLO."""

import pytest

from controllers.weights import RoutingWeights
from schemas.events import SignalSnapshot

T = 1_800_000_000_000


def snap(pool: str, **values: float) -> SignalSnapshot:
    return SignalSnapshot(event_time_ms=T, scope="pool", key=pool, window_s=60, window_end_ms=T,
                          values=values)


@pytest.mark.parametrize(("a", "b", "expected"), [
    (dict(success_per_dollar=100, ttft_p99_s=1.0), dict(success_per_dollar=50, ttft_p99_s=1.0), (1.0, 0.5)),
    (dict(success_per_dollar=100, ttft_p99_s=4.5), dict(success_per_dollar=50, ttft_p99_s=1.0), (0.25, 0.5)),
    (dict(success_per_dollar=100), dict(ttft_p99_s=1.0), (1.0, 1.0)),
    # measured at 0 is not "no signal": the least weight, a probe's share
    (dict(success_per_dollar=100, ttft_p99_s=1.0), dict(success_per_dollar=0, ttft_p99_s=30.0),
     (1.0, 0.05)),
    (dict(success_per_dollar=0), dict(success_per_dollar=0), (1.0, 1.0)),  # nobody succeeds
    # measured at 0 beside a pool not measured yet: that one may succeed (both 1 before 7 Dec)
    (dict(success_per_dollar=0), dict(ttft_p99_s=1.0), (0.05, 1.0)),
    # a p99 thousands of times the SLO (a pool stuck for minutes) weighs a probe's share
    (dict(success_per_dollar=100, ttft_p99_s=1.0), dict(success_per_dollar=100, ttft_p99_s=6000.0),
     (1.0, 0.05)),
])
def test_weights(a, b, expected):
    w = RoutingWeights(ttft_slo_s=2.0)
    w.observe_pool("a", T)
    w.observe_pool("b", T)
    w.observe(snap("a", **a))
    w.observe(snap("b", **b))
    cmd = w.tick(T)
    assert (cmd.weights["a"], cmd.weights["b"]) == expected
    assert cmd.reason


def test_no_pools_no_command_and_unknown_pools_weigh_one():
    w = RoutingWeights()
    assert w.tick(T) is None
    w.observe_pool("h100@llama-3-8b", T)
    assert w.tick(T).weights == {"h100@llama-3-8b": 1.0}


def test_a_pool_whose_workers_went_quiet_is_forgotten_with_its_signals():
    """After 300 s (``FORGET_MS``), as the controllers forget a worker, or after the time they
    are given (the heartbeat timeout, where longer)."""
    w = RoutingWeights()
    for pool, spd in (("old", 100), ("new", 25)):
        w.observe_pool(pool, T)
        w.observe(snap(pool, success_per_dollar=spd, ttft_p99_s=1.0))
    assert w.tick(T).weights == {"old": 1.0, "new": 0.25}
    w.observe_pool("new", T + 200_000)  # no worker of "old" heard from again
    w.observe(snap("old", success_per_dollar=100, ttft_p99_s=1.0))  # the app publishes it still
    assert w.tick(T + 300_000).weights == {"old": 1.0, "new": 0.25}
    assert w.tick(T + 300_001, forget_after_ms=400_000).weights == {"old": 1.0, "new": 0.25}
    assert w.tick(T + 300_001).weights == {"new": 1.0}  # the best pool now: its own measure
    w.observe_pool("old", T + 300_002)  # back (scaled out again): unknown, not its old 100
    assert w.tick(T + 300_002).weights == {"new": 1.0, "old": 1.0}
    assert w.tick(T + 600_003) is None  # no worker heard from for 300 s


def test_a_pool_only_measured_gets_no_weight():
    w = RoutingWeights()
    w.observe(snap("gone", success_per_dollar=100))
    w.observe_pool("live", T)
    assert w.tick(T).weights == {"live": 1.0}


def test_a_restarted_process_keeps_the_weights_read_back_until_a_pool_is_measured() -> None:
    """Its first tick, before any pool signal, commanded equal weights: a pool its predecessor
    had cut to a probe's share got a full share until the signals came. A pool keeps the
    weight read back (``continue_from``) until its own signal, and one new to it weighs 1."""
    from schemas.commands import SetRoutingWeights

    w = RoutingWeights()
    w.continue_from(SetRoutingWeights(event_time_ms=T - 1_000, command_id="w",
                                      issued_by="routing-weights", reason="r",
                                      weights={"fast": 1.0, "slow": 0.05}))
    for pool in ("fast", "slow", "new"):
        w.observe_pool(pool, T)
    assert w.tick(T).weights == {"fast": 1.0, "new": 1.0, "slow": 0.05}
    w.observe(snap("fast", success_per_dollar=100))
    w.observe(snap("slow", success_per_dollar=50))
    assert w.tick(T + 500).weights == {"fast": 1.0, "new": 1.0, "slow": 0.5}
