"""The controllers process's pure part (``ControllersService.observe`` and ``tick``, what the
simulator drives too): what it keeps between ticks, and what it knows after a restart."""

import pytest

from controllers.service import ControllersService
from schemas.config import GovernorConfig
from schemas.events import Rejected
from schemas.topics import TopicCatalog

T = 1_800_000_000_000


def _no_capacity(n: int, model: str) -> Rejected:
    return Rejected(event_time_ms=T, request_id=f"r{n}", model=model, reason="no_capacity",
                    retry_after_s=1.0)


def test_requests_held_for_want_of_a_worker_are_forgotten_without_the_autoscaler_too() -> None:
    service = ControllersService("unused:9092", TopicCatalog("t"))
    assert not service.autoscaler.config.enabled
    for n in range(1_000):  # clients choose the model names
        service.observe(_no_capacity(n, f"model-{n}"), T)
    service.tick(T + 1_000, restate=False)
    assert len(service._held) == 1_000
    service.tick(T + 31_000, restate=False)
    assert service._held == {}


def test_a_configured_pool_at_zero_is_woken_after_a_restart() -> None:
    """No worker of it heart-beats (it was scaled to zero before the restart): only the
    configuration names it."""
    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-3-8b": {"min_replicas": 0}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    scaled = []
    for k in range(20):  # 5 s of ticks, a request held for want of a worker each
        now = T + k * 250
        service.observe(_no_capacity(k, "llama-3-8b"), now)
        scaled += [(c.pool, c.replicas) for c in service.tick(now, restate=False)
                   if c.type == "scale_pool"]
    assert scaled and scaled[0] == ("h100@llama-3-8b", 1), scaled


def test_a_request_waiting_with_no_live_worker_wakes_a_pool_at_zero() -> None:
    """The router says so as the request begins to wait (``waiting_for_worker``): the pool is
    woken while the request waits, not once its wait has ended in a ``no_capacity`` refusal."""
    from schemas.events import waiting_for_worker

    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-3-8b": {"min_replicas": 0}}}})
    woken = {}
    for told in (False, True):
        service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
        if told:
            service.observe(waiting_for_worker("llama-3-8b", T, 30.0), T)
        woken[told] = [(round((now - T) / 1000, 2), c.pool, c.replicas)
                       for now in range(T, T + 5_000, 250)
                       for c in service.tick(now, restate=False) if c.type == "scale_pool"]
    assert woken == {False: [(3.0, "h100@llama-3-8b", 0)], True: [(3.0, "h100@llama-3-8b", 1)]}


def test_a_heartbeat_stamped_far_ahead_freezes_the_controllers_view_a_bounded_time() -> None:
    """One heartbeat an hour ahead of the controllers' clock (its host's clock stepped, then set
    right) made every later one look old, for the hour: a restart and a stop went unseen, so
    the breakers, shedding and the autoscaler kept the worker as it was. It counts as heard at
    most ``MAX_AHEAD_MS`` ahead."""
    from controllers.router.fleet import MAX_AHEAD_MS
    from schemas.events import WorkerStatus

    def status(at: int, started_ms: int = T, state: str = "warm") -> WorkerStatus:
        return WorkerStatus(event_time_ms=at, worker_id="w0", slot=0, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=started_ms,
                            state=state, running=5)

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(status(T), T)
    service.observe(status(T + 3_600_000), T + 1)
    t = T + 1 + MAX_AHEAD_MS + 1
    service.observe(status(t, started_ms=t - 100), t)  # started again
    assert service.breakers._workers["w0"].started_ms == t - 100
    service.observe(status(t + 500, started_ms=t - 100, state="stopped"), t + 500)
    assert service.fleet.alive(t + 500) == []



def _overloaded(service: ControllersService, now: int) -> None:
    from schemas.events import WorkerStatus

    for w in range(4):
        service.observe(WorkerStatus(
            event_time_ms=now, worker_id=f"w{w}", slot=w, pool="h100@llama-3-8b", gpu_type="h100",
            models_loaded=["llama-3-8b"], started_ms=T - 60_000, running=8, waiting=40,
            kv_blocks_free=10_000), now)


def _shed_levels(service: ControllersService, ticks: int, heard_from: int | None) -> list[float]:
    """The level of each load-shed command of ``ticks`` ticks 250 ms apart, the first a
    restatement; four overloaded workers heart-beat from tick ``heard_from`` (None: none)."""
    levels = []
    for k in range(ticks):
        now = T + k * 250
        if heard_from is not None and k >= heard_from:
            _overloaded(service, now)
        levels += [c.min_value for c in service.tick(now, restate=k == 0)
                   if c.type == "set_load_shed_level" and c.model is not None]
    return levels


