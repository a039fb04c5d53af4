"""Autoscaler: scale out at once, in slowly, to zero when idle, woken on demand, cheapest first."""

import math
import re

import pytest

from controllers.autoscaler import Autoscaler
from controllers.router.fleet import FleetView
from schemas.commands import ScalePool
from schemas.config import AutoscalerConfig, ModelShape
from schemas.events import WorkerStatus
from workers.sim import models

T = 1_800_000_000_000


def fleet_with(now: int, running: dict[str, int], gpu: str = "h100") -> FleetView:
    fleet = FleetView()
    for i, (wid, n) in enumerate(running.items()):
        fleet.observe(WorkerStatus(event_time_ms=now, worker_id=wid, slot=i, pool=f"{gpu}@llama-3-8b",
                                   gpu_type=gpu, models_loaded=["llama-3-8b"], running=n,
                                   started_ms=now))
    return fleet


def scaler(**cfg) -> Autoscaler:
    a = Autoscaler(AutoscalerConfig(enabled=True, **cfg), prices={"h100": 3.0, "a100": 1.8})
    a.add_pool("h100", "llama-3-8b", 1)
    return a


def test_capacity_is_the_batch_that_meets_the_latency_target_times_utilisation():
    a = scaler(target_utilisation=0.5)
    cap = a.capacity("h100", "llama-3-8b")
    assert cap > 0 and cap == pytest.approx(0.5 * round(cap / 0.5))


def test_scales_out_at_once_to_cover_demand():
    a = scaler()
    cap = a.capacity("h100", "llama-3-8b")
    demand = int(cap * 3.5)
    (cmd,) = a.tick(T, fleet_with(T, {"w0": demand}))
    assert cmd.replicas == math.ceil(demand / cap) == 4
    assert "scaled out" in cmd.reason and cmd.pool == "h100@llama-3-8b"


def test_scales_in_one_at_a_time_after_the_window():
    a = scaler(scale_in_window_s=60)
    a.pools["h100@llama-3-8b"].replicas = 4
    a.pools["h100@llama-3-8b"].known = True
    quiet = fleet_with(T, {"w0": 1})
    assert a.tick(T, quiet)[0].replicas == 4
    assert a.tick(T + 59_000, fleet_with(T + 59_000, {"w0": 1}))[0].replicas == 4
    assert a.tick(T + 60_000, fleet_with(T + 60_000, {"w0": 1}))[0].replicas == 3
    assert a.tick(T + 61_000, fleet_with(T + 61_000, {"w0": 1}))[0].replicas == 3


def test_idle_model_scales_to_zero_and_a_held_request_wakes_it():
    a = scaler(idle_to_zero_s=300, scale_in_window_s=10_000)
    idle = lambda t: fleet_with(t, {"w0": 0})  # noqa: E731
    a.tick(T, idle(T))
    assert a.tick(T + 299_000, idle(T + 299_000))[0].replicas == 1
    assert a.tick(T + 301_000, idle(T + 301_000))[0].replicas == 0
    woken = a.tick(T + 302_000, FleetView(), held={"llama-3-8b": 1})[0]
    assert woken.replicas == 1 and "woken" in woken.reason


def test_growth_is_projected_one_cold_start_ahead():
    a = scaler()
    cap = a.capacity("h100", "llama-3-8b")
    a.tick(T, fleet_with(T, {"w0": int(cap)}))
    # demand doubling within 5 s: with a ~28 s cold start the projection asks for much more
    grown = a.tick(T + 5_000, fleet_with(T + 5_000, {"w0": int(2 * cap)}))[0]
    assert grown.replicas > 2


