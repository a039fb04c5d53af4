"""The stages wired in memory: the hand-computed cost scenario, duplicates, crash replays."""

import pytest

from schemas.events import (
    Cancelled, Completed, ConfigApplied, ConfigRejected, Failed, FirstToken, Queued, Rejected,
    Requeued, Started, WorkerStatus,
)
from schemas.limits import MAX_EPOCH_MS
from schemas.requests import InferenceRequest
from streams.pipeline import Pipeline
from streams.settings import StreamsSettings
from streams.synthetic import cost_scenario, synthetic_telemetry

T = 1_700_000_000_000
H100_S, A100_S = 3.00 / 3600, 1.80 / 3600  # config's default prices, per GPU-second
# task-a: a1 attempt 1 on h100 1-3 s (requeued), attempt 2 on a100 3.5-5.5 s; a2 on h100 6-8 s.
TASK_A = 2 * H100_S + 2 * A100_S + 2 * H100_S
# task-b fails at step 3 of 5: b1, b2, b3 one second each on a100.
TASK_B = 3 * A100_S
TASK_C = 1 * H100_S  # c1: a task of one step, h100 9-10 s; d1 is shed and costs nothing
SPEND = 20 * H100_S + 20 * A100_S  # both workers provisioned 0-20 s, idle time included


@pytest.fixture(scope="module")
def scenario():
    pipeline = Pipeline()
    pipeline.send(*cost_scenario(T))
    return pipeline


def test_cost_per_successful_task_equals_the_hand_computation(scenario):
    fleet = scenario.values("fleet:all")
    assert fleet["tasks_closed"] == 4 and fleet["tasks_succeeded"] == 2
    assert fleet["tasks_failed"] == 2
    assert fleet["task_cost_usd"] == pytest.approx(TASK_A + TASK_B + TASK_C)
    assert fleet["cost_per_successful_task_usd"] == pytest.approx((TASK_A + TASK_B + TASK_C) / 2)
    assert fleet["spend_usd"] == pytest.approx(SPEND)
    assert fleet["spend_per_successful_task_usd"] == pytest.approx(SPEND / 2)
    t1, t2 = scenario.values("tenant:t1"), scenario.values("tenant:t2")
    assert t1["cost_per_successful_task_usd"] == pytest.approx(TASK_A + TASK_B)
    assert t2["cost_per_successful_task_usd"] == pytest.approx(TASK_C)


def test_the_scenario_counts_retries_failures_sheds_and_utilisation(scenario):
    fleet = scenario.values("fleet:all")
    assert (fleet["completed"], fleet["failed"], fleet["rejected"]) == (5, 1, 1)
    assert fleet["sheds"] == 1 and fleet["retries"] == 1 and fleet["requeued"] == 1
    assert scenario.values("worker:w-h")["utilisation_ratio"] == pytest.approx(5 / 20)
    assert scenario.values("pool:a100@llama-3-8b")["spend_usd"] == pytest.approx(20 * A100_S)


def test_duplicate_deliveries_count_once():
    once, twice = Pipeline(), Pipeline()
    messages = cost_scenario(T)
    once.send(*messages)
    for message in messages:
        twice.send(message)
        if isinstance(message, (Completed, FirstToken)):
            twice.send(message)  # the producer retried: the same event twice
    assert twice.values("fleet:all") == pytest.approx(once.values("fleet:all"))


def test_the_components_word_on_a_configuration_changes_no_signal():
    """The router and the controllers say on the telemetry topic what they made of each config
    record (``ConfigApplied`` / ``ConfigRejected``): no request's event, and no crash."""
    plain, told = Pipeline(), Pipeline()
    messages = cost_scenario(T)
    plain.send(*messages)
    half = len(messages) // 2
    told.send(*messages[:half])
    told.send(ConfigApplied(event_time_ms=T + 1, key="slo.ttft_slo_s", component="router-0",
                            config_offset=3),
              ConfigRejected(event_time_ms=T + 2, key="shedding.high", component="controllers",
                             config_offset=4, reason="high must be above low"))
    told.send(*messages[half:])
    assert told.values("fleet:all") == pytest.approx(plain.values("fleet:all"))