def test_a_restarted_process_continues_from_the_load_shed_level_last_commanded() -> None:
    """A restarted process's first tick, before any heartbeat, commanded level 0 ("no live
    worker") over its predecessor's 0.5 while the fleet was overloaded: low-value work was
    admitted until the level climbed back. It reads the level back from the control topic and
    holds it until it has heard the fleet."""
    from schemas.commands import SetLoadShedLevel

    before = ControllersService("unused:9092", TopicCatalog("t"))
    commanded: list = []
    for k in range(12):  # overloaded for 3 s: the level climbs to its cap
        _overloaded(before, T - 3_000 + k * 250)
        commanded = [c for c in before.tick(T - 3_000 + k * 250, restate=k == 0)
                     if isinstance(c, SetLoadShedLevel)] or commanded
    assert commanded[-1].min_value == 0.5
    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(commanded[-1], T)  # read back
    assert set(_shed_levels(service, 16, heard_from=4)) == {0.5}  # first heard after 1 s


def test_hearing_no_worker_for_a_heartbeat_timeout_lowers_the_level() -> None:
    from schemas.commands import SetLoadShedLevel

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(SetLoadShedLevel(event_time_ms=T, command_id="c", issued_by="shedding",
                                     min_value=0.5, model="llama-3-8b", reason="read back"), T)
    timeout_ticks = service.fleet.heartbeat_timeout_ms // 250
    levels = _shed_levels(service, timeout_ticks + 12, heard_from=None)
    assert levels[:1] == [0.5] and levels[1] < 0.5 and levels[-1] == 0.0
    # at 0 and serving nothing, the model is forgotten: nothing more to restate
    assert _shed_levels(service, 2, heard_from=None) == []
    assert _shed_levels(ControllersService("unused:9092", TopicCatalog("t")), 4, None) == []


def test_the_last_load_shed_level_is_read_back_from_the_control_topic(monkeypatch) -> None:
    """The Kafka side, with the consumer and the read-back faked: the last ``SetLoadShedLevel``
    of the window is the level continued from, the operator's ``SetAdmissionLimits`` is held;
    undecodable records are passed over; the reader is left at the end it read to."""
    import asyncio
    from types import SimpleNamespace

    from controllers import service as module
    from schemas.codec import encode
    from schemas.commands import (SetAdmissionLimits, SetLoadShedLevel, SetRoutingWeights,
                                  TenantLimit)

    def shed(level: float, model: str = "m") -> bytes:
        return encode(SetLoadShedLevel(event_time_ms=T, command_id=f"s{level}",
                                       issued_by="shedding", min_value=level, model=model,
                                       reason="r"))
    weights = encode(SetRoutingWeights(event_time_ms=T, command_id="w", issued_by="weights",
                                       weights={"h100@m": 1.0}, reason="r"))
    limits = encode(SetAdmissionLimits(event_time_ms=T, command_id="a", limits={
        "acme": TenantLimit(requests_per_s=5, tokens_per_s=1e6)}))
    shed_key = b"set_load_shed_level"  # (as the controllers key it: its type)
    records = [(shed_key, shed(0.2)), (shed_key, shed(0.3, "n")), (shed_key, shed(0.4)),
               (b"set_routing_weights", weights), (b"set_admission_limits", limits),
               (shed_key, b"not json")]
    asked = {}

    class Consumer:
        def partitions_for_topic(self, topic):  # (the broker's, as a started consumer has them)
            return {0}

        async def end_offsets(self, parts):
            return {tp: len(records) for tp in parts}

        def assign(self, parts) -> None:
            asked["assigned"] = parts

        def seek(self, tp, offset: int) -> None:
            asked["at"] = (tp.topic, offset)

    async def read_back(consumer, topic, since_ms, until):
        asked["topic"], asked["since_ms"] = topic, since_ms
        for key, value in records:
            yield SimpleNamespace(key=key, value=value, timestamp=T)

    monkeypatch.setattr(module, "read_back", read_back)
    monkeypatch.setattr(module, "now_ms", lambda: T)
    service = ControllersService("unused:9092", TopicCatalog("t"))
    asyncio.run(service._read_back(Consumer()))
    assert {m: s.level for m, s in service.shedding.by_model.items()} == {"m": 0.4, "n": 0.3}
    assert service.overrides.held_limits["acme"].requests_per_s == 5
    assert (asked["topic"], asked["since_ms"]) == ("t.control",
                                                   T - int(module.READ_BACK_S * 1000))
    assert asked["at"] == ("t.control", len(records)) and len(asked["assigned"]) == 1