def test_the_rise_in_sequences_after_a_scale_in_is_not_growth():
    a = scaler(scale_in_window_s=60)
    a.pools["h100@llama-3-8b"].replicas = 2
    a.pools["h100@llama-3-8b"].known = True
    cap = a.capacity("h100", "llama-3-8b")
    quiet = int(cap * 0.3)
    for s in range(0, 61, 5):
        (cmd,) = a.tick(T + s * 1000, fleet_with(T + s * 1000, {"w0": quiet // 2, "w1": quiet // 2}))
    assert cmd.replicas == 1
    # The same work on one worker: more sequences at once (each runs slower), not more work.
    for s in range(61, 80):
        (cmd,) = a.tick(T + s * 1000, fleet_with(T + s * 1000, {"w0": 2 * quiet}))
        assert cmd.replicas == 1, cmd.reason


def test_a_burst_that_passes_within_seconds_is_not_growth():
    a = scaler()
    cap = a.capacity("h100", "llama-3-8b")
    for s in range(0, 10):
        a.tick(T + s * 1000, fleet_with(T + s * 1000, {"w0": int(cap * 0.5)}))
    # two seconds of three times the capacity, then back: no scale-out beyond what it needs now
    for s in (10, 11):
        (cmd,) = a.tick(T + s * 1000, fleet_with(T + s * 1000, {"w0": int(cap * 3)}))
        assert cmd.replicas == 3, cmd.reason


def test_the_cheaper_pool_per_unit_of_capacity_fills_first():
    a = scaler(max_replicas=2)
    a.add_pool("a100", "llama-3-8b", 0)
    cost = {name: a._cost(p) for name, p in a.pools.items()}
    cheap, dear = sorted(cost, key=cost.get)
    cap = a.capacity(a.pools[cheap].gpu_type, "llama-3-8b")
    commands = {c.pool: c.replicas for c in a.tick(T, fleet_with(T, {"w0": int(cap * 2.5)}))}
    assert commands[cheap] == 2 and commands[dear] >= 1


def test_an_idle_model_keeps_its_last_worker_until_idle_to_zero_not_the_scale_in_window():
    a = scaler(idle_to_zero_s=300, scale_in_window_s=60)
    a.pools["h100@llama-3-8b"].replicas = 2
    a.pools["h100@llama-3-8b"].known = True
    idle = lambda t: fleet_with(t, {"w0": 0, "w1": 0})  # noqa: E731
    sizes = {s: a.tick(T + s * 1000, idle(T + s * 1000))[0] for s in range(0, 301, 30)}
    assert sizes[60].replicas == 1  # the surplus worker goes after the scale-in window
    assert all(sizes[s].replicas == 1 for s in range(90, 300, 30)), sizes[120].reason
    assert "last worker" in sizes[120].reason
    assert sizes[300].replicas == 0 and "idle for 300s" in sizes[300].reason


def test_the_idle_clock_starts_at_time_zero_too():
    a = scaler(idle_to_zero_s=1, scale_in_window_s=10_000)  # the simulator's clock starts at 0
    idle = lambda t: fleet_with(t, {"w0": 0})  # noqa: E731
    assert a.tick(0, idle(0))[0].replicas == 1
    assert a.tick(1_000, idle(1_000))[0].replicas == 0


def test_a_max_replicas_lowered_live_applies_at_once():
    a = scaler()
    cap = a.capacity("h100", "llama-3-8b")
    busy = fleet_with(T, {"w0": int(cap * 15.5)})
    assert a.tick(T, busy)[0].replicas == 16
    a.config = AutoscalerConfig(enabled=True, max_replicas=4)
    (cmd,) = a.tick(T + 1_000, fleet_with(T + 1_000, {"w0": int(cap * 15.5)}))
    assert cmd.replicas == 4 and "max_replicas" in cmd.reason


def _two_kinds(order: tuple[str, str]) -> Autoscaler:
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0, "a100": 1.8})
    for gpu in order:
        a.add_pool(gpu, "llama-3-8b", 1)
    return a


def _busy_kinds(now: int) -> FleetView:
    fleet = FleetView()
    for i, gpu in enumerate(("a100", "h100")):
        fleet.observe(WorkerStatus(event_time_ms=now, worker_id=f"w{i}", slot=i,
                                   pool=f"{gpu}@llama-3-8b", gpu_type=gpu,
                                   models_loaded=["llama-3-8b"], kv_blocks_used=900,
                                   kv_blocks_free=100, started_ms=now))
    return fleet


def test_demand_is_counted_in_the_cheapest_kind_whatever_order_the_pools_came_in():
    sizes = []
    for order in (("a100", "h100"), ("h100", "a100")):
        a = _two_kinds(order)
        sizes.append({c.pool: c.replicas for c in a.tick(T, _busy_kinds(T))})
    assert sizes[0] == sizes[1]


def test_a_held_request_wakes_one_worker_of_the_cheapest_pool_only():
    a = _two_kinds(("h100", "a100"))
    for pool in a.pools.values():
        pool.replicas, pool.known = 0, True
    cheap, dear = sorted(a.pools, key=lambda name: a._cost(a.pools[name]))
    woken = {c.pool: c.replicas for c in a.tick(T, FleetView(), held={"llama-3-8b": 1})}
    assert woken == {cheap: 1, dear: 0}
    # a held request while the model has a worker (still loading) wakes no other pool
    assert {c.pool: c.replicas for c in a.tick(T + 1_000, FleetView(),
                                               held={"llama-3-8b": 1})} == woken


def test_an_unpriced_gpu_costs_the_dearest_price_configured():
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={"a100": 1.8, "h100": 3.0})
    a.add_pool("b200", "llama-3-8b", 0)  # no price configured (and modelled as an H100)
    a.add_pool("h100", "llama-3-8b", 0)
    assert a._cost(a.pools["b200@llama-3-8b"]) == a._cost(a.pools["h100@llama-3-8b"])