def test_a_crash_replay_of_every_record_changes_nothing():
    pipeline = Pipeline()
    pipeline.send(*cost_scenario(T))
    before = {s.key: s.values for s in pipeline.snapshots() if s.window_s not in (10, 60)}
    pipeline.replay(list(pipeline.log))  # every source and repartition record, same offsets
    after = {s.key: s.values for s in pipeline.snapshots() if s.window_s not in (10, 60)}
    assert after == before


def test_synthetic_stream_yields_its_known_counts():
    messages, counts = synthetic_telemetry(T, 200, workers=4)
    pipeline = Pipeline()
    pipeline.send(*messages)
    fleet = pipeline.values("fleet:all")
    assert fleet["completed"] == counts.completed and fleet["rejected"] == counts.rejected
    assert fleet["retries"] == counts.retried and fleet["sheds"] == counts.rejected
    assert fleet["ttft_p50_s"] == pytest.approx(0.2, rel=0.01)
    assert fleet["e2e_p99_s"] == pytest.approx(0.8, rel=0.01)
    assert fleet["tasks_succeeded"] == counts.completed
    for tenant, completed in counts.per_tenant_completed.items():
        assert pipeline.values(f"tenant:{tenant}")["completed"] == completed
    per_worker = sum(pipeline.values(f"worker:worker-{w}")["completed"] for w in range(4))
    assert per_worker == counts.completed


def test_any_valid_event_time_publishes_valid_snapshots():
    """An event at ``MAX_EPOCH_MS`` (the first millisecond of its second) put ``window_end_ms``
    past it, and building the snapshot failed validation at every publication."""
    pipeline = Pipeline()
    pipeline.send(Queued(event_time_ms=MAX_EPOCH_MS, request_id="r", prompt_tokens=1,
                         max_tokens=1, created_ms=MAX_EPOCH_MS))
    snapshots = pipeline.snapshots(MAX_EPOCH_MS)
    assert snapshots and all(s.window_end_ms == MAX_EPOCH_MS for s in snapshots)
    assert pipeline.values("tenant:default", 10.0)["queued"] == 1


def _queued(rid: str, t: int, tenant: str = "acme") -> Queued:
    return Queued(event_time_ms=t, request_id=rid, tenant=tenant, prompt_tokens=10,
                  max_tokens=10, created_ms=t)


def _completed(rid: str, t: int, tenant: str = "acme") -> Completed:
    return Completed(event_time_ms=t, request_id=rid, tenant=tenant, worker_id="w1",
                     prompt_tokens=10, output_tokens=10, e2e_s=0.05)


def test_a_step_longer_than_the_task_idle_timeout_completes_its_task():
    """Step 2 of 2 generates for 200 s of its 600 s deadline: the task's idle timeout (120 s)
    closed it as timed out while the step ran, and its completion counted for nothing."""
    pipeline = Pipeline()
    task = dict(tenant="acme", task_id="tk", steps_total=2)
    for step, (start, end) in enumerate([(0, 1_000), (2_000, 202_000)], start=1):
        rid = f"s{step}"
        pipeline.send(Queued(event_time_ms=T + start, request_id=rid, prompt_tokens=1,
                             max_tokens=2, created_ms=T + start, deadline_ms=T + start + 600_000,
                             step=step, **task))
        pipeline.sweep(T + end - 1_000)  # event time passes while the step runs
        pipeline.send(Completed(event_time_ms=T + end, request_id=rid, worker_id="w",
                                prompt_tokens=1, output_tokens=2, e2e_s=(end - start) / 1000,
                                tenant="acme", task_id="tk"))
    tenant = pipeline.values("tenant:acme")
    assert (tenant["tasks_closed"], tenant["tasks_succeeded"], tenant["tasks_timed_out"]) == (
        1, 1, 0)