def test_requests_a_workers_engine_hands_back_count_against_its_breaker() -> None:
    """A vLLM server that answers its metrics but fails every request (HTTP 5xx) makes its
    worker hand each one back (``Requeued``, ``engine_failed``) rather than fail it: the
    breaker counts those, or the worker would never be broken out. A hand-back because the
    worker stops (a drain) counts for nothing."""
    from schemas.events import Requeued, WorkerStatus

    def status(worker: str, slot: int) -> WorkerStatus:
        return WorkerStatus(event_time_ms=T, worker_id=worker, slot=slot, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T - 60_000,
                            state="warm", running=1)

    def handed_back(n: int, worker: str, engine_failed: bool) -> Requeued:
        return Requeued(event_time_ms=T, request_id=f"{worker}-r{n}", model="llama-3-8b",
                        worker_id=worker, tokens_done=3, engine_failed=engine_failed,
                        detail="HTTP 503 from the engine's server" if engine_failed else "drain")

    opened = {}
    for engine_failed in (False, True):
        service = ControllersService("unused:9092", TopicCatalog("t"))
        for slot, worker in enumerate(("w0", "w1")):
            service.observe(status(worker, slot), T)
        for n in range(8):
            service.observe(handed_back(n, "w0", engine_failed), T + n)
        commands = service.tick(T + 100, restate=False)
        opened[engine_failed] = [c.worker_id for c in commands
                                 if c.type == "set_breaker_state" and c.state == "open"]
    assert opened == {False: [], True: ["w0"]}


def test_the_accepted_steps_of_multi_step_tasks_reach_the_autoscaler() -> None:
    from schemas.events import Queued

    service = ControllersService("unused:9092", TopicCatalog("t"))

    def queued(rid: str, task: str | None, step: int, steps_total: int) -> Queued:
        return Queued(event_time_ms=T, request_id=rid, task_id=task, tenant="acme",
                      model="llama-3-8b", prompt_tokens=10, max_tokens=10, step=step,
                      steps_total=steps_total, created_ms=T)

    for message in (queued("a1", "a", 1, 3), queued("b1", "b", 1, 2), queued("b2", "b", 2, 2),
                    queued("c1", None, 1, 1)):
        service.observe(message, T)
    # a is in progress; b sent its last step; c is no task
    assert service.autoscaler.tasks_growing("llama-3-8b", T)[1] == \
        "1 multi-step tasks in progress, 1 before"


def test_each_request_a_waiting_signal_names_counts_as_demand_for_its_wait_or_30_s() -> None:
    """One signal a batch says how many began to wait: each counts, for its wait (10 s here) or
    30 s at most (60 s), as a no_capacity refusal does (once placed, a request counts among its
    worker's requests as well)."""
    from schemas.events import waiting_for_worker

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(waiting_for_worker("llama-3-8b", T, 60.0, requests=3), T)
    service.observe(waiting_for_worker("qwen-7b", T, 10.0, requests=2), T)
    service.observe(_no_capacity(1, "mistral-7b"), T)
    held = {}
    for after_s in (9, 11, 29, 31):
        service.tick(T + after_s * 1000, restate=False)
        held[after_s] = {model: len(times) for model, times in service._held.items()}
    assert held == {9: {"llama-3-8b": 3, "qwen-7b": 2, "mistral-7b": 1},
                    11: {"llama-3-8b": 3, "mistral-7b": 1},
                    29: {"llama-3-8b": 3, "mistral-7b": 1}, 31: {}}


def test_a_starting_process_first_clears_the_routers_levels_then_sends_each_models() -> None:
    """A router may hold a level for a model this process knows nothing of (commanded by one
    gone longer than the read-back): the first tick says every model's level is 0, then each
    model's. A level of every model read back (from before 5 Dec) is where each model starts."""
    from schemas.commands import SetLoadShedLevel

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(SetLoadShedLevel(event_time_ms=T, command_id="old", issued_by="shedding",
                                     min_value=0.5, reason="read back"), T)
    _overloaded(service, T)
    first = [(c.model, c.min_value) for c in service.tick(T, restate=False)
             if c.type == "set_load_shed_level"]
    assert first == [(None, 0.0), ("llama-3-8b", 0.5)]  # (0.5: held at its cap)
    _overloaded(service, T + 250)
    assert [c.model for c in service.tick(T + 250, restate=False)
            if c.type == "set_load_shed_level"] == []  # unchanged: nothing more