def test_pools_named_at_the_length_limits_get_commands():
    gpu, model = "g" * 64, "m" * 64  # two names at their limit make a pool name of 129
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={gpu: 3.0})
    a.add_pool(gpu, model, 1)
    fleet = FleetView()
    fleet.observe(WorkerStatus(event_time_ms=T, worker_id="w0", slot=0, pool=f"{gpu}@{model}",
                               gpu_type=gpu, models_loaded=[model], running=1, started_ms=T))
    (cmd,) = a.tick(T, fleet)
    assert cmd.pool == f"{gpu}@{model}" and len(cmd.command_id) <= 128


def test_requests_too_short_to_show_in_a_heartbeat_keep_a_model_from_idling_to_zero():
    a = scaler(idle_to_zero_s=300)
    idle = lambda t: fleet_with(t, {"w0": 0})  # noqa: E731 (every heartbeat finds it idle)
    for s in range(0, 901, 10):
        if s % 20 == 0 and s <= 600:
            a.started("llama-3-8b", T + s * 1000)  # a short request every 20 s until 600 s
        (cmd,) = a.tick(T + s * 1000, idle(T + s * 1000))
        assert cmd.replicas == (1 if s < 900 else 0), (s, cmd.reason)


def test_a_request_accepted_and_not_ended_wakes_a_model_without_workers():
    a = scaler()
    a.pools["h100@llama-3-8b"].replicas, a.pools["h100@llama-3-8b"].known = 0, True
    a.accepted("r1", "llama-3-8b", T)  # dispatched to a worker that drained before reading it
    (cmd,) = a.tick(T + 1_000, FleetView())
    assert cmd.replicas == 1 and "waiting for a worker" in cmd.reason
    a.ended("r1")
    a.pools["h100@llama-3-8b"].replicas = 0
    assert a.tick(T + 2_000, FleetView())[0].replicas == 0  # nothing open: nothing to wake for


def test_a_request_accepted_after_its_end_was_seen_wakes_nothing():
    """A restarted router sends the Queued it lost in its crash, after the request ran: its end
    came first, and it is not opened (it held its model busy for an hour, and could wake a pool
    at zero for a request done)."""
    a = scaler()
    a.pools["h100@llama-3-8b"].replicas, a.pools["h100@llama-3-8b"].known = 0, True
    a.ended("ran")
    a.accepted("ran", "llama-3-8b", T)
    assert a.tick(T + 1_000, FleetView())[0].replicas == 0


def test_a_request_open_past_the_limit_is_taken_to_have_ended():
    a = scaler(idle_to_zero_s=60)
    a.accepted("lost", "llama-3-8b", T)  # its end never seen
    idle = lambda t: fleet_with(t, {"w0": 0})  # noqa: E731
    assert a.tick(T + 3_599_000, idle(T + 3_599_000))[0].replicas == 1
    assert a.tick(T + 3_601_000, idle(T + 3_601_000))[0].replicas == 1  # idle from now on
    assert a.tick(T + 3_661_000, idle(T + 3_661_000))[0].replicas == 0


def _bounded(pools: dict, **cfg) -> Autoscaler:
    a = Autoscaler(AutoscalerConfig(enabled=True, pools=pools, **cfg),
                   prices={"h100": 3.0, "a100": 1.8})
    for gpu in ("h100", "a100"):
        a.add_pool(gpu, "llama-3-8b", 1)
    return a


