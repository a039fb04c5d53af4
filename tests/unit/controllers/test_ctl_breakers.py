"""Circuit breakers: open on slowness against the load-expected latency or on errors, half-open
after the cooldown, close on a healthy probe, and never open every worker of a model."""

import pytest

from controllers.breakers import Breakers, _expected_itl_ms
from controllers.router.fleet import FleetView
from schemas.config import BreakerConfig
from schemas.events import WorkerStatus

T = 1_800_000_000_000


def beat(b: Breakers, fleet: FleetView, wid: str, itl_ms: float, at: int, *, running: int = 8,
         backlog: int = 0, slot: int = 0, pool: str = "h100@llama-3-8b", kv_blocks: int = 0,
         work: tuple[int, int, int] | None = None) -> None:
    """A heartbeat; ``work`` is (steps, prefilled tokens, generated tokens) since the last one."""
    steps, prefilled, generated = work or (None, None, None)
    status = WorkerStatus(event_time_ms=at, worker_id=wid, slot=slot, pool=pool, gpu_type="h100",
                          models_loaded=["llama-3-8b"], running=running, itl_ms=itl_ms,
                          prefill_backlog_tokens=backlog, kv_blocks_used=kv_blocks, started_ms=T,
                          steps=steps, prefilled_tokens=prefilled, generated_tokens=generated)
    fleet.observe(status)
    b.observe_status(status, fleet)


def changes(commands: list) -> list:
    """The commands but the first word a controller gives of each worker it hears of."""
    return [c for c in commands if not c.reason.startswith("heard: closed")]


def run(b, fleet, itls: dict[str, float], beats: int, start: int, warm: bool = True, **kw) -> int:
    """``beats`` heartbeats of every worker in ``itls``, after (by default) one where all are
    normal, so that every worker has peers with a history."""
    t = start
    if warm and start == T:
        for i, wid in enumerate(sorted(itls)):
            beat(b, fleet, wid, 10.0, t - 500, slot=i, **kw.get(wid, {}))
    for _ in range(beats):
        for i, (wid, itl) in enumerate(sorted(itls.items())):
            beat(b, fleet, wid, itl, t, slot=i, **kw.get(wid, {}))
        t += 500
    return t


@pytest.mark.parametrize(("slow_itl", "beats", "opens"), [
    (50.0, 2, True),    # 5x its peers for two heartbeats
    (50.0, 1, False),   # one heartbeat is not enough (consecutive = 2)
    (25.0, 3, False),   # 2.5x is under the 3x threshold
])
def test_slowness_against_peers(slow_itl, beats, opens):
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, {"w0": slow_itl, "w1": 10.0, "w2": 10.0}, beats, T)
    commands = b.tick(t, fleet)
    assert ([c.worker_id for c in commands if c.state == "open"] == ["w0"]) == opens
    if opens:
        assert "peers' median" in commands[0].reason and commands[0].issued_by == "breakers"


def test_a_worker_busy_with_long_prefills_is_not_taken_for_a_slow_one():
    b, fleet = Breakers(BreakerConfig()), FleetView()
    # w0's decode steps carry 8k-token prefill chunks: 10x the latency, as the model predicts.
    t = run(b, fleet, {"w0": 100.0, "w1": 10.0, "w2": 10.0}, 3, T,
            w0={"backlog": 50_000})
    expected_ratio = b._workers["w0"].last_ratio
    assert expected_ratio is not None and expected_ratio < 3
    assert changes(b.tick(t, fleet)) == []


def test_long_contexts_explain_a_slow_decode():
    b, fleet = Breakers(BreakerConfig()), FleetView()
    # w0 decodes 8 sequences of 32k tokens each (16k blocks of 16): slow per token, as predicted.
    t = run(b, fleet, {"w0": 60.0, "w1": 10.0, "w2": 10.0}, 3, T, w0={"kv_blocks": 16_384})
    assert changes(b.tick(t, fleet)) == []
    assert b._workers["w0"].last_ratio < 3