def test_an_autoscaler_enabled_again_waits_a_whole_scale_in_window_before_scaling_in() -> None:
    """Disabled a few seconds into a scale-in window and enabled again long after, it took one
    worker away on its first tick, saying demand had been below capacity for the window: it had
    looked for those few seconds only (``governor config set autoscaler.enabled false``, then
    ``true`` 45 s later, with a 40 s window: 2 -> 1 at once)."""
    from schemas.events import WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "scale_in_window_s": 40,
        "pools": {"h100@llama-3-8b": {"min_replicas": 1, "max_replicas": 2}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    scaled = []

    def run(since_s: float, until_s: float) -> None:
        for at in range(T + int(since_s * 1000), T + int(until_s * 1000), 250):
            for slot in (0, 1):  # two idle workers, heart-beating
                service.observe(WorkerStatus(
                    event_time_ms=at, worker_id=f"w{slot}", slot=slot, pool="h100@llama-3-8b",
                    gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T, state="warm"),
                    at)
            scaled.extend((round((at - T) / 1000), c.replicas)
                          for c in service.tick(at, restate=False) if c.type == "scale_pool")

    def enabled(on: bool) -> None:
        service.apply_config(service.live_config.config.with_setting("autoscaler.enabled", on))

    run(0, 10)  # holding 2 (wants 1) from 3 s on, once both workers are heard
    enabled(False)
    run(10, 70)
    enabled(True)
    run(70, 130)
    assert scaled == [(3, 2), (110, 1)], scaled


def test_a_restarted_autoscaler_does_not_count_a_draining_worker_in_its_pool() -> None:
    """Restarted while a worker it had scaled in still drained, it took the pool for one worker
    larger and commanded that size: the supervisor, which counts only serving workers, started
    a cold one, drained again moments later (governor up: the controllers killed during a
    drain, 'scaled h100@llama-3-8b: 1 -> 2', then '2 -> 1')."""
    from schemas.events import WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "scale_in_window_s": 5,
        "pools": {"h100@llama-3-8b": {"min_replicas": 1, "max_replicas": 2}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    scaled = []
    for at in range(T, T + 10_000, 250):
        if at > T:
            for slot, state in ((0, "warm"), (1, "draining")):
                service.observe(WorkerStatus(
                    event_time_ms=at, worker_id=f"worker-{slot}", slot=slot,
                    pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                    started_ms=T - 100_000, state=state, running=5), at)
        scaled += [c.replicas for c in service.tick(at, restate=False) if c.type == "scale_pool"]
    assert scaled == [1], scaled


def test_a_worker_whose_breaker_opens_again_after_its_probe_is_replaced() -> None:
    """w1 fails its requests: its breaker opens, and after the cooldown its probe fails too.
    From then on the autoscaler counts it as no capacity and asks for a third worker (before
    6 Dec the pool stayed at two, one of them serving nothing)."""
    from controllers.autoscaler import Autoscaler
    from schemas.events import Failed, Started, WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {"enabled": True}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    busy = int(Autoscaler(config.autoscaler).capacity("h100", "llama-3-8b") * 1.5)

    def beat(now: int) -> None:
        for slot, (worker, running) in enumerate((("w0", busy), ("w1", 0))):
            service.observe(WorkerStatus(
                event_time_ms=now, worker_id=worker, slot=slot, pool="h100@llama-3-8b",
                gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T - 60_000,
                state="warm", running=running), now)

    def failed(n: int, now: int) -> None:
        service.observe(Started(event_time_ms=now, request_id=f"r{n}", worker_id="w1"), now)
        service.observe(Failed(event_time_ms=now, request_id=f"r{n}", worker_id="w1",
                               reason="engine_error"), now)

    sizes, states = [], []
    for k in range(100):  # 25 s of ticks, a heartbeat every other one
        now = T + k * 250
        if k % 2 == 0:
            beat(now)
        if k == 20:
            for n in range(8):
                failed(n, now)
        if k == 70:  # half-open since the cooldown (10 s): the probe fails
            failed(100, now)
        for c in service.tick(now, restate=False):
            if c.type == "scale_pool":
                sizes.append((k, c.replicas))
            elif c.type == "set_breaker_state" and c.worker_id == "w1":
                states.append((k, c.state))
    assert [state for _, state in states] == ["closed", "open", "half_open", "open"], states
    reopened = states[-1][0]
    assert {size for k, size in sizes if k < reopened} == {2}
    assert sizes[-1] == (sizes[-1][0], 3) and sizes[-1][0] >= reopened


def test_the_breaker_series_of_a_worker_gone_goes_with_it() -> None:
    """w0's breaker opens, then w0 stops (scaled in, say): the controllers forget its breaker at
    their next restatement, and its Prometheus series goes with it. Before 6 Dec
    ``governor_breaker_state{worker="w0"}`` stayed at 2 (open) for good, the series of every
    worker ever heard of kept: an alert on open breakers fired for a worker long gone."""
    from schemas.events import Requeued, WorkerStatus

    service = ControllersService("unused:9092", TopicCatalog("t"))
    value = service.metrics.registry.get_sample_value

    def status(worker: str, slot: int, now: int, state: str = "warm") -> WorkerStatus:
        return WorkerStatus(event_time_ms=now, worker_id=worker, slot=slot, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T - 60_000,
                            state=state, running=1)

    def tick(now: int, restate: bool) -> None:
        for command in service.tick(now, restate):
            service.metrics.emitted(command)  # (as the process's outbox tells them)

    for slot, worker in enumerate(("w0", "w1")):
        service.observe(status(worker, slot, T), T)
    for n in range(8):
        service.observe(Requeued(event_time_ms=T, request_id=f"r{n}", model="llama-3-8b",
                                 worker_id="w0", tokens_done=3, engine_failed=True,
                                 detail="HTTP 503 from the engine's server"), T + n)
    tick(T + 100, restate=False)
    assert value("governor_breaker_state", {"worker": "w0"}) == 2  # open
    assert value("governor_breaker_state", {"worker": "w1"}) == 0
    service.observe(status("w0", 0, T + 500, state="stopped"), T + 500)
    service.observe(status("w1", 1, T + 500), T + 500)
    tick(T + 600, restate=True)
    assert value("governor_breaker_state", {"worker": "w0"}) is None
    assert value("governor_breaker_state", {"worker": "w1"}) == 0


def test_the_pool_sizes_go_when_the_autoscaler_is_disabled() -> None:
    """``governor_pool_replicas`` is what the autoscaler wants: disabled, it wants nothing and
    commands nothing. Before 6 Dec the last sizes it commanded stayed (16 for a pool it had
    scaled out, an hour after `config set autoscaler.enabled false`)."""
    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-3-8b": {"min_replicas": 2}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    value = service.metrics.registry.get_sample_value

    def ticks(start: int) -> None:
        for now in range(start, start + 5_000, 250):
            for command in service.tick(now, restate=True):
                service.metrics.emitted(command)  # (as the process's outbox tells them)

    ticks(T)
    assert value("governor_pool_replicas", {"pool": "h100@llama-3-8b"}) == 2
    service.apply_config(GovernorConfig.model_validate({"autoscaler": {"enabled": False}}))
    assert value("governor_pool_replicas", {"pool": "h100@llama-3-8b"}) is None
    service.apply_config(config)  # enabled again: it says anew
    ticks(T + 10_000)
    assert value("governor_pool_replicas", {"pool": "h100@llama-3-8b"}) == 2


def test_the_first_size_commanded_counts_as_a_change_from_the_pool_it_sized() -> None:
    """An autoscaler enabled on a stack idle for ``idle_to_zero_s`` scales its one-worker pool
    to zero with its first command: ``governor_pool_size_changes_total`` counted no change
    (``governor up``, ``config set autoscaler.enabled true`` after 6 idle minutes), the first
    size of a pool since the process started being no change whatever the pool had."""
    from schemas.events import WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {"enabled": True,
                                                           "idle_to_zero_s": 0}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    value = service.metrics.registry.get_sample_value
    scaled = []
    for at in range(T, T + 5_000, 250):  # one idle worker, heart-beating
        service.observe(WorkerStatus(
            event_time_ms=at, worker_id="w0", slot=0, pool="h100@llama-3-8b", gpu_type="h100",
            models_loaded=["llama-3-8b"], started_ms=T, state="warm"), at)
        for command in service.tick(at, restate=False):
            service.metrics.emitted(command)  # (as the process's outbox tells them)
            scaled += [command.replicas] if command.type == "scale_pool" else []
    assert scaled == [0], scaled
    changes = {"pool": "h100@llama-3-8b", "direction": "down"}
    assert value("governor_pool_size_changes_total", changes) == 1


def test_a_first_size_that_keeps_the_workers_heard_is_no_change() -> None:
    """Two workers heard a second apart, held at two: what the autoscaler planned while it
    learned the pool (one, then two) is no size the pool had."""
    from schemas.events import WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-3-8b": {"min_replicas": 2}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    value = service.metrics.registry.get_sample_value
    scaled = []
    for at in range(T, T + 6_000, 250):
        for slot in (0, 1) if at >= T + 1_000 else (0,):
            service.observe(WorkerStatus(
                event_time_ms=at, worker_id=f"w{slot}", slot=slot, pool="h100@llama-3-8b",
                gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T, state="warm"), at)
        for command in service.tick(at, restate=False):
            service.metrics.emitted(command)
            scaled += [command.replicas] if command.type == "scale_pool" else []
    assert scaled == [2], scaled
    for direction in ("up", "down"):
        assert value("governor_pool_size_changes_total",
                     {"pool": "h100@llama-3-8b", "direction": direction}) is None


def _restarted(commanded: list, config: GovernorConfig, at: int) -> ControllersService:
    """A process started at ``at`` that reads back ``commanded``, its predecessor's commands
    (what ``ControllersService._read_back`` observes once it has decoded them)."""
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    for command in commanded:
        service.observe(command, at)
    return service


def test_a_restarted_process_continues_the_breakers_its_predecessor_opened() -> None:
    """w1 fails its requests: its breaker opens; the process is killed 2 s later and started
    again. The new one announced every worker it heard "closed" (the routers sent w1 requests
    again, failed until it opened again), and its cooldown began afresh. It reads the states
    back, keeps w1 open until the old cooldown is over, then probes it; a probe that fails
    opens it again and puts it out of service, as before the restart."""
    from schemas.events import Failed, Started, WorkerStatus

    config = GovernorConfig()

    def beat(service: ControllersService, now: int) -> None:
        for slot, worker in enumerate(("w0", "w1")):
            service.observe(WorkerStatus(
                event_time_ms=now, worker_id=worker, slot=slot, pool="h100@llama-3-8b",
                gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T - 60_000,
                state="warm"), now)

    def failed(service: ControllersService, n: int, now: int) -> None:
        service.observe(Started(event_time_ms=now, request_id=f"r{n}", worker_id="w1"), now)
        service.observe(Failed(event_time_ms=now, request_id=f"r{n}", worker_id="w1",
                               reason="engine_error"), now)

    before = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    commanded = []
    for k in range(20):  # 5 s: w1 fails at 2 s and opens
        now = T + k * 250
        beat(before, now)
        if k == 8:
            for n in range(8):
                failed(before, n, now)
        commanded += before.tick(now, restate=k % 20 == 0)
    opened = [c.event_time_ms for c in commanded
              if c.type == "set_breaker_state" and c.worker_id == "w1" and c.state == "open"]
    assert opened, commanded
    restart = T + 5_000
    service = _restarted(commanded, config, restart)
    states = []
    for k in range(64):  # 16 s after the restart
        now = restart + k * 250
        beat(service, now)
        if now == opened[0] + 12_000:  # half-open since 10 s after it opened: the probe fails
            failed(service, 100, now)
        states += [(now - opened[0], c.state) for c in service.tick(now, restate=k % 20 == 0)
                   if c.type == "set_breaker_state" and c.worker_id == "w1"]
    changes = [(at, state) for n, (at, state) in enumerate(states)
               if n == 0 or state != states[n - 1][1]]
    assert [state for _, state in changes] == ["open", "half_open", "open"], states
    assert changes[1][0] == 10_000  # the cooldown, from when the first process opened it
    assert service.breakers.out_of_service() == {"w1"}


def test_a_restarted_autoscaler_keeps_a_worker_it_commanded_that_has_not_been_heard_yet() -> None:
    """Killed right after it scaled a pool out to 2, while the new worker was still starting
    (its first heartbeat comes seconds after its process starts): the restarted process took
    the pool for the one worker it heard, commanded 1 once the demand no longer wanted 2 (the
    growth that had asked for it forgotten), and the supervisor stopped the starting worker.
    It continues from the size last commanded; the scale-in window starts afresh."""
    from schemas.commands import ScalePool
    from schemas.events import WorkerStatus

    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "scale_in_window_s": 10,
        "pools": {"h100@llama-3-8b": {"min_replicas": 1, "max_replicas": 4}}}})
    def restarted_after(replicas: int, slots: int, heard_from: int,
                        ago_ms: int = 1_000) -> list[tuple[int, int]]:
        commanded = [ScalePool(event_time_ms=T - ago_ms, command_id="s", issued_by="autoscaler",
                               pool="h100@llama-3-8b", gpu_type="h100", model="llama-3-8b",
                               replicas=replicas, reason="r")]
        service = _restarted(commanded, config, T)
        scaled = []
        for k in range(60):  # 15 s; the last worker heard from tick ``heard_from`` on
            now = T + k * 250
            for slot in range(slots if k >= heard_from else slots - 1):
                service.observe(WorkerStatus(
                    event_time_ms=now, worker_id=f"worker-{slot}", slot=slot,
                    pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                    started_ms=T - 60_000, state="warm", running=2), now)
            scaled += [(now - T, c.replicas) for c in service.tick(now, restate=False)
                       if c.type == "scale_pool"]
        return scaled

    # scaled out to 2, the second worker first heard 8 s after the restart: kept for the
    # scale-in window, from the restart on
    assert restarted_after(2, 2, heard_from=32) == [(3_000, 2), (10_000, 1)]
    # scaled in to 1, the worker cut still serving: not commanded back to 2
    assert restarted_after(1, 2, heard_from=0) == [(3_000, 1)]
    # a size commanded a minute ago is a stopped stack's: the workers heard count
    assert restarted_after(2, 2, heard_from=32, ago_ms=60_000)[0] == (3_000, 1)