def test_one_off_tenants_are_forgotten_after_the_scope_retention():
    """2,000 tenants of one request each, one a second for 33 minutes, left 2,000 running
    totals and their buckets, and each tick published 6,006 snapshots."""
    pipeline = Pipeline(StreamsSettings(scope_retention_s=300))
    for i in range(2_000):
        pipeline.send(Rejected(event_time_ms=T + i * 1000, request_id=f"r{i}", tenant=f"t{i}",
                               reason="load_shed"))
    totals = {k for k in pipeline.tables["windows"] if k.endswith("|total")}
    tenants = {int(k.split("|")[0][len("tenant:t"):]) for k in totals if k.startswith("tenant:")}
    # each partition looks for idle keys once a minute of its event time, idle at the allowed
    # lateness (30 s) before it: 330 to 390 s kept
    assert min(tenants) >= 2_000 - 391 and set(range(1_670, 2_000)) <= tenants
    buckets = {k.split("|")[0] for k in pipeline.tables["windows"] if k.startswith("tenant:")
               and not k.endswith("|total")}
    assert buckets == {f"tenant:t{i}" for i in tenants}  # a forgotten key's buckets go too
    published = {s.key for s in pipeline.snapshots() if s.scope == "tenant"}
    assert published == {f"t{i}" for i in range(1_699, 2_000)}  # 300 s before the newest event


def test_an_event_stamped_far_ahead_of_the_clock_is_refused_and_moves_no_window():
    """One Queued stamped a year ahead moved its partition's watermark there: every later event
    of every scope key of that partition was late, and the 10 s window empty from then on."""
    now = T + 2_000
    pipeline = Pipeline(clock=lambda: now)
    for i in range(5):
        pipeline.send(_queued(f"r{i}", T + i * 100), _completed(f"r{i}", T + i * 100 + 50))
    pipeline.send(_queued("ahead", T + 365 * 86_400_000))
    for i in range(5, 10):
        pipeline.send(_queued(f"r{i}", T + i * 100), _completed(f"r{i}", T + i * 100 + 50))
    [(record, why)] = pipeline.dead_letters
    assert record.value.request_id == "ahead" and "max_event_ahead_s = 10 s" in why
    window = pipeline.values("tenant:acme", 10.0)
    assert (window["queued"], window["completed"]) == (10, 10)
    assert "late_events" not in pipeline.values("tenant:acme")


def test_a_heartbeat_stamped_ahead_does_not_silence_its_worker():
    """After one heartbeat an hour ahead (a clock stepped back by NTP) every later heartbeat of
    the worker was older than its last and dropped: it showed as dead while it ran."""
    def beat(t: int) -> WorkerStatus:
        return WorkerStatus(event_time_ms=t, worker_id="w1", slot=0, pool="h100@llama-3-8b",
                            gpu_type="h100", running=1, started_ms=T)

    clock = [T]
    pipeline = Pipeline(clock=lambda: clock[0])
    pipeline.send(beat(T), beat(T + 500), beat(T + 3_600_000))
    for i in range(2, 20):
        clock[0] = T + i * 500
        pipeline.send(beat(T + i * 500))
    assert len(pipeline.dead_letters) == 1
    view = pipeline.stages.fleet_view(None, T + 10_000)[0].values
    assert (view["last_seen_ms"], view["live"]) == (T + 9_500, 1.0)
    assert pipeline.values("worker:w1")["provisioned_s"] == pytest.approx(9.5)


@pytest.mark.parametrize(("ahead_ms", "refused"), [(10_000, False), (10_001, True)])
def test_events_up_to_max_event_ahead_s_ahead_are_taken(ahead_ms, refused):
    pipeline = Pipeline(clock=lambda: T)
    pipeline.send(_queued("r", T + ahead_ms))
    assert len(pipeline.dead_letters) == int(refused)


def _tasks(pipeline: Pipeline) -> tuple[int, int, int]:
    values = pipeline.values("tenant:acme")
    return tuple(int(values.get(k, 0)) for k in ("tasks_closed", "tasks_succeeded",
                                                  "tasks_timed_out"))