def test_a_long_prefill_that_ended_since_the_last_heartbeat_is_not_slowness():
    b, fleet = Breakers(BreakerConfig()), FleetView()
    # w0 prefilled a 100k-token prompt: its interval was slow, then its backlog is gone.
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0, "w2": 10.0}, 1, T, w0={"backlog": 100_000})
    t = run(b, fleet, {"w0": 300.0, "w1": 10.0, "w2": 10.0}, 1, t)
    assert b._workers["w0"].slow_streak == 0
    t = run(b, fleet, {"w0": 300.0, "w1": 10.0, "w2": 10.0}, 2, t)  # still slow without a cause
    assert [c.worker_id for c in b.tick(t, fleet) if c.state == "open"] == ["w0"]


def _expected(running: int = 8, **work) -> float:
    return _expected_itl_ms(WorkerStatus(event_time_ms=T, worker_id="x", slot=0, pool="p",
                                         gpu_type="h100", models_loaded=["llama-3-8b"],
                                         running=running, started_ms=T, **work))


def test_a_slowed_worker_caught_mid_prefill_is_judged_by_the_work_it_did():
    """A GPU slowed 5x, whose heartbeat lands while a 1,054-token prompt is being prefilled: the
    backlog alone says each step of the interval carried that prefill (which excused it for two
    heartbeats in a demo run); its counters say 12 steps shared it, and it is 5x slow."""
    work = {"steps": 12, "prefilled_tokens": 1054, "generated_tokens": 48}
    slow_itl = 5 * _expected(running=4, **work)
    assert slow_itl / _expected(running=4, prefill_backlog_tokens=1054) < 3  # the backlog excuses
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, {"w0": slow_itl, "w1": 10.0, "w2": 10.0}, 2, T,
            w0={"running": 4, "backlog": 1054, "work": (12, 1054, 48)})
    assert b._workers["w0"].last_ratio > 4
    assert [c.worker_id for c in b.tick(t, fleet) if c.state == "open"] == ["w0"]


def test_a_long_prompt_prefilled_in_the_interval_is_not_slowness():
    """A healthy worker that prefilled a 100k-token prompt in 13 steps since its last heartbeat,
    its backlog now gone: the counters explain its latency, the backlog would not."""
    work = {"steps": 13, "prefilled_tokens": 100_000, "generated_tokens": 104}
    itl = 1.2 * _expected(**work)
    assert itl / _expected() > 3  # what the backlog (none now) would have made of it
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, {"w0": itl, "w1": 10.0, "w2": 10.0}, 3, T, w0={"work": (13, 100_000, 104)})
    assert b._workers["w0"].slow_streak == 0
    assert changes(b.tick(t, fleet)) == []


def test_peers_faster_than_the_model_do_not_lower_the_bar():
    expected = _expected_itl_ms(WorkerStatus(event_time_ms=T, worker_id="x", slot=0, pool="p",
                                             gpu_type="h100", models_loaded=["llama-3-8b"],
                                             running=8, started_ms=T))
    b, fleet = Breakers(BreakerConfig()), FleetView()
    # Peers run at a fifth of the model's prediction, w0 at twice it: 10x its peers, yet it
    # runs within the model's expectation (x2 < 3), so it is not broken.
    t = run(b, fleet, {"w0": 2 * expected, "w1": expected / 5, "w2": expected / 5}, 3, T)
    assert changes(b.tick(t, fleet)) == []
    # At four times the model's prediction it is slow.
    t = run(b, fleet, {"w0": 4 * expected, "w1": expected / 5, "w2": expected / 5}, 3, t)
    assert [c.worker_id for c in b.tick(t, fleet) if c.state == "open"] == ["w0"]