def test_workers_gone_five_minutes_leave_the_fleet_view() -> None:
    """1,000 workers heard once (pods of past restarts, each with an id of its own) and two that
    keep heart-beating: five minutes on, a restatement leaves the two. Before 6 Dec the
    controllers' fleet view kept every id ever heard, and each tick's passes over it grew with
    them. One heard again after is new."""
    from schemas.events import WorkerStatus

    service = ControllersService("unused:9092", TopicCatalog("t"))

    def status(worker: str, slot: int, now: int) -> WorkerStatus:
        return WorkerStatus(event_time_ms=now, worker_id=worker, slot=slot % 32,
                            pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                            started_ms=T - 60_000, state="warm")

    for n in range(1_000):
        service.observe(status(f"pod-{n}", n, T), T)
    later = T + 301_000
    for n, worker in enumerate(("w0", "w1")):
        service.observe(status(worker, n, later), later)
    service.tick(later, restate=False)
    assert len(service.fleet) == 1_002  # (only a restatement forgets)
    service.tick(later, restate=True)
    assert sorted(w.worker_id for w in service.fleet.workers()) == ["w0", "w1"]
    service.observe(status("pod-7", 7, later + 1_000), later + 1_000)
    assert service.fleet.get("pod-7") is not None


def test_a_configured_pool_at_zero_is_woken_at_the_degree_its_fleet_declares() -> None:
    """``governor controllers --pool-gpus h100@llama-2-70b=4`` (as ``governor up --fleet
    h100:8/tp4@llama-2-70b`` starts it): the pool, heard of no worker, is planned at TP 4's
    capacity, as its workers will run; before, at TP 2's, the least that holds the model."""
    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-2-70b": {"min_replicas": 0}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config,
                                 pool_gpus={"h100@llama-2-70b": 4})
    scaled = []
    for k in range(20):  # 5 s of ticks (a pool first heard of is left a heartbeat timeout)
        now = T + k * 250
        service.observe(_no_capacity(k, "llama-2-70b"), now)
        scaled += [c for c in service.tick(now, restate=False) if c.type == "scale_pool"]
    scale = scaled[0]
    cap4 = service.autoscaler.capacity("h100", "llama-2-70b", 4)
    assert cap4 != service.autoscaler.capacity("h100", "llama-2-70b", 2)
    assert f"{cap4:.0f} sequences per h100 worker" in scale.reason, scale.reason