def test_a_pools_own_cap_sends_the_rest_of_the_demand_to_the_next_pool():
    unbounded = _two_kinds(("h100", "a100"))
    cheap, dear = sorted(unbounded.pools, key=lambda name: unbounded._cost(unbounded.pools[name]))
    free = {c.pool: c.replicas for c in unbounded.tick(T, _busy_kinds(T))}
    assert free[cheap] >= 2  # unbounded, the cheaper pool takes the demand (the other holds)
    a = _bounded({cheap: {"max_replicas": 1}})
    sized = {c.pool: c.replicas for c in a.tick(T, _busy_kinds(T))}
    assert sized[cheap] == 1 and sized[dear] > free[dear]
    reasons = {c.pool: c.reason for c in a.tick(T + 1_000, _busy_kinds(T + 1_000))}
    assert "holding 1" in reasons[cheap]


def test_a_pools_own_least_holds_workers_through_idleness():
    a = _bounded({"h100@llama-3-8b": {"min_replicas": 2}}, idle_to_zero_s=300,
                 scale_in_window_s=60)
    idle = lambda t: fleet_with(t, {"w0": 0})  # noqa: E731
    a.tick(T, idle(T))
    sizes = {c.pool: c.replicas for c in a.tick(T + 400_000, idle(T + 400_000))}
    assert sizes == {"h100@llama-3-8b": 2, "a100@llama-3-8b": 0}


def test_a_pool_capped_at_zero_is_not_used_and_the_next_one_is_woken():
    a = _bounded({"a100@llama-3-8b": {"max_replicas": 0}})
    sized = {c.pool: (c.replicas, c.reason) for c in a.tick(T, _busy_kinds(T))}
    assert sized["a100@llama-3-8b"][0] == 0 and "cut to 0" in sized["a100@llama-3-8b"][1]
    assert sized["h100@llama-3-8b"][0] >= 2  # the demand the cheaper pool would have taken
    for pool in a.pools.values():
        pool.replicas = 0
    woken = {c.pool: c.replicas for c in a.tick(T + 1_000, FleetView(), held={"llama-3-8b": 1})}
    assert woken == {"h100@llama-3-8b": 1, "a100@llama-3-8b": 0}


@pytest.mark.parametrize(("pools", "cfg", "message"), [
    ({"h100@llama-3-8b": {"min_replicas": 5, "max_replicas": 4}}, {},
     "pool h100@llama-3-8b: min_replicas (5) must be at most max_replicas (4)"),
    ({"h100@llama-3-8b": {"max_replicas": 2}}, {"min_replicas": 3},
     "pool h100@llama-3-8b: min_replicas (3) must be at most max_replicas (2)"),
])
def test_a_pools_bounds_are_checked_against_the_autoscalers(pools, cfg, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AutoscalerConfig(pools=pools, **cfg)


def test_a_restarted_autoscaler_waits_for_every_worker_of_a_pool_before_sizing_it():
    """Heartbeats come every 0.5 s, ticks every 0.25 s: sized at its first tick, a running pool
    of four would be cut to the workers heard so far."""
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0})
    fleet = FleetView()
    cap = a.capacity("h100", "llama-3-8b")
    commands = []
    for k in range(16):  # 4 s: one worker heard every 100 ms at first, then all every 500 ms
        now = T + k * 250
        for i in range(4):
            if k * 250 >= i * 100 and (k * 250 - i * 100) % 500 < 250:
                fleet.observe(WorkerStatus(
                    event_time_ms=now, worker_id=f"w{i}", slot=i, pool="h100@llama-3-8b",
                    gpu_type="h100", models_loaded=["llama-3-8b"], running=int(cap * 0.9),
                    started_ms=T - 60_000))
                a.add_pool("h100", "llama-3-8b", 1, heard_ms=now)
        commands += [(k, c.replicas) for c in a.tick(now, fleet)]
    assert commands and all(replicas == 4 for _, replicas in commands), commands
    assert commands[0][0] * 250 >= fleet.heartbeat_timeout_ms  # nothing decided before


def test_scale_in_takes_the_dearer_pools_worker_and_holds_the_cheaper_one():
    a = _two_kinds(("h100", "a100"))
    for pool in a.pools.values():
        pool.known = True
    cheap, dear = sorted(a.pools, key=lambda name: a._cost(a.pools[name]))
    fleet = FleetView()
    sizes = {}
    for s in range(0, 181, 10):  # no demand, but a short request now and then: not idle
        now = T + s * 1000
        for i, gpu in enumerate(("a100", "h100")):
            fleet.observe(WorkerStatus(event_time_ms=now, worker_id=f"w{i}", slot=i,
                                       pool=f"{gpu}@llama-3-8b", gpu_type=gpu,
                                       models_loaded=["llama-3-8b"], started_ms=T))
        a.started("llama-3-8b", now)
        sizes[s] = {c.pool: c.replicas for c in a.tick(now, fleet)}
    assert sizes[180] == {cheap: 1, dear: 0}, sizes