def test_error_rate_opens_and_the_last_closed_worker_never_opens():
    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    for wid in ("w0", "w1"):
        for ok in (False, False, False, True):
            b.observe_outcome(wid, ok, T)
    opened = [c.worker_id for c in b.tick(T + 1, fleet) if c.state == "open"]
    assert len(opened) == 1  # both fail, but one must stay closed
    assert b.state("w0" if opened == ["w1"] else "w1") == "closed"


@pytest.mark.parametrize("tick_after_ms, opens", [(60_000, True), (60_001, False)])
def test_failures_count_within_the_outcome_window_only(tick_after_ms, opens):
    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    for ok in (True, False, False, False):
        b.observe_outcome("w0", ok, T)
    for _ in range(4):
        b.observe_outcome("w1", True, T)
    # heartbeats keep both alive at the tick
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T + tick_after_ms - 500)
    opened = [c.worker_id for c in b.tick(T + tick_after_ms, fleet) if c.state == "open"]
    assert opened == (["w0"] if opens else [])


def test_half_open_after_cooldown_then_closed_on_a_healthy_probe_or_reopened():
    cfg = BreakerConfig(cooldown_s=10)
    b, fleet = Breakers(cfg), FleetView()
    t = run(b, fleet, {"w0": 50.0, "w1": 10.0, "w2": 10.0}, 2, T)
    assert b.tick(t, fleet)[0].state == "open"
    t = run(b, fleet, {"w1": 10.0, "w2": 10.0}, 1, t)
    assert b.tick(t + 1_000, fleet) == []  # still cooling down
    t += 10_000
    run(b, fleet, {"w0": 10.0, "w1": 10.0, "w2": 10.0}, 1, t - 500)
    assert [c.state for c in b.tick(t, fleet)] == ["half_open"]
    t = run(b, fleet, {"w0": 11.0, "w1": 10.0, "w2": 10.0}, 1, t)
    assert [c.state for c in b.tick(t, fleet)] == ["closed"]


def test_desired_restates_every_breaker_that_is_not_closed():
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, {"w0": 50.0, "w1": 10.0, "w2": 10.0}, 2, T)
    b.tick(t, fleet)
    assert [(c.worker_id, c.state) for c in b.desired(t + 5_000)] == [("w0", "open")]


def test_a_half_open_breaker_closes_on_its_probes_evidence_only():
    b, fleet = Breakers(BreakerConfig(cooldown_s=10)), FleetView(60_000)
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0}, 3, T)  # both normal: a latency on record
    for _ in range(5):
        b.observe_outcome("w0", False, t)
    assert [(c.worker_id, c.state) for c in changes(b.tick(t, fleet))] == [("w0", "open")]
    for dt in (10_000, 10_500):  # half-open; w0 runs nothing, nothing succeeds
        beat(b, fleet, "w0", None, t + dt, running=0, slot=0)
        beat(b, fleet, "w1", 10.0, t + dt, slot=1)
        b.tick(t + dt, fleet)
    assert b.state("w0") == "half_open"  # its latency from before it opened is no probe


def _opened_by_failures() -> tuple[Breakers, FleetView]:
    """w0 and w1 report no latency; w0's breaker opens on its failures at T (cooldown 10 s)."""
    b, fleet = Breakers(BreakerConfig(cooldown_s=10)), FleetView(60_000)
    for wid, slot in (("w0", 0), ("w1", 1)):
        beat(b, fleet, wid, None, T, slot=slot)
    for _ in range(5):
        b.observe_outcome("w0", False, T)
    b.tick(T, fleet)
    return b, fleet


def test_a_successful_probe_closes_a_breaker_of_a_worker_that_reports_no_latency():
    b, fleet = _opened_by_failures()
    assert b.state("w0") == "open"
    for k in range(1, 40):
        now = T + k * 1000
        for wid, slot in (("w0", 0), ("w1", 1)):
            beat(b, fleet, wid, None, now, slot=slot)
        if k == 11:  # half-open by now: an old request of w0 completes, which is no probe
            assert b.state("w0") == "half_open"
            b.observe_outcome("w0", True, now, "before")
        if k > 11:  # probes: each started while half-open, and completed
            b.observe_started("w0", f"probe-{k}")
            b.observe_outcome("w0", True, now, f"probe-{k}")
        b.tick(now, fleet)
        if k == 11:
            assert b.state("w0") == "half_open"
    assert b.state("w0") == "closed"