@pytest.mark.parametrize(("commanded_ms", "continued"), [
    (T - 10_000, False),  # an earlier stack's, stopped 10 s before this fleet started
    (T + 5_000, True),  # this fleet's own (its controllers restarted)
])
def test_what_an_earlier_stack_derived_is_not_continued_from_but_the_operators_commands_are(
        commanded_ms, continued) -> None:
    """``governor up`` started again within the read-back of an earlier stack: a load-shed
    level and routing weights that stack's controllers derived from its own workers held over
    the fresh fleet (shedding its low-value work, starving a pool) until its own signals; a
    breaker opened on its ``w0`` is not continued either once the new ``w0``, started since, is
    heard (``Breakers.observe_status``). The operator's commands are configuration: they hold."""
    from schemas.commands import (SetAdmissionLimits, SetBreakerState, SetLoadShedLevel,
                                  SetRoutingWeights, TenantLimit)
    from schemas.events import WorkerStatus

    service = ControllersService("unused:9092", TopicCatalog("t"), fleet_started_ms=T)
    at = commanded_ms
    for read_back in (
            SetLoadShedLevel(event_time_ms=at, command_id="s", issued_by="shedding",
                             min_value=0.5, model="llama-3-8b", reason="overloaded"),
            SetRoutingWeights(event_time_ms=at, command_id="w", issued_by="weights",
                              weights={"h100@llama-3-8b": 0.05}, reason="slow"),
            SetBreakerState(event_time_ms=at, command_id="b", issued_by="breakers",
                            worker_id="w0", state="open", reason="4 of its last 4 failed"),
            SetAdmissionLimits(event_time_ms=at, command_id="a", limits={
                "acme": TenantLimit(requests_per_s=5, tokens_per_s=1e6)})):
        service.observe(read_back, T + 6_000, written_ms=at)
    service.observe(WorkerStatus(event_time_ms=T + 6_000, worker_id="w0", slot=0,
                                 pool="h100@llama-3-8b", gpu_type="h100",
                                 models_loaded=["llama-3-8b"], started_ms=T, state="warm"),
                    T + 6_000)
    levels = {model: shedding.level for model, shedding in service.shedding.by_model.items()}
    first = {c.type: c for c in service.tick(T + 6_000, restate=True)}
    assert levels == ({"llama-3-8b": 0.5} if continued else {})
    assert first["set_routing_weights"].weights == {"h100@llama-3-8b": 0.05 if continued else 1.0}
    assert service.breakers.state("w0") == ("open" if continued else "closed")
    assert service.overrides.held_limits["acme"].requests_per_s == 5  # (held either way)


