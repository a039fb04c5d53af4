"""Load shedding: the level rises above the high threshold, falls below the low one, holds in
between (hysteresis), and never passes max_level."""

import pytest

from controllers.router.fleet import FleetView
from controllers.shedding import Shedding
from schemas.config import SheddingConfig
from schemas.events import WorkerStatus

T = 1_800_000_000_000


def fleet(waiting: int = 0, kv_used: int = 0, backlog: int = 0) -> FleetView:
    f = FleetView()
    f.observe(WorkerStatus(event_time_ms=T, worker_id="w0", slot=0, pool="h100@llama-3-8b",
                           gpu_type="h100", models_loaded=["llama-3-8b"], waiting=waiting,
                           kv_blocks_used=kv_used, kv_blocks_free=1000 - kv_used,
                           prefill_backlog_tokens=backlog, started_ms=T))
    return f


CFG = SheddingConfig(high=0.8, low=0.4, queue_per_worker=10, step=0.2, max_level=0.5)


@pytest.mark.parametrize(("pressures", "levels"), [
    # each entry: (waiting, kv_used) -> pressure = max(waiting/10, kv_used/1000)
    ([(9, 0), (9, 0), (9, 0)], [0.2, 0.4, 0.5]),          # rises by a step, capped at max_level
    ([(9, 0), (6, 0), (6, 0)], [0.2, 0.2, 0.2]),          # between the thresholds: holds
    ([(9, 0), (9, 0), (2, 0), (2, 0)], [0.2, 0.4, 0.2, 0.0]),  # below low: falls to 0
    ([(0, 900), (0, 100)], [0.2, 0.0]),                   # KV use counts as pressure too
])
def test_hysteresis(pressures, levels):
    shed = Shedding(CFG)
    got = [shed.tick(T + i * 1000, fleet(w, kv)).min_value for i, (w, kv) in enumerate(pressures)]
    assert got == pytest.approx(levels)


@pytest.mark.parametrize("tick_ms", [250, 500, 1000])
def test_the_level_moves_by_a_step_a_second_however_often_it_ticks(tick_ms: int) -> None:
    shed = Shedding(CFG)
    shed.tick(T, fleet(9))  # the first tick takes a step
    levels = [shed.tick(t, fleet(9)).min_value for t in range(T + tick_ms, T + 1001, tick_ms)]
    assert levels[-1] == pytest.approx(0.4)
    assert shed.tick(T + 60_000, fleet(2)).min_value == pytest.approx(0.2)  # at most a step


def test_prefill_backlog_against_the_ttft_slo_is_pressure():
    shed = Shedding(CFG, ttft_slo_s=1.0)
    pressure, why = shed.pressure(fleet(backlog=200_000), T)
    assert pressure > 0.8 and "prefill backlog" in why
    assert shed.tick(T, fleet(backlog=200_000)).min_value == pytest.approx(0.2)


def test_no_live_worker_holds_the_level_for_a_heartbeat_timeout_from_the_first_tick():
    """No worker heard yet is the controller not having heard the fleet (it just started): the
    level it continues from (its predecessor's) holds; then, still none, it falls."""
    shed = Shedding(CFG, level=0.5)
    empty = FleetView(heartbeat_timeout_ms=3_000)
    assert [shed.tick(T + k * 1000, empty).min_value for k in range(3)] == [0.5] * 3
    assert "hold" in shed.tick(T + 2_500, empty).reason
    assert shed.tick(T + 3_000, empty).min_value == pytest.approx(0.4)
    assert Shedding(CFG, level=0.5).tick(T, fleet(2)).min_value == pytest.approx(0.3)  # heard


def test_no_live_worker_means_no_pressure():
    assert Shedding(CFG).pressure(FleetView(), T)[0] == 0.0


def test_a_cap_lowered_live_applies_at_once_and_low_must_be_under_high():
    shed = Shedding(SheddingConfig(high=0.8, low=0.4, queue_per_worker=10, step=0.5, max_level=1))
    assert [shed.tick(T + i * 1000, fleet(9)).min_value for i in range(2)] == [0.5, 1.0]
    shed.config = CFG  # max_level 0.5, while pressure holds between low and high
    assert shed.tick(T + 2000, fleet(6)).min_value == 0.5
    with pytest.raises(ValueError, match=r"low \(0.6\) must be below high \(0.5\)"):
        SheddingConfig(high=0.5, low=0.6)