def test_a_worker_that_is_gone_is_neither_a_peer_nor_restated():
    b, fleet = Breakers(BreakerConfig(cooldown_s=10)), FleetView(3_000)
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0, "w2": 10.0}, 3, T)
    for _ in range(5):
        b.observe_outcome("w2", False, t)
    b.tick(t, fleet)
    assert [c.worker_id for c in b.desired(t)] == ["w2"]
    # w2 stops, and w1 has been silent since t: neither counts any longer.
    beat(b, fleet, "w2", None, t + 500, running=0, slot=2)
    fleet.observe(WorkerStatus(event_time_ms=t + 600, worker_id="w2", slot=2, pool="h100@llama-3-8b",
                               gpu_type="h100", state="stopped", started_ms=T))
    assert b.desired(t + 600) == []  # its open breaker is forgotten, not restated
    assert b._peer_median(WorkerStatus(event_time_ms=t + 10_000, worker_id="w0", slot=0,
                                     pool="h100@llama-3-8b", gpu_type="h100", started_ms=T),
                          fleet, t + 10_000) is None  # w1 silent for 10 s, w2 stopped: no peer


def test_a_worker_id_at_its_length_limit_gets_a_command_too():
    long_id = "w" * 128  # an id at the limit: the command's id must still fit its own
    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {long_id: 10.0, "w1": 10.0}, 1, T)
    for ok in (False, False, False, True):
        b.observe_outcome(long_id, ok, T)
    (opened,) = [c for c in b.tick(T + 1, fleet) if c.state == "open"]
    assert opened.worker_id == long_id and len(opened.command_id) <= 128


def test_outcomes_of_a_worker_never_heard_from_are_forgotten_in_time():
    b, fleet = Breakers(BreakerConfig()), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)  # the fleet the breakers know
    for i in range(1_000):  # completions reported for workers that never heart-beat
        b.observe_outcome(f"ghost-{i}", True, T)
    b.desired(T + 1_000)
    assert b._workers.keys() >= {"ghost-0", "ghost-999"}  # recent: kept for a while
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T + 300_000)  # the real workers still beat
    b.desired(T + 300_001)
    assert set(b._workers) == {"w0", "w1"}


def test_a_failed_probe_opens_a_half_open_breaker_again():
    b, fleet = _opened_by_failures()
    now = T + 10_000
    for wid, slot in (("w0", 0), ("w1", 1)):
        beat(b, fleet, wid, None, now, slot=slot)
    b.tick(now, fleet)
    assert b.state("w0") == "half_open"
    b.observe_started("w0", "probe")
    b.observe_outcome("w0", False, now + 500, "probe")  # one probe, and it failed
    (cmd,) = [c for c in b.tick(now + 1_000, fleet) if c.worker_id == "w0"]
    assert cmd.state == "open" and "a probe failed" in cmd.reason


def test_a_worker_is_out_of_service_once_its_probe_fails_until_its_breaker_closes():
    b, fleet = _opened_by_failures()
    assert b.state("w0") == "open" and b.out_of_service() == set()  # open once: passing
    now = T + 10_000
    for wid, slot in (("w0", 0), ("w1", 1)):
        beat(b, fleet, wid, None, now, slot=slot)
    b.tick(now, fleet)
    b.observe_started("w0", "probe")
    b.observe_outcome("w0", False, now + 500, "probe")
    b.tick(now + 1_000, fleet)
    assert b.out_of_service() == {"w0"}  # open again after its probe
    now += 11_000
    beat(b, fleet, "w0", None, now)
    beat(b, fleet, "w1", None, now, slot=1)
    b.tick(now, fleet)
    assert b.state("w0") == "half_open" and b.out_of_service() == {"w0"}
    b.observe_started("w0", "probe-2")
    b.observe_outcome("w0", True, now + 500, "probe-2")
    b.tick(now + 1_000, fleet)
    assert b.state("w0") == "closed" and b.out_of_service() == set()