def _step_queued(rid: str, step: int, t: int) -> Queued:
    return Queued(event_time_ms=t, request_id=rid, prompt_tokens=1, max_tokens=2, created_ms=t,
                  tenant="acme", task_id="tk", step=step, steps_total=3)


def _step_request(rid: str, step: int, t: int) -> InferenceRequest:
    return InferenceRequest(event_time_ms=t, request_id=rid, prompt_tokens=1, max_tokens=2,
                            created_ms=t, tenant="acme", task_id="tk", step=step, steps_total=3)


def _step_completed(rid: str, t: int) -> Completed:  # a task_id, but no step nor steps_total
    return Completed(event_time_ms=t, request_id=rid, worker_id="w", prompt_tokens=1,
                     output_tokens=2, e2e_s=0.5, tenant="acme", task_id="tk")


@pytest.mark.parametrize("told_by", ["queued", "request", "both"])
def test_a_completion_read_before_its_queued_and_request_waits_for_its_step(told_by):
    """Step 1 of 3's Completed read before its Queued and its InferenceRequest (other producers,
    another topic) was taken as step 1 of 1: the task closed as succeeded after one step."""
    pipeline = Pipeline()
    pipeline.send(_step_completed("s1", T + 500))
    assert _tasks(pipeline) == (0, 0, 0)
    if told_by in ("request", "both"):
        pipeline.send(_step_request("s1", 1, T), topic="requests")
    if told_by in ("queued", "both"):
        pipeline.send(_step_queued("s1", 1, T))
        pipeline.send(_step_queued("s1", 1, T))  # re-sent by a router after a crash: one step
    assert _tasks(pipeline) == (0, 0, 0)  # step 1 of 3 done
    for step, rid in ((2, "s2"), (3, "s3")):
        t = T + 1_000 * step
        pipeline.send(_step_queued(rid, step, t))
        assert _tasks(pipeline) == (0, 0, 0)
        pipeline.send(_step_completed(rid, t + 500))
    assert _tasks(pipeline) == (1, 1, 0)


def test_a_completion_whose_request_is_never_read_holds_no_task_open():
    """Its step is never known: its task times out as one making no progress does (120 s of
    event time after its last), and the request is forgotten 300 s after its end, as any."""
    pipeline = Pipeline()
    pipeline.send(_step_queued("s1", 1, T))
    pipeline.send(_step_completed("s1", T + 500))
    pipeline.send(_step_completed("s2", T + 1_500))  # step 2: its Queued is never read
    pipeline.sweep(T + 120_400)
    assert _tasks(pipeline) == (0, 0, 0)
    pipeline.sweep(T + 120_600)
    assert _tasks(pipeline) == (1, 0, 1)
    pipeline.sweep(T + 301_400)
    assert "s2" in pipeline.tables["requests"]
    pipeline.sweep(T + 301_600)
    assert "s2" not in pipeline.tables["requests"]


def _pod(g: int, t0: int) -> list:
    """Pod ``g`` of a deployment whose worker ids change at each restart: 30 s of heartbeats
    from ``t0``, one request running 10 s alone on it, then a stop."""
    w, rid = f"pod-{g}", f"r{g}"
    beats = [WorkerStatus(event_time_ms=t0 + i * 1000, worker_id=w, slot=0, pool="h100@m",
                          gpu_type="h100", models_loaded=["m"], running=int(5 <= i < 15),
                          state="stopped" if i == 30 else "warm", started_ms=t0)
             for i in range(31)]
    common = dict(request_id=rid, tenant="acme", created_ms=t0 + 4_000)
    request = [_queued(rid, t0 + 4_000),
               Started(event_time_ms=t0 + 5_000, worker_id=w, **common),
               Completed(event_time_ms=t0 + 15_000, worker_id=w, prompt_tokens=10,
                         output_tokens=5, e2e_s=11.0, **common)]
    return sorted(beats + request, key=lambda m: m.event_time_ms)