def _conversations(a: Autoscaler):
    """A tick that starts ``new`` conversations of 5 steps and ends ``done`` of the oldest (their
    last steps accepted), the fleet of two holding one sequence each; returns what it said."""
    started, ended = [0], [0]

    def tick(t: int, new: int, done: int = 0) -> str:
        for _ in range(new):
            a.task_step(("acme", f"t{started[0]}"), "llama-3-8b", 1, 5, T + t)
            started[0] += 1
        for _ in range(done):
            a.task_step(("acme", f"t{ended[0]}"), "llama-3-8b", 5, 5, T + t)
            ended[0] += 1
        (cmd,) = a.tick(T + t, fleet_with(T + t, {"w0": 1, "w1": 1}))
        return f"{cmd.replicas}: {cmd.reason}"
    return tick


def _two_workers(**cfg) -> Autoscaler:
    a = scaler(**cfg)
    a.pools["h100@llama-3-8b"].replicas = 2
    a.pools["h100@llama-3-8b"].known = True
    return a


def test_no_scale_in_while_the_tasks_in_progress_grow():
    """Conversations starting faster than they end hold their later steps' demand, which the
    sequences running now do not show: the scale-in window stands still while their count
    grows, and runs on once it stops."""
    tick = _conversations(_two_workers(scale_in_window_s=60))
    said = {t: tick(t, 5 if t <= 120_000 else 0) for t in range(0, 300_000, 1_000)}
    held = [t for t, why in said.items() if "the tasks in progress still grow" in why]
    assert all(why.startswith("2: ") for t, why in said.items() if t <= 120_000)
    assert held[0] <= 2_000 and set(range(held[0], 121_000, 1_000)) <= set(held)
    stop = held[-1] + 1_000  # (some seconds after the last start: the count of 30 s before
    assert 120_000 < stop < 150_000  # catches up with it)
    assert "(605 multi-step tasks in progress" in said[121_000]
    # (the window stood still at the last tick that saw growth, a second before ``stop``)
    assert said[stop + 58_000].startswith("2: ") and said[stop + 59_000].startswith("1: ")
    assert "one worker less" in said[stop + 59_000]


def test_growth_that_comes_and_goes_holds_the_window_only_while_it_lasts():
    """A batch of tasks now and then (a job every 45 s whose tasks end 20 s later) grows the
    count at each batch: the window stands still then, and runs between batches."""
    tick = _conversations(_two_workers(scale_in_window_s=60))
    said = {t: tick(t, 10 if t % 45_000 == 0 else 0, 10 if t % 45_000 == 20_000 else 0)
            for t in range(0, 600_000, 1_000)}
    held = [t for t, why in said.items() if "still grow" in why]
    assert held  # some ticks saw the batches grow the count ...
    first = min(t for t, why in said.items() if why.startswith("1: "))
    assert first < 600_000 and "one worker less" in said[first]  # ... and it scaled in
    assert first >= 60_000 + len([t for t in held if t < first]) * 1_000  # after the pauses