def test_a_controller_tells_the_state_of_every_worker_it_hears_of_once() -> None:
    """A router may hold an open state an earlier controllers process commanded, and a new one
    that never opened it would otherwise never say it is closed."""
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    first = b.tick(t, fleet)
    assert sorted((c.worker_id, c.state) for c in first) == [("w0", "closed"), ("w1", "closed")]
    assert all(c.reason.startswith("heard: closed") for c in first)
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0, "w2": 10.0}, 1, t)
    assert [(c.worker_id, c.state) for c in b.tick(t, fleet)] == [("w2", "closed")]
    assert b.tick(t + 1, fleet) == []


def test_a_heartbeat_delivered_twice_is_judged_once() -> None:
    b, fleet = Breakers(BreakerConfig(consecutive=2)), FleetView()
    t = run(b, fleet, {"w0": 10.0, "w1": 10.0, "w2": 10.0}, 1, T)
    for _ in range(2):  # one slow heartbeat, read twice
        beat(b, fleet, "w0", 50.0, t, slot=0)
    assert b._workers["w0"].slow_streak == 1
    beat(b, fleet, "w0", 50.0, t - 100, slot=0)  # and an older one, read late
    assert b._workers["w0"].slow_streak == 1
    assert [c for c in changes(b.tick(t, fleet)) if c.state == "open"] == []


@pytest.mark.parametrize("other", ["loading", "draining", "sleeping"])
def test_the_last_warm_closed_worker_never_opens(other: str) -> None:
    """A worker loading, draining or asleep takes no request: it does not keep the model
    served while the failing one's breaker is open."""
    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    fleet.observe(WorkerStatus(event_time_ms=T + 1, worker_id="w1", slot=1, state=other,
                               pool="h100@llama-3-8b", gpu_type="h100",
                               models_loaded=["llama-3-8b"], started_ms=T))
    for ok in (False, False, False, True):
        b.observe_outcome("w0", ok, T)
    assert [c for c in b.tick(T + 2, fleet) if c.state == "open"] == []
    assert b.state("w0") == "closed"


def test_a_worker_started_again_under_its_id_is_judged_afresh_and_said_closed() -> None:
    """The router drops a restarted worker's breaker state; the controller does the same, so
    the two agree (its open breaker restated later would recall what the router placed)."""
    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    for ok in (False, False, False, True):
        b.observe_outcome("w0", ok, T)
    assert [(c.worker_id, c.state) for c in changes(b.tick(T + 1, fleet))] == [("w0", "open")]
    restarted = WorkerStatus(event_time_ms=T + 2_000, worker_id="w0", slot=0,
                             pool="h100@llama-3-8b", gpu_type="h100",
                             models_loaded=["llama-3-8b"], started_ms=T + 1_500)
    fleet.observe(restarted)
    b.observe_status(restarted, fleet)
    assert b.state("w0") == "closed"
    assert [(c.worker_id, c.state) for c in b.tick(T + 2_001, fleet)] == [("w0", "closed")]
    assert b.desired(T + 2_002) == []


