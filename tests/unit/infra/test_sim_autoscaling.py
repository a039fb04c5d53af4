"""The autoscaler in the simulator under light traffic: a model with requests arriving keeps a
worker, and a request accepted just before a pool drains to zero is still served. In virtual
time, without a broker."""

import random

from infra.sim import SimOptions, simulate
from infra.traces import TraceRequest
from schemas.config import GovernorConfig


def _autoscaled(max_replicas: int, **settings: float) -> GovernorConfig:
    config = GovernorConfig().with_setting("autoscaler.enabled", True)
    config = config.with_setting("autoscaler.max_replicas", max_replicas)
    for key, value in settings.items():
        config = config.with_setting(f"autoscaler.{key}", value)
    return config


def test_light_traffic_keeps_one_worker_and_serves_every_request() -> None:
    # a request every 20 s on average for 20 minutes, each over within a heartbeat or two
    rng, t, trace = random.Random(0), 0.0, []
    while t < 1_200:
        t += rng.expovariate(1 / 20)
        trace.append(TraceRequest(round(t, 3), rng.choice([200, 1_000, 3_000]),
                                  rng.choice([8, 50, 200])))
    report, _ = simulate(trace, SimOptions(policy="governor", fleet="h100:2",
                                           config=_autoscaled(2)))
    assert report["completed"] == len(trace) and report["slo_attainment"] == 1.0
    serving = [s for _, _, s in report["fleet_timeline"]]
    assert min(serving) == 1 and serving[-1] == 1  # one worker less, never none


def test_a_request_accepted_as_its_pool_goes_to_zero_is_served() -> None:
    # idle for a minute (the second request is accepted 1 ms before the tick that would find the
    # model idle for idle_to_zero_s): the accepted request keeps the model from idling to zero
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(60.999, 100, 10)]
    report, _ = simulate(trace, SimOptions(policy="governor", fleet="h100:1", drain_limit_s=600,
                                           config=_autoscaled(1, idle_to_zero_s=60)))
    assert report["unfinished"] == 0 and report["completed"] == 2
    assert report["simulated_s"] < 70


def test_a_model_idle_after_its_requests_ended_goes_to_zero_and_says_why_a_request_waits() -> None:
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(200.0, 100, 10)]
    report, _ = simulate(trace, SimOptions(policy="governor", fleet="h100:1", drain_limit_s=600,
                                           config=_autoscaled(1, idle_to_zero_s=60)))
    # to zero a minute after the first request ended (its end seen: nothing open)
    assert [[t, p, s] for t, p, s in report["fleet_timeline"] if t < 200] == [
        [0.0, 1, 1], [61.0, 1, 0], [61.0, 0, 0]]
    # the second waited for a worker past its deadline: no_capacity, which wakes a pool
    assert report["rejected_by_reason"] == {"no_capacity": 1}



def test_a_request_for_a_model_at_zero_wakes_its_pool_as_it_begins_to_wait() -> None:
    # As the router says it live: the pool loads (about 28 s) while the request waits, and with
    # a TTFT target that allows the wait the request is served (before 5 Dec the pool woke only
    # on the refusal that ended the wait, 30 s on, and the request was refused)
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(200.0, 100, 10)]
    config = _autoscaled(1, idle_to_zero_s=60).with_setting("slo.ttft_slo_s", 45.0)
    report, _ = simulate(trace, SimOptions(policy="governor", fleet="h100:1", drain_limit_s=600,
                                           config=config))
    assert [t for t, pool, _ in report["fleet_timeline"] if t >= 200 and pool == 1][0] == 200.0
    assert report["completed"] == 2 and report["rejected"] == 0
    assert 25 < report["ttft_p99_s"] < 30  # its model's load


def test_requests_held_for_a_waking_pool_are_routed_in_the_order_they_came() -> None:
    """As the live router: a request that comes while its model's requests are held waits
    behind them, not routed past them when a worker comes."""
    from infra.sim.driver import Simulation

    trace = [TraceRequest(0.0, 100, 10), TraceRequest(200.0, 4_000, 10),
             TraceRequest(200.5, 100, 10)]
    config = _autoscaled(1, idle_to_zero_s=60).with_setting("slo.ttft_slo_s", 45.0)
    sim = Simulation(trace, SimOptions(policy="governor", fleet="h100:1", drain_limit_s=600,
                                       config=config))
    routed, route = [], sim._route

    def recording(request, now_ms):
        decision = route(request, now_ms)
        routed.append((request.request_id, decision.dispatch is not None))
        return decision

    sim._route = recording
    sim.run()
    assert sim.outcomes.state == ["completed"] * 3
    later = routed[1:]
    assert later[0] == ("r1", False) and later[-2:] == [("r1", True), ("r2", True)]
    assert ("r2", False) not in later  # never routed while r1 still waited