def test_tasks_starting_as_fast_as_they_end_hold_no_scale_in():
    """In steady state the count goes up half the time: noise, not growth."""
    tick = _conversations(_two_workers(scale_in_window_s=60))
    for t in range(0, 100_000, 1_000):
        tick(t, 5)  # 500 conversations in progress
    said = {t: tick(t, 5 + (t // 1_000) % 3, 5 + (t // 1_000 + 1) % 3)  # starts and ends at
            for t in range(100_000, 200_000, 1_000)}                      # random-ish, level
    assert not any("still grow" in why for t, why in said.items() if t >= 130_000)
    assert any(why.startswith("1: ") and "one worker less" in why for why in said.values())


def test_a_task_leaves_the_count_at_its_last_step_or_when_gone_quiet():
    a = scaler()
    a.task_step(("acme", "a"), "llama-3-8b", 1, 3, T)
    a.task_step(("acme", "b"), "llama-3-8b", 1, 3, T)
    a.task_step(("acme", "c"), "llama-3-8b", 1, 1, T)  # one step: no later demand
    assert a.tasks_growing("llama-3-8b", T) == (False, "2 multi-step tasks in progress, 2 before")
    a.task_step(("acme", "a"), "llama-3-8b", 3, 3, T + 1_000)  # its last step
    assert a.tasks_growing("llama-3-8b", T + 1_000)[1].startswith("1 multi-step")
    a.task_step(("acme", "b"), "llama-3-8b", 2, 3, T + 2_000)  # (moves it to the newest)
    assert a.tasks_growing("llama-3-8b", T + 2_000 + 600_000)[1].startswith("1 multi-step")
    assert a.tasks_growing("llama-3-8b", T + 2_001 + 600_000)[1].startswith("0 multi-step")


def test_a_reason_says_how_many_of_the_pools_workers_are_up_when_fewer_than_commanded():
    """A pool commanded a size that no worker answers (cold starts, or an actuator that cannot
    run its model) says so, rather than only 'holding the last worker'."""
    a = scaler(scale_in_window_s=60)
    cap = a.capacity("h100", "llama-3-8b")
    (out,) = a.tick(T, fleet_with(T, {"w0": int(cap * 2.5)}))
    assert out.replicas == 3 and out.reason.endswith("; 1 of 3 up")
    (idle,) = a.tick(T + 1_000, FleetView())
    assert idle.reason.endswith("; 0 of 3 up")
    (full,) = a.tick(T + 2_000, fleet_with(T + 2_000, {"w0": 0, "w1": 0, "w2": 0}))
    assert "up" not in full.reason.rsplit(";", 1)[-1]


def test_a_worker_out_of_service_is_replaced_and_then_scaled_in():
    """Behind a breaker that opened again after its probe, w1 serves nothing: the pool is given
    one more worker while its warm others are fewer than the demand wants, and none once the
    new one is warm (the scale-in window then cuts one: the supervisor drains w1 first)."""
    a = scaler(scale_in_window_s=60)
    a.pools["h100@llama-3-8b"].replicas = 2
    a.pools["h100@llama-3-8b"].known = True
    cap = a.capacity("h100", "llama-3-8b")
    busy = int(cap * 1.5)  # two workers' worth
    (cmd,) = a.tick(T, fleet_with(T, {"w0": busy, "w1": 0}), out_of_service={"w1"})
    assert cmd.replicas == 3 and "1 out of service" in cmd.reason
    (cmd,) = a.tick(T + 1_000, fleet_with(T + 1_000, {"w0": busy, "w1": 0}))
    assert cmd.replicas == 3  # (its breaker closed: no longer replaced, held for the window)
    warm = {"w0": busy, "w1": 0, "w2": 0}
    (cmd,) = a.tick(T + 30_000, fleet_with(T + 30_000, warm), out_of_service={"w1"})
    assert cmd.replicas == 3 and "wants 2" in cmd.reason
    (cmd,) = a.tick(T + 90_000, fleet_with(T + 90_000, warm), out_of_service={"w1"})
    assert cmd.replicas == 2


def test_a_worker_out_of_service_in_a_capped_pool_sends_its_share_to_the_next_pool():
    """The cheaper pool, at its cap of 2, has one worker behind a breaker opened again after
    its probe: it cannot be given one more, and the demand it cannot serve goes to the next
    pool (before, the broken worker counted as capacity there: two workers' demand, one
    serving, and the dearer pool given none)."""
    probe = _two_kinds(("h100", "a100"))
    cheap, dear = sorted(probe.pools, key=lambda name: probe._cost(probe.pools[name]))
    a = _bounded({cheap: {"max_replicas": 2}})
    gpu = a.pools[cheap].gpu_type
    a.pools[cheap].replicas, a.pools[cheap].known = 2, True
    a.pools[dear].replicas, a.pools[dear].known = 0, True
    cap = a.capacity(gpu, "llama-3-8b")
    fleet = fleet_with(T, {"w0": int(cap * 1.5), "w1": 0}, gpu=gpu)
    sized = {c.pool: c.replicas for c in a.tick(T, fleet)}
    assert sized[cheap] == 2 and sized[dear] == 0  # (all serving: two workers' worth)
    sized = {c.pool: c.replicas for c in a.tick(T + 1_000, fleet_with(
        T + 1_000, {"w0": int(cap * 1.5), "w1": 0}, gpu=gpu), out_of_service={"w1"})}
    assert sized[cheap] == 2 and sized[dear] >= 1, sized


def test_a_pool_whose_workers_need_several_gpus_costs_each_of_them():
    """A 60B model holds on one H200 but needs two H100s (tensor parallelism 2): an H100
    worker costs 2 x $3.00 an hour against the H200's $3.70 for a like capacity, so the H200
    pool is the cheaper one (priced at one GPU, the H100 pool looked cheaper)."""
    models.configure_models({"big-60b": ModelShape(
        params_b=60.0, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128, hidden_size=8192,
        intermediate_size=24576, vocab_size=32000)})
    try:
        a = Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0, "h200": 3.7})
        a.add_pool("h100", "big-60b", 0)
        a.add_pool("h200", "big-60b", 0)
        cost = {name: a._cost(pool) for name, pool in a.pools.items()}
        assert cost["h100@big-60b"] == pytest.approx(2 * 3.0 / a.capacity("h100", "big-60b"))
        assert cost["h200@big-60b"] == pytest.approx(3.7 / a.capacity("h200", "big-60b"))
        assert min(cost, key=cost.get) == "h200@big-60b"
    finally:
        models.configure_models({})