@pytest.mark.parametrize(("kv_used", "level"), [
    (600, 0.0),  # the autoscaler's target: room to spare, nothing shed
    (850, 0.2),  # past kv_high (0.8): pressure above high (0.5), the level rises
])
def test_kv_use_counts_as_pressure_from_kv_high_not_from_high(kv_used: int, level: float):
    """Half full, a fleet that served every request in time shed some (the default high is 0.5,
    for queues and prefill backlogs): KV use now reaches pressure ``high`` at ``kv_high``."""
    shed = Shedding(SheddingConfig(step=0.2))
    assert shed.tick(T, fleet(kv_used=kv_used)).min_value == pytest.approx(level)
    pressure, why = shed.pressure(fleet(kv_used=kv_used), T)
    assert pressure == pytest.approx(kv_used / 1000 * 0.5 / 0.8) and "KV use" in why


def test_one_workers_long_prefill_backlog_is_not_the_fleets_pressure() -> None:
    """A new request goes to a less loaded worker: one 200k-token prompt on one of three
    workers (before 5 Dec: a mean backlog of 24 s, pressure 12, every tenant's low-value
    requests shed for 70 s) is no pressure; the same backlog on most of them is."""
    def fleet_of(backlogs: list[int]) -> FleetView:
        f = FleetView()
        for slot, tokens in enumerate(backlogs):
            f.observe(WorkerStatus(event_time_ms=T, worker_id=f"w{slot}", slot=slot,
                                   pool="h100@llama-3-8b", gpu_type="h100",
                                   models_loaded=["llama-3-8b"], prefill_backlog_tokens=tokens,
                                   started_ms=T))
        return f

    shed = Shedding(CFG)
    one, _ = shed.pressure(fleet_of([200_000, 0, 0]), T)
    most, why = shed.pressure(fleet_of([200_000, 200_000, 0]), T)
    assert one == 0.0
    assert most > CFG.high and "less loaded half" in why


def test_each_model_is_shed_from_its_own_workers_pressure() -> None:
    """A pool woken from zero handed a backlog of 150 requests raised one fleet-wide level, and
    another model's low-value requests were shed though its worker was idle (README
    walkthrough, 5 Dec): each model now has its own level, from its own workers."""
    from controllers.router.core import RouterCore
    from controllers.shedding import ShedLevels
    from tests.unit.controllers.router_factories import request_factory

    def heartbeats(at: int) -> list[WorkerStatus]:
        return [WorkerStatus(event_time_ms=at, worker_id=f"w{slot}", slot=slot,
                             pool=f"a100@{model}", gpu_type="a100", models_loaded=[model],
                             waiting=waiting, kv_blocks_free=1000, started_ms=T)
                for slot, (model, waiting) in enumerate((("llama-2-7b", 150), ("llama-3-8b", 0)))]

    levels, f, core = ShedLevels(CFG), FleetView(), RouterCore()
    for k in range(3):
        for status in heartbeats(T + k * 1000):
            f.observe(status)
            core.observe(status, T + k * 1000)
        commands = levels.tick(T + k * 1000, f)
    assert {(c.model, c.min_value) for c in commands} == {("llama-2-7b", 0.5), ("llama-3-8b", 0.0)}
    for command in commands:
        core.observe(command, T + 2000)
    low = dict(priority=0, created_ms=T + 2000, event_time_ms=T + 2000)
    assert core.route(request_factory("idle", model="llama-3-8b", **low), T + 2000).dispatch
    shed = core.route(request_factory("busy", model="llama-2-7b", **low), T + 2000).denial
    assert shed is not None and shed.reason == "load_shed" and "of llama-2-7b" in shed.detail


def test_a_model_first_ticked_after_the_others_moves_a_step_a_second_too() -> None:
    """A pool woken from zero handed a backlog: its model's first tick, a quarter second after
    the controllers' last, moved its level a whole second's step (before 7 Dec)."""
    from controllers.shedding import ShedLevels

    levels = ShedLevels(CFG)
    assert levels.tick(T, FleetView()) != []  # (every model's level 0)
    woken = fleet(waiting=9)  # pressure 0.9, over high
    (command,) = [c for c in levels.tick(T + 250, woken) if c.model == "llama-3-8b"]
    assert command.min_value == pytest.approx(0.05)