def test_a_heartbeat_stamped_far_ahead_delays_its_workers_judgement_a_bounded_time() -> None:
    """One heartbeat an hour ahead (a clock step NTP set right) made every later one look
    judged already: a restart under the worker's id no longer closed its breaker, for the hour.
    It counts as heard ``MAX_AHEAD_MS`` ahead of the controller's clock at most."""
    from controllers.router.fleet import MAX_AHEAD_MS

    b, fleet = Breakers(BreakerConfig(min_outcomes=4, error_rate=0.5)), FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    for ok in (False, False, False, True):
        b.observe_outcome("w0", ok, T)
    assert [(c.worker_id, c.state) for c in changes(b.tick(T + 1, fleet))] == [("w0", "open")]

    def status(at: int, started_ms: int) -> WorkerStatus:
        return WorkerStatus(event_time_ms=at, worker_id="w0", slot=0, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=started_ms)
    ahead = status(T + 3_600_000, T)
    fleet.observe(ahead, T + 2)
    b.observe_status(ahead, fleet, T + 2)
    restarted = status(T + 2 + MAX_AHEAD_MS + 1, T + 2 + MAX_AHEAD_MS)
    fleet.observe(restarted, restarted.event_time_ms)
    b.observe_status(restarted, fleet, restarted.event_time_ms)
    assert b.state("w0") == "closed"


def test_each_worker_is_judged_against_its_pools_peers_or_else_the_fleets() -> None:
    """Pool "slow" runs 5x slower than pool "fast" throughout (another kind of node, say): none
    of its workers is broken by that. One fast-pool worker at the slow pool's latency is, and so
    is the only worker of a third pool, judged against the whole fleet for want of pool peers."""
    pools = {**{f"s{i:02}": "slow" for i in range(15)}, **{f"f{i:02}": "fast" for i in range(21)},
             "lone": "alone"}
    itls = {wid: 50.0 if pool == "slow" else 10.0 for wid, pool in pools.items()}
    itls["f00"] = itls["lone"] = 50.0
    b, fleet = Breakers(BreakerConfig()), FleetView()
    t = run(b, fleet, itls, 3, T, **{wid: {"pool": f"h100-{pool}@llama-3-8b"}
                                     for wid, pool in pools.items()})
    assert sorted(c.worker_id for c in b.tick(t, fleet) if c.state == "open") == ["f00", "lone"]


@pytest.mark.parametrize("seed", range(20))
def test_the_peers_median_leaves_out_one_occurrence_of_the_worker_itself(seed: int) -> None:
    import random
    import statistics

    from controllers.breakers import _median_without

    rng = random.Random(seed)
    values = sorted(rng.choice([1.0, 2.0, 2.5, 3.0, 7.0]) for _ in range(rng.randrange(1, 9)))
    drop = rng.choice(values)
    rest = list(values)
    rest.remove(drop)
    assert _median_without(values, drop) == (statistics.median(rest) if rest else None)
    assert _median_without(values, None) == statistics.median(values)



def test_a_breaker_does_not_open_again_once_its_worker_is_the_models_last() -> None:
    """A slowed worker opened beside a healthy peer of its model, which then left (scaled in,
    or crashed). Half-open after the cooldown, judged against the fleet's other model, its slow
    probe opened it again, and again after each cooldown: its model had no worker taking
    requests but one probe every 11 s, while the autoscaler counted the worker as the pool's
    capacity. Never open every worker of a model holds from half-open too: it is closed."""
    b, fleet = Breakers(BreakerConfig(cooldown_s=10)), FleetView()

    def other_model(at: int) -> None:  # a worker of another model: a peer of the fleet
        status = WorkerStatus(event_time_ms=at, worker_id="x", slot=5, pool="a100@llama-2-7b",
                              gpu_type="a100", models_loaded=["llama-2-7b"], running=8,
                              itl_ms=10.0, started_ms=T)
        fleet.observe(status)
        b.observe_status(status, fleet)

    for at in range(T - 1_000, T, 500):
        other_model(at)
    t = run(b, fleet, {"w0": 50.0, "w1": 10.0}, 2, T)
    assert [c.state for c in changes(b.tick(t, fleet))] == ["open"]
    fleet.observe(WorkerStatus(event_time_ms=t, worker_id="w1", slot=1, state="stopped",
                               pool="h100@llama-3-8b", gpu_type="h100",
                               models_loaded=["llama-3-8b"], started_ms=T))
    states = []
    for _ in range(60):  # 30 s of heartbeats, the worker as slow as before
        other_model(t)
        t = run(b, fleet, {"w0": 50.0}, 1, t, warm=False)
        states += [c.state for c in changes(b.tick(t, fleet))]
    assert states == ["half_open", "closed"] and b.state("w0") == "closed", states