def _a_70b_worker(gpus: int, running: int = 0) -> FleetView:
    """A fleet of one worker of Llama-2-70B on ``gpus`` H100s, as its heartbeat says."""
    fleet = FleetView()
    fleet.observe(WorkerStatus(event_time_ms=T, worker_id="w0", slot=0, pool="h100@llama-2-70b",
                               gpu_type="h100", gpus=gpus, models_loaded=["llama-2-70b"],
                               running=running, started_ms=T))
    return fleet


def test_a_pool_is_priced_at_the_gpus_its_workers_report():
    """Llama-2-70B holds on two H100s, but this pool's workers run ``--tp 8`` and say so
    (``WorkerStatus.gpus``): a worker costs 8 x $3.00 an hour (before 6 Dec, 2 x $3.00 whatever
    they said); a pool none of whose workers was heard is priced at the two."""
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0, "a100": 1.8})
    a.add_pool("h100", "llama-2-70b", 1)
    a.add_pool("a100", "llama-2-70b", 0)
    a.tick(T, _a_70b_worker(gpus=8))
    cost = {name: a._cost(pool) for name, pool in a.pools.items()}
    assert cost["h100@llama-2-70b"] == pytest.approx(8 * 3.0 / a.capacity("h100", "llama-2-70b", 8))
    assert cost["a100@llama-2-70b"] == pytest.approx(2 * 1.8 / a.capacity("a100", "llama-2-70b"))


def test_a_pool_is_sized_at_the_capacity_of_the_gpus_its_workers_report():
    """A pool of ``--tp 4`` workers of Llama-2-70B on H100s: one worker's capacity is the TP-4
    performance model's (its decode step within the latency target), not TP 2's, the least that
    holds the model (before 6 Dec the autoscaler sized every such pool at TP 2's)."""
    a = Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0})
    a.add_pool("h100", "llama-2-70b", 1)
    cap2, cap4 = a.capacity("h100", "llama-2-70b", 2), a.capacity("h100", "llama-2-70b", 4)
    assert cap2 != cap4
    [command] = a.tick(T, _a_70b_worker(gpus=4, running=math.ceil(1.5 * cap4)))
    assert f"{cap4:.0f} sequences per h100 worker" in command.reason
    assert command.replicas == 2  # 1.5 workers' worth at TP 4 (at TP 2's capacity: 1)
    assert a._cost(a.pools["h100@llama-2-70b"]) == pytest.approx(4 * 3.0 / cap4)


def _declared_tp4() -> Autoscaler:
    return Autoscaler(AutoscalerConfig(enabled=True), prices={"h100": 3.0},
                      degrees={"h100@llama-2-70b": 4})