def test_requests_whose_end_is_never_seen_are_forgotten_without_the_autoscaler_too() -> None:
    """The autoscaler is off (the default): requests accepted an hour ago whose end was never
    seen are let go as new ones come. Before 7 Dec only an autoscaler's tick let them go, so
    a controllers process that never autoscaled kept every lost end for good."""
    from controllers.autoscaler import OPEN_FOR_MS
    from schemas.events import Queued

    service = ControllersService("unused:9092", TopicCatalog("t"))
    assert not service.autoscaler.config.enabled

    def queued(rid: str, at: int) -> Queued:
        return Queued(event_time_ms=at, request_id=rid, tenant="acme", model="llama-3-8b",
                      prompt_tokens=10, max_tokens=10, created_ms=at)

    for n in range(1_000):  # their ends lost
        service.observe(queued(f"lost-{n}", T), T)
    later = T + OPEN_FOR_MS + 1_000
    service.tick(later, restate=True)
    service.observe(queued("new", later), later)
    assert list(service.autoscaler._open) == ["new"]
    assert service.autoscaler._open_by_model["llama-3-8b"] == 1


def test_a_worker_alive_by_a_heartbeat_timeout_above_five_minutes_is_not_forgotten() -> None:
    """``worker_heartbeat_timeout_s`` 600: a worker silent for 400 s is alive still, and the
    controllers keep its view and its breaker's state; silent past the timeout, it is forgotten.
    Before 7 Dec they forgot it after 300 s whatever the timeout: the autoscaler sized its
    pool without it, and heard again, its breaker was announced closed."""
    from schemas.commands import SetBreakerState
    from schemas.events import WorkerStatus

    config = GovernorConfig(worker_heartbeat_timeout_s=600)
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)

    def status(worker: str, slot: int, now: int) -> WorkerStatus:
        return WorkerStatus(event_time_ms=now, worker_id=worker, slot=slot,
                            pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                            started_ms=T - 60_000, state="warm")

    service.observe(SetBreakerState(event_time_ms=T, command_id="b", issued_by="breakers",
                                    worker_id="w0", state="open", reason="slow"), T)
    service.observe(status("w0", 0, T), T)
    for at in (T + 400_000, T + 601_000):
        service.observe(status("w1", 1, at), at)
        service.tick(at, restate=True)
        kept = at - T < 600_000
        assert (service.fleet.get("w0") is not None) == kept, at - T
        assert (service.breakers.state("w0") != "closed") == kept, at - T  # (half-open by now)