def test_workers_gone_for_good_are_deleted_and_the_totals_stay():
    """300 pods, one a minute for 5 hours, each with a worker id of its own: the worker table
    kept every one of them (and its changelog, and the fleet view's pass over them every tick)."""
    pipeline = Pipeline()
    for g in range(300):
        t0 = T + g * 60_000
        pipeline.send(*_pod(g, t0))
        pipeline.sweep(t0 + 31_000)
    kept = {int(w[len("pod-"):]) for w in pipeline.tables["workers"]}
    # a worker is kept RETENTION_S (65 minutes) after its last heartbeat, then deleted
    assert kept == set(range(300 - 65, 300))
    fleet = pipeline.values("fleet:all")
    assert fleet["spend_usd"] == pytest.approx(300 * 30 * H100_S)
    assert fleet["attributed_usd"] == pytest.approx(300 * 10 * H100_S)
    assert fleet["task_cost_usd"] == pytest.approx(300 * 10 * H100_S)
    assert (fleet["tasks_succeeded"], fleet["completed"]) == (300, 300)
    assert fleet.get("attempts_uncharged", 0) == 0


def _paused_workers_late_hand_back(forgotten: bool) -> Pipeline:
    """r1 runs on w-a (attempt 1), whose worker pauses; the router resumes it on w-b (attempt 2),
    which completes it; w-a, resumed, hands attempt 1 back: after the streams forgot r1
    (``request_retention_s`` on) or before."""
    pipeline = Pipeline()
    common = dict(request_id="r1", tenant="acme", created_ms=T)
    pipeline.send(Queued(event_time_ms=T, prompt_tokens=10, max_tokens=20, **common),
                  Started(event_time_ms=T + 100, worker_id="w-a", attempt=1, **common),
                  Started(event_time_ms=T + 9_000, worker_id="w-b", attempt=2, **common),
                  Completed(event_time_ms=T + 10_000, worker_id="w-b", attempt=2,
                            prompt_tokens=10, output_tokens=20, e2e_s=10.0, **common))
    late = T + 10_000 + (301_000 if forgotten else 60_000)
    if forgotten:
        pipeline.sweep(late)
    pipeline.send(Requeued(event_time_ms=late, worker_id="w-a", attempt=1, tokens_done=5,
                           **common))
    return pipeline


@pytest.mark.parametrize("forgotten", [False, True])
def test_a_hand_back_read_after_its_requests_end_is_not_a_requeue(forgotten):
    pipeline = _paused_workers_late_hand_back(forgotten)
    for scope_key in ("fleet:all", "tenant:acme", "model:llama-3-8b"):
        values = pipeline.values(scope_key)
        assert values["requeued"] == 0, scope_key
        assert values["requeued_after_end"] == 1, scope_key
        assert (values["completed"], values["started"], values["retries"]) == (1, 2, 1)
    assert ("r1" in pipeline.stages.request_book.table) is not forgotten  # not held again