def test_a_slow_probe_opening_a_breaker_again_says_how_slow() -> None:
    """It said "probe was slow or failed: cooldown of 10.0s over: probing" (the reason it had
    gone half-open), and every restatement repeated it."""
    b, fleet = Breakers(BreakerConfig(cooldown_s=10)), FleetView()
    t = run(b, fleet, {"w0": 50.0, "w1": 10.0, "w2": 10.0}, 2, T)
    assert [c.state for c in changes(b.tick(t, fleet))] == ["open"]
    t += 10_000
    run(b, fleet, {"w0": 50.0, "w1": 10.0, "w2": 10.0}, 1, t - 500)
    assert [c.state for c in changes(b.tick(t, fleet))] == ["half_open"]
    t = run(b, fleet, {"w0": 50.0, "w1": 10.0, "w2": 10.0}, 2, t)
    [reopened] = changes(b.tick(t, fleet))
    assert reopened.state == "open"
    assert "cooldown" not in reopened.reason and "inter-token latency" in reopened.reason, \
        reopened.reason


def test_a_state_read_back_is_continued_unless_the_worker_started_again_since() -> None:
    """A restarted controllers process continues the states its predecessor commanded
    (``continue_from``), restatements and all, the reason not restated twice; a worker that
    started after its breaker took the state read back is another incarnation: closed."""
    from schemas.commands import SetBreakerState

    def told(wid: str, state: str, at: int, reason: str) -> SetBreakerState:
        return SetBreakerState(event_time_ms=at, command_id=f"{wid}{at}", issued_by="breakers",
                               reason=reason, worker_id=wid, state=state)

    b, fleet = Breakers(), FleetView()
    for wid in ("w0", "w1"):
        b.continue_from(told(wid, "open", T - 9_000, "4 of its last 4 requests failed"))
        b.continue_from(told(wid, "open", T - 4_000, "periodic restatement: 4 of its last 4 "
                                                     "requests failed"))
    for slot, started_ms in enumerate((T - 60_000, T - 5_000)):  # (w1 after it was opened)
        status = WorkerStatus(event_time_ms=T, worker_id=f"w{slot}", slot=slot,
                              pool="h100@llama-3-8b", gpu_type="h100",
                              models_loaded=["llama-3-8b"], started_ms=started_ms)
        fleet.observe(status)
        b.observe_status(status, fleet)
    assert (b.state("w0"), b.state("w1")) == ("open", "closed")
    assert [c.reason for c in b.desired(T)] == ["periodic restatement: 4 of its last 4 "
                                                "requests failed"]
    assert [c.state for c in b.tick(T + 1_000, fleet) if c.worker_id == "w0"] == ["half_open"]


@pytest.mark.parametrize("min_outcomes", [4, 50, 51, 10_000])
def test_the_error_rate_counts_at_every_min_outcomes_the_setting_takes(min_outcomes):
    # min_outcomes takes 1-10,000: every failure among that many outcomes opens the breaker
    # (before 7 Dec a worker kept its last 50 outcomes, so at 51 or more none ever opened)
    b = Breakers(BreakerConfig(min_outcomes=min_outcomes, error_rate=0.5))
    fleet = FleetView()
    run(b, fleet, {"w0": 10.0, "w1": 10.0}, 1, T)
    for _ in range(min_outcomes):
        b.observe_outcome("w0", False, T)
        b.observe_outcome("w1", True, T)
    assert [c.worker_id for c in b.tick(T + 1, fleet) if c.state == "open"] == ["w0"]