def test_a_pool_alive_by_a_heartbeat_timeout_above_five_minutes_keeps_its_routing_weight() -> None:
    """``worker_heartbeat_timeout_s`` 3,600: a pool whose one worker has been silent for 700 s
    keeps its weight (its worker alive by the timeout, as the fleet view and its breaker say);
    silent past the timeout, the pool leaves the weights. Before 7 Dec the weights forgot it after
    600 s whatever the timeout: its measured weight (a probe's share) became 1, a full share."""
    from schemas.commands import SetRoutingWeights
    from schemas.events import SignalSnapshot, WorkerStatus

    config = GovernorConfig(worker_heartbeat_timeout_s=3_600)
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)

    def heard(pool: str, slot: int, now: int) -> None:
        service.observe(WorkerStatus(
            event_time_ms=now, worker_id=f"w{slot}", slot=slot, pool=pool, gpu_type="h100",
            models_loaded=["llama-3-8b"], started_ms=T - 60_000, state="warm"), now)
        service.observe(SignalSnapshot(
            event_time_ms=now, scope="pool", key=pool, window_s=60, window_end_ms=now,
            values={"success_per_dollar": 100.0 if slot else 1.0}), now)

    heard("slow", 0, T)
    weights = {}
    for at in (T + 700_000, T + 3_601_000):
        heard("fast", 1, at)
        weights[at - T] = next(c.weights for c in service.tick(at, restate=True)
                               if isinstance(c, SetRoutingWeights))
    assert weights == {700_000: {"fast": 1.0, "slow": 0.05}, 3_601_000: {"fast": 1.0}}


def test_a_flood_of_rejections_does_not_let_a_late_queued_open_a_request_that_ran() -> None:
    """A restarted router sends the Queued its crash lost after its request ended: the end,
    read first, keeps it from being opened (and holding its model busy, or waking a pool at
    zero, for an hour). Rejected requests were never accepted, no Queued comes for them; before
    7 Dec each was kept as an end read first too, and a load-shedding burst of them pushed the
    request that ran out of what was kept."""
    from controllers.autoscaler import _ENDED_FIRST_KEPT
    from schemas.events import Completed, Queued

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(Completed(event_time_ms=T, request_id="ran", worker_id="w0",
                              prompt_tokens=10, output_tokens=10, e2e_s=1.0), T)
    for n in range(_ENDED_FIRST_KEPT + 1):
        service.observe(Rejected(event_time_ms=T, request_id=f"shed-{n}", reason="load_shed"), T)
    service.observe(Queued(event_time_ms=T, request_id="ran", model="llama-3-8b",
                           prompt_tokens=10, max_tokens=10, created_ms=T), T + 1)
    assert service.autoscaler._open == {}


@pytest.mark.parametrize("said", ["refused", "waiting"])
def test_a_request_held_counts_as_demand_from_when_the_router_said_so_not_when_read(
        said: str) -> None:
    """A ``no_capacity`` refusal, or a router's word that a request waits for a worker, read
    10 s after it was said (the controllers reading behind) counts for the 20 s left of its
    30 s; read 40 s after, for none. Before 7 Dec each counted for 30 s from when it was read:
    requests that had waited long before were taken for demand now."""
    from schemas.events import waiting_for_worker

    service = ControllersService("unused:9092", TopicCatalog("t"))
    for n, late_s in enumerate((10, 40)):
        model = f"model-{late_s}"
        message = _no_capacity(n, model) if said == "refused" else \
            waiting_for_worker(model, T, 60.0)
        service.observe(message, T + late_s * 1000)
    held = {}
    for after_s in (11, 29, 31):
        service.tick(T + after_s * 1000, restate=False)
        held[after_s] = {model: len(times) for model, times in service._held.items()}
    assert held == {11: {"model-10": 1}, 29: {"model-10": 1}, 31: {}}