def test_a_pool_with_no_worker_yet_is_planned_at_the_degree_its_fleet_declares():
    """A ``--fleet h100:8/tp4@llama-2-70b`` pool at zero (or before its first heartbeat), woken
    by held requests: its workers are sized, priced and cold-started at TP 4, as the fleet
    declares them and the supervisor starts them. Before, at TP 2, the least that holds the
    model, until a worker of it was heard: one worker for 1.5 TP-4 workers' worth, and TP 2's
    load time as the cold start."""
    from controllers.router.candidates import perf_model

    a = _declared_tp4()
    a.add_pool("h100", "llama-2-70b", 0)
    cap4 = a.capacity("h100", "llama-2-70b", 4)
    [command] = a.tick(T, FleetView(), held={"llama-2-70b": math.ceil(1.5 * cap4)})
    assert command.replicas == 2, command.reason
    assert f"{cap4:.0f} sequences per h100 worker" in command.reason
    load4, load2 = (perf_model("h100", "llama-2-70b", n).load_s() for n in (4, 2))
    assert f"{load4:.0f}s cold start" in command.reason and f"{load4:.0f}" != f"{load2:.0f}"
    assert a._cost(a.pools["h100@llama-2-70b"]) == pytest.approx(4 * 3.0 / cap4)


def test_a_pool_read_back_at_zero_is_planned_at_its_declared_degree():
    """A restarted autoscaler continues a pool from the size an earlier process commanded (0
    here, no worker to hear): at the declared degree too."""
    from schemas.commands import ScalePool

    a = _declared_tp4()
    a.continue_from(ScalePool(event_time_ms=T, command_id="c", issued_by="autoscaler",
                              pool="h100@llama-2-70b", gpu_type="h100", model="llama-2-70b",
                              replicas=0, reason="idle"), T)
    assert a.pools["h100@llama-2-70b"].gpus == 4


def test_the_workers_heartbeats_override_the_declared_degree():
    a = _declared_tp4()
    a.add_pool("h100", "llama-2-70b", 1)
    a.tick(T, _a_70b_worker(gpus=2))
    assert a.pools["h100@llama-2-70b"].gpus == 2


def test_an_autoscaler_enabled_counts_a_models_idle_time_from_then() -> None:
    """It ticks not at all while disabled: enabled on a model idle for longer than
    ``idle_to_zero_s`` (its last request seen while disabled, or its last tick before), it
    scaled the model to zero on its first tick, with no warning. Idle time counts from the
    later of enabling and the last activity."""
    a = scaler(idle_to_zero_s=300, scale_in_window_s=10_000)
    idle = lambda s: fleet_with(T + s * 1000, {"w0": 0})  # noqa: E731
    a.tick(T, idle(0))
    a.started("llama-3-8b", T + 10_000)  # disabled from here: heard, not ticked
    a.resume()  # enabled 10 minutes later
    sizes = {s: a.tick(T + s * 1000, idle(s))[0] for s in (600, 899, 900)}
    assert sizes[600].replicas == 1, sizes[600].reason
    assert sizes[899].replicas == 1
    assert sizes[900].replicas == 0 and "idle for 300s" in sizes[900].reason


def _scale_to(replicas: int, at_ms: int) -> ScalePool:
    return ScalePool(event_time_ms=at_ms, command_id="s", issued_by="autoscaler",
                     pool="h100@llama-3-8b", gpu_type="h100", model="llama-3-8b",
                     replicas=replicas, reason="read back")


@pytest.mark.parametrize(("commanded_ms", "sizes"), [
    (T - 10_000, [1]),  # an earlier stack's, stopped 10 s before this fleet started: not taken
    (T + 5_000, [0]),  # this fleet's own (its controllers restarted): continued from
])
def test_a_size_commanded_before_the_fleet_started_is_not_continued_from(commanded_ms, sizes):
    """``governor up --fleet h100:1`` within 30 s of a stack whose autoscaler had scaled the
    pool to zero: the new controllers continued from that 0 and stopped the worker the
    ``--fleet`` just typed had started. A size from before the fleet started stands no more."""
    a = Autoscaler(AutoscalerConfig(enabled=True, idle_to_zero_s=600), prices={"h100": 3.0})
    a.fleet_started_ms = T
    a.continue_from(_scale_to(0, commanded_ms), heard_ms=T + 6_000)
    fleet = FleetView()
    commanded = set()
    for k in range(20):  # 5 s of ticks, the --fleet's one idle worker heart-beating
        now = T + 6_000 + k * 250
        fleet.observe(WorkerStatus(event_time_ms=now, worker_id="w0", slot=0,
                                   pool="h100@llama-3-8b", gpu_type="h100",
                                   models_loaded=["llama-3-8b"], started_ms=T, state="warm"))
        a.add_pool("h100", "llama-3-8b", 1, heard_ms=now)
        commanded |= {c.replicas for c in a.tick(now, fleet)}
    assert sorted(commanded) == sizes