def test_a_failure_taken_back_leaves_no_window_below_zero():
    """w-a's failure (1 s) is read before the Started on w-b (12 s) of the attempt the router
    resumed the request with: it is taken back at its own time. Taken back at the Started's, the
    10 s window ending at 14 s held the take-back and not the failure: ``failed`` -1 and a
    ``success_rate`` of 2.0 over two completions; the pool's too."""
    pipeline = Pipeline()
    common = dict(tenant="acme", created_ms=T)
    beats = [WorkerStatus(event_time_ms=T + s * 1000, worker_id=w, slot=0, pool="h100@m",
                          gpu_type="h100", started_ms=T) for s in range(15) for w in ("w-a", "w-b")]
    events = [_queued("r0", T), _queued("r1", T),
              Started(event_time_ms=T + 100, request_id="r0", worker_id="w-a", **common),
              Failed(event_time_ms=T + 1_000, request_id="r0", reason="worker_lost",
                     worker_id="w-a", **common),
              Started(event_time_ms=T + 12_000, request_id="r0", worker_id="w-b", attempt=2,
                      **common),
              Started(event_time_ms=T + 12_500, request_id="r1", worker_id="w-b", **common),
              Completed(event_time_ms=T + 13_000, request_id="r0", worker_id="w-b", attempt=2,
                        prompt_tokens=10, output_tokens=5, e2e_s=13.0, **common),
              Completed(event_time_ms=T + 14_000, request_id="r1", worker_id="w-b",
                        prompt_tokens=10, output_tokens=5, e2e_s=14.0, **common)]
    pipeline.send(*sorted(beats + events, key=lambda m: m.event_time_ms))
    for scope_key in ("fleet:all", "tenant:acme", "pool:h100@m"):
        window = pipeline.values(scope_key, 10.0)
        assert (window["completed"], window["failed"]) == (2, 0), scope_key
        assert window["success_rate"] == 1.0, scope_key
        total = pipeline.values(scope_key)
        assert (total["completed"], total["failed"], total["success_rate"]) == (2, 0, 1.0)


@pytest.mark.parametrize("end", ["rejected", "failed", "cancelled"])
def test_a_failure_read_before_its_steps_queued_and_request_fails_its_task(end):
    """Step 1 of 3 completed; step 2's refusal or failure, read before its Queued and its
    InferenceRequest, names no step. Taken as step 1, which had succeeded, it changed nothing:
    the task closed as timed out 120 s later, where the report counts it failed."""
    pipeline = Pipeline()
    pipeline.send(_step_queued("s1", 1, T), _step_completed("s1", T + 500))
    names = dict(event_time_ms=T + 1_000, request_id="s2", tenant="acme", task_id="tk")
    pipeline.send({"rejected": Rejected(reason="load_shed", **names),
                   "failed": Failed(reason="engine_error", worker_id="w", **names),
                   "cancelled": Cancelled(reason="client", **names)}[end])
    assert _tasks(pipeline) == (1, 0, 0)
    assert pipeline.values("tenant:acme")["tasks_failed"] == 1
    pipeline.send(_step_request("s2", 2, T + 1_000), topic="requests")
    pipeline.sweep(T + 200_000)
    assert _tasks(pipeline) == (1, 0, 0)


def test_a_pools_running_total_keeps_the_identities_of_the_last_hours_workers_only():
    """100 pods, one a minute, each with a worker id of its own: the pool's running total kept
    the identity of each one's relays for good (50 bytes a worker id in one changelog record),
    and counts each relay once still."""
    pipeline = Pipeline()
    for g in range(100):
        t0 = T + g * 60_000
        pipeline.send(*_pod(g, t0))
        pipeline.sweep(t0 + 31_000)
    sources = pipeline.tables["windows"]["pool:h100@m|total"]["hw"]
    relayed = {source.partition(":")[2] for source in sources if source.startswith("r")}
    assert relayed and relayed <= {f"pod-{g}" for g in range(100 - 62, 100)}
    pool = pipeline.values("pool:h100@m")
    assert (pool["started"], pool["completed"]) == (100, 100)
    pipeline.replay(pipeline.log[-300:])  # (a crash's: the last pods' records read again)
    assert pipeline.values("pool:h100@m") == pool


def test_a_ratio_past_the_largest_float_is_left_out_and_the_snapshots_stay_valid():
    """A GPU price the configuration takes (any number from 0) of 1e-310 USD an hour makes
    spends so small that successes over them are past the largest float: ``inf``, which no
    snapshot may carry, so every tick's publication failed, for every key."""
    prices = {"h100": 1e-310, "a100": 1e-310}
    pipeline = Pipeline(StreamsSettings(gpu_prices_usd_per_hour=prices))
    pipeline.send(*cost_scenario(T))
    fleet = pipeline.values("fleet:all")  # (the snapshots are made and validated)
    assert fleet["spend_usd"] > 0 and "success_per_dollar" not in fleet
    assert fleet["completed"] == 5
