"""Tests of controllers.router.task_admission: which new tasks start when the fleet is overloaded.

Capacities are set through ``target_load``: until a gap between steps is measured a task counts
its work over ``window_s``, so two workers at ``target_load`` x have room for ``2 x window_s x``
GPU-seconds of work starting in a window.
"""

from __future__ import annotations

from typing import Any

import pytest

from controllers.router.candidates import perf_model
from controllers.router.core import RouterCore
from controllers.router.task_admission import (
    MAX_BATCH, CacheMisses, TaskAdmission, expected_work_s,
)
from router_factories import MODEL, T0, request_factory, status_factory, view_factory
from schemas.commands import TenantLimit
from schemas.config import GovernorConfig, TaskAdmissionConfig

WORKERS = [view_factory("w0", 0), view_factory("w1", 1)]
PERF = perf_model("h100", MODEL)


def task(task_id: str, steps: int = 4, **fields: Any):
    return request_factory(f"{task_id}-1", task_id=task_id, step=1, steps_total=steps,
                           model=MODEL, **fields)


def work(request) -> float:
    return expected_work_s(request, PERF)


def gate(capacity_s: float, window_s: float = 30.0) -> TaskAdmission:
    """Task admission whose two workers have room for ``capacity_s`` GPU-seconds of work starting
    in a window (of tasks whose span is not known)."""
    return TaskAdmission(TaskAdmissionConfig(window_s=window_s,
                                             target_load=capacity_s / len(WORKERS) / window_s))


def learn_gap(ta: TaskAdmission, gap_s: float, until_ms: int, steps: int = 9) -> None:
    """Has ``ta`` measure ``gap_s`` between the steps of a task whose last is at ``until_ms``."""
    start = until_ms - int((steps - 1) * gap_s * 1000)
    for k in range(1, steps + 1):
        at = start + int((k - 1) * gap_s * 1000)
        ta.admit(request_factory(f"g-{k}", task_id="g", step=k, steps_total=steps, model=MODEL,
                                 prompt_tokens=16, max_tokens=1, created_ms=at), WORKERS, at)


# --- expected work ---------------------------------------------------------------------------

def test_one_step_is_its_prefill_and_its_answer_at_the_largest_batch() -> None:
    request = request_factory(prompt_tokens=1_000, max_tokens=200, model=MODEL)
    batch = min(MAX_BATCH, PERF.kv_capacity_tokens() // 1_200)
    expected = PERF.prefill_s(1_000) + 200 * PERF.decode_step_s(batch, 1_100) / batch
    assert work(request) == pytest.approx(expected)


def test_each_later_step_costs_more_than_the_one_before() -> None:
    works = [work(task("t", steps=n, prompt_tokens=500, max_tokens=300)) for n in range(1, 13)]
    steps = [b - a for a, b in zip(works, works[1:])]
    assert all(b > a for a, b in zip(steps, steps[1:]))  # the history each step re-sends grows
    assert works[11] > 12 * works[0]


def test_steps_past_the_64_estimated_each_count_as_the_64th() -> None:
    last = work(task("t", steps=64)) - work(task("t", steps=63))
    assert work(task("t", steps=10_000)) == pytest.approx(
        work(task("t", steps=64)) + (10_000 - 64) * last)


def test_a_missing_prefix_cache_prefills_that_share_of_each_steps_history() -> None:
    request = task("t", steps=2, prompt_tokens=1_000, max_tokens=200)
    decode = sum(200 * PERF.decode_step_s(b, ctx) / b for b, ctx in (
        (min(MAX_BATCH, PERF.kv_capacity_tokens() // 1_200), 1_100),
        (min(MAX_BATCH, PERF.kv_capacity_tokens() // 2_400), 2_300)))
    cached = PERF.prefill_s(1_000) + PERF.prefill_s(1_200)  # step 2 prefills its new 1,200
    missed = PERF.prefill_s(1_000) + PERF.prefill_s(1_760)  # 80% of step 2's 2,200
    assert expected_work_s(request, PERF) == pytest.approx(cached + decode)
    assert expected_work_s(request, PERF, miss_rate=0.1) == pytest.approx(cached + decode)
    assert expected_work_s(request, PERF, miss_rate=0.8) == pytest.approx(missed + decode)


def _cache(worker: str, at_s: float, queries: int, hits: int):
    return status_factory(worker, at=T0 + int(at_s * 1000), prefix_cache_queries=queries,
                          prefix_cache_hits=hits)


def test_cache_misses_are_the_share_missed_in_the_window_across_workers() -> None:
    misses = CacheMisses()
    heard = [(_cache("w0", 0, 100, 50), 0), (_cache("w1", 0, 0, 0), 0),  # first reports: baselines
             (_cache("w0", 5, 1_100, 850), 5),  # 1,000 queries, 800 hits
             (_cache("w1", 5, 1_000, 400), 5),  # 1,000 queries, 400 hits
             (_cache("w2", 0, 0, 0), 0), (_cache("w2", 5, 0, 0), 5)]  # reports no prefix cache
    assert misses.rate(MODEL, 20.0, 30.0) is None  # nothing reported yet
    for status, at_s in heard:
        misses.heard(status, at_s, 30.0)
    assert misses.rate(MODEL, 20.0, 30.0) == pytest.approx(0.4)  # 800 missed of 2,000
    misses.heard(_cache("w1", 6, 10, 0), 6, 30.0)  # w1 restarted: its counters start again
    assert misses.rate(MODEL, 20.0, 30.0) == pytest.approx(0.4)
    misses.heard(_cache("w1", 7, 110, 100), 7, 30.0)  # 100 queries, 100 hits since the restart
    assert misses.rate(MODEL, 20.0, 30.0) == pytest.approx(800 / 2_100)
    assert misses.rate(MODEL, 40.0, 30.0) is None  # all of it older than the window
    assert misses.rate("another-model", 20.0, 30.0) is None  # no worker of it reported


def test_cache_misses_keep_only_the_window_however_long_nobody_asks() -> None:
    misses = CacheMisses()
    for i in range(10_000):  # a heartbeat a second for ten thousand seconds, no task judged
        misses.heard(_cache("w0", i, 100 * (i + 1), 50 * (i + 1)), float(i), 30.0)
    assert len(misses._models[MODEL].deltas) <= 31
    assert misses.rate(MODEL, 9_999.0, 30.0) == pytest.approx(0.5)


def test_cache_misses_over_a_long_window_keep_a_bounded_number_of_deltas() -> None:
    """``window_s`` 3,600 (its limit), four workers heart-beating every 0.5 s: an hour at half
    the prompt tokens missed, then an hour at a tenth. The deltas are kept a bucket of a
    thousandth of the window each (before 7 Dec, one a heartbeat: 28,800 here, about 7M at
    1,000 workers), and the share is the last hour's."""
    misses = CacheMisses()
    totals = {f"w{n}": [0, 0] for n in range(4)}
    for tick in range(2 * 7_200 + 1):
        at_s, hit_share = tick / 2, 0.5 if tick <= 7_200 else 0.9
        for worker, total in totals.items():
            total[0] += 100
            total[1] += round(100 * hit_share)
            misses.heard(_cache(worker, at_s, *total), at_s, 3_600.0)
        if tick == 7_200:
            assert misses.rate(MODEL, at_s, 3_600.0) == pytest.approx(0.5)
    assert len(misses._models[MODEL].deltas) <= 1_001
    assert misses.rate(MODEL, 7_200.0, 3_600.0) == pytest.approx(0.1, abs=1e-3)


def test_cache_misses_forget_workers_gone_quiet() -> None:
    misses = CacheMisses()
    for i in range(10_000):  # a new worker every second (scaled out, scaled in), each heard twice
        misses.heard(_cache(f"w{i}", i, 100, 50), float(i), 30.0)
        misses.heard(_cache(f"w{i}", i + 0.5, 200, 100), i + 0.5, 30.0)
    assert len(misses._last) <= 62
    assert misses.rate(MODEL, 9_999.5, 30.0) == pytest.approx(0.5)


def test_the_core_judges_tasks_by_the_prefix_cache_misses_its_workers_report() -> None:
    shape = dict(steps=8, prompt_tokens=2_000, max_tokens=200)
    cached = expected_work_s(task("t", **shape), PERF)
    missed = expected_work_s(task("t", **shape), PERF, 1.0)
    assert missed > 1.5 * cached
    # The fleet has room for more than one such task's work in a window if the history of
    # each step is cached, less if the cache misses all of it.
    room = (cached + missed) / 2 / len(WORKERS) / 30.0
    outcomes = []
    for reports in (False, True):
        core = RouterCore(GovernorConfig(task_admission=TaskAdmissionConfig(target_load=room)))
        for at, queries in ((T0 - 1_000, 1_000), (T0, 2_000)):  # no hits
            for i in range(2):
                core.observe(status_factory(f"w{i}", i, at=at, prefix_cache_queries=queries
                                            if reports else 0), at)
        assert core.route(task("first", **shape), T0).dispatch is not None  # nothing ahead
        outcomes.append(core.route(task("second", **shape), T0).dispatch is not None)
    assert outcomes == [True, False]  # no reports: all history cached; all missed: too much


# --- admission ---------------------------------------------------------------------------------

def test_all_tasks_start_while_their_work_fits() -> None:
    small = [task(f"t{i}") for i in range(5)]
    ta = gate(capacity_s=sum(map(work, small)) * 1.01)
    assert [ta.admit(r, WORKERS, T0) for r in small] == [None] * 5


def test_overloaded_the_larger_tasks_are_refused_and_smaller_ones_still_start() -> None:
    small = [task(f"s{i}", steps=2) for i in range(4)]
    big = task("big", steps=12)
    ta = gate(capacity_s=sum(map(work, small[:3])) * 0.999)  # (under: rates round)
    assert [ta.admit(r, WORKERS, T0) for r in small[:3]] == [None] * 3
    denial = ta.admit(big, WORKERS, T0)
    assert denial is not None and denial.reason == "load_shed"
    assert "task big needs about" in denial.detail and "GPU-seconds" in denial.detail
    assert denial.retry_after_s == 30.0
    # A smaller task arriving after the big one comes before it: only the three are ahead of
    # it, and it starts past the mark (equal tasks go in order of arrival) only as the fourth.
    assert ta.admit(task("tiny", steps=1), WORKERS, T0) is None
    assert ta.admit(small[3], WORKERS, T0) is not None


def test_tasks_of_equal_size_are_admitted_in_order_of_arrival_up_to_the_mark() -> None:
    same = [task(f"t{i}") for i in range(6)]
    ta = gate(capacity_s=work(same[0]) * 2.5)
    assert [ta.admit(r, WORKERS, T0) is None for r in same] == [True] * 3 + [False] * 3


def test_a_task_larger_than_the_whole_window_starts_when_nothing_is_ahead_of_it() -> None:
    big = task("big", steps=12)
    ta = gate(capacity_s=work(big) / 10)
    assert ta.admit(big, WORKERS, T0) is None
    assert ta.admit(task("next", steps=12), WORKERS, T0) is not None


def test_higher_priority_comes_first_whatever_its_size() -> None:
    low = [task(f"low{i}", steps=2, priority=0) for i in range(3)]
    ta = gate(capacity_s=sum(map(work, low)))
    assert [ta.admit(r, WORKERS, T0) for r in low] == [None] * 3
    assert ta.admit(task("urgent", steps=12, priority=9), WORKERS, T0) is None
    assert ta.admit(task("low3", steps=2, priority=0), WORKERS, T0) is not None


def test_one_step_requests_are_never_refused_but_their_work_counts() -> None:
    singles = [request_factory(f"r{i}", prompt_tokens=4_000, max_tokens=500, model=MODEL)
               for i in range(5)]
    ta = gate(capacity_s=work(singles[0]))
    assert [ta.admit(r, WORKERS, T0) for r in singles] == [None] * 5
    workflow = task("t", steps=3, prompt_tokens=4_000, max_tokens=500)
    assert ta.admit(workflow, WORKERS, T0) is not None


def test_a_task_asked_about_again_gets_the_same_answer_and_counts_once() -> None:
    first, second = task("a", steps=6), task("b", steps=6)
    ta = gate(capacity_s=work(first) / 2)
    assert ta.admit(first, WORKERS, T0) is None
    assert ta.admit(second, WORKERS, T0) is not None
    # Routed again (held for want of a worker): the same answers, and nothing counted twice.
    assert ta.admit(first, WORKERS, T0 + 100) is None
    assert ta.admit(second, WORKERS, T0 + 100) is not None
    assert ta.admit(task("c", steps=1), WORKERS, T0 + 100) is None


def test_a_step_asked_about_again_leaves_its_task_to_be_forgotten_in_time() -> None:
    """Step 2 of task "a" at 0 s, held and routed again at 200 s; "b" at 100 s: at 650 s "a" has
    not been heard of for ``MAX_GAP_S`` (its step asked about again is no step) and is
    forgotten, so its step 3 at 700 s measures no gap of 700 s. Before 7 Dec the step asked
    about again put "a" behind "b" with its old time, and the expiry, which reads them in
    order, stopped at "b"."""
    ta = gate(capacity_s=1_000.0)

    def step(task_id: str, k: int, sent_s: int, at_s: int) -> None:
        ta.admit(request_factory(f"{task_id}-{k}", task_id=task_id, step=k, steps_total=9,
                                 created_ms=T0 + sent_s * 1000), WORKERS, T0 + at_s * 1000)

    step("a", 2, 0, 0)
    step("b", 2, 100, 100)
    step("a", 2, 0, 200)  # held for want of a worker, then routed again
    step("c", 2, 650, 650)
    step("a", 3, 700, 700)
    assert ta._gaps[MODEL].gap_s() is None


def test_a_step_heard_after_max_gap_s_with_no_traffic_between_measures_no_gap() -> None:
    """Task "a"'s step 3 comes 700 s after its step 2, and nothing else was heard in between
    (nothing ran the expiry): "a" is as forgotten as if other traffic had run it, so no gap of
    700 s is measured. Before, the task was looked up before the expiry ran, and its pause was
    sampled as a gap."""
    ta = gate(capacity_s=1_000.0)
    for k, at_s in ((2, 0), (3, 700)):
        ta.admit(request_factory(f"a-{k}", task_id="a", step=k, steps_total=9,
                                 created_ms=T0 + at_s * 1000), WORKERS, T0 + at_s * 1000)
    assert ta._gaps[MODEL].gap_s() is None


def test_the_window_forgets_tasks_older_than_window_s() -> None:
    ta = gate(capacity_s=0.001, window_s=10.0)
    assert ta.admit(task("a"), WORKERS, T0) is None
    assert ta.admit(task("b"), WORKERS, T0 + 1_000) is not None
    # Ten seconds on, "a" and "b" have left the window: nothing is ahead of "c".
    assert ta.admit(task("c"), WORKERS, T0 + 11_001) is None


def test_the_first_tasks_a_router_sees_are_the_tasks_in_progress() -> None:
    # Fifteen tasks at once, to a router that has seen none before, a window's room at 80%:
    # they are the tasks in progress, not the first second of a stream thirty times as fast.
    same = [task(f"t{i}", steps=8) for i in range(15)]
    ta = gate(capacity_s=work(same[0]) * 15 / 0.8)
    assert [ta.admit(r, WORKERS, T0) for r in same] == [None] * 15


def test_a_burst_of_long_tasks_is_spread_over_their_span_once_a_gap_is_measured() -> None:
    # Forty conversations of twelve turns start at once; their turns come 20 s apart, so each
    # runs about 220 s. Their work is three times what fits in a window, their rate half the
    # fleet's.
    burst = [task(f"b{i}", steps=12, created_ms=T0) for i in range(40)]
    total = sum(map(work, burst))
    config = TaskAdmissionConfig(target_load=total / 220.0 * 2 / len(WORKERS))
    assert total / 30.0 > 3 * config.target_load * len(WORKERS)
    measured, unknown = TaskAdmission(config), TaskAdmission(config)
    learn_gap(measured, 20.0, T0 - 1_000)
    assert [measured.admit(r, WORKERS, T0) for r in burst] == [None] * 40
    # Without a gap each counts all its work as arriving in the window: most are refused.
    assert sum(unknown.admit(r, WORKERS, T0) is not None for r in burst) >= 20


def test_in_steady_state_the_load_is_the_start_rate_times_the_work() -> None:
    # A conversation of eight turns 10 s apart (about 70 s each) starts every second for 300 s:
    # the offered load is a conversation's work a second, as the work of the conversations
    # starting in a window over the window was.
    shape = dict(steps=8, prompt_tokens=2_000, max_tokens=500)
    w = work(task("t", **shape))
    ta = TaskAdmission(TaskAdmissionConfig(target_load=w / len(WORKERS) / 1.25))  # 25% over
    learn_gap(ta, 10.0, T0)
    for i in range(300):
        at = T0 + 1_000 * i
        ta.admit(task(f"t{i}", created_ms=at, **shape), WORKERS, at)
    denial = ta.admit(task("next", created_ms=T0 + 300_000, **shape), WORKERS, T0 + 300_000)
    stated = float(denial.detail.split("the tasks in progress need ")[1].split("x")[0])
    assert stated == pytest.approx(w / len(WORKERS), rel=0.03)


def test_a_backlog_read_at_once_is_weighed_at_the_pace_its_clients_sent_it() -> None:
    # Twenty tasks sent over the last 30 s, read within 0.2 s (a router starting, or a model's
    # first worker coming up): about the fleet's capacity over those 30 s.
    sent = [task(f"t{i}", steps=8, created_ms=T0 - 30_000 + 1_500 * i) for i in range(20)]
    per_worker_s = sum(map(work, sent)) / len(WORKERS) / 30.0
    ta = TaskAdmission(TaskAdmissionConfig(window_s=30.0, target_load=per_worker_s * 1.1))
    assert [ta.admit(r, WORKERS, T0 + 10 * i) for i, r in enumerate(sent)] == [None] * 20
    # Each is in progress for a window from when it was sent: 15 s on, half have ended.
    more = [task(f"m{i}", steps=8, created_ms=T0 + 15_000) for i in range(10)]
    assert [ta.admit(r, WORKERS, T0 + 15_000) for r in more] == [None] * 10


def test_a_model_gone_quiet_keeps_no_tasks_past_the_window() -> None:
    ta = gate(capacity_s=100.0, window_s=10.0)
    for i in range(100):
        ta.admit(task(f"t{i}"), WORKERS, T0)
    other = request_factory("o1", task_id="o", step=1, steps_total=2, model="other-model")
    ta.admit(other, [view_factory(models=("other-model",))], T0 + 11_000)
    assert [len(w.tasks) for w in ta._in_progress.values()] == [0, 1]


def test_a_router_reading_half_the_requests_weighs_them_against_half_the_fleet() -> None:
    same = [task(f"t{i}") for i in range(4)]
    whole, half = (gate(capacity_s=work(same[0]) * 2.5) for _ in range(2))
    assert [whole.admit(r, WORKERS, T0) is None for r in same] == [True, True, True, False]
    assert [half.admit(r, WORKERS, T0, share=0.5) is None for r in same] == [True, True] + [False] * 2


@pytest.mark.parametrize("case", ["disabled", "later_step", "no_worker"])
def test_nothing_is_judged_when_off_for_later_steps_or_without_workers(case: str) -> None:
    config = TaskAdmissionConfig(enabled=case != "disabled", target_load=1e-6)
    ta = TaskAdmission(config)
    workers = [] if case == "no_worker" else WORKERS
    step = 2 if case == "later_step" else 1
    for i in range(3):
        request = request_factory(f"r{i}", task_id=f"t{i}", step=step, steps_total=12, model=MODEL)
        assert ta.admit(request, workers, T0) is None


@pytest.mark.parametrize(("field", "value"), [("window_s", 0), ("window_s", 3601),
                                              ("target_load", 0), ("target_load", 101)])
def test_config_limits_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TaskAdmissionConfig(**{field: value})


# --- through the router core ---------------------------------------------------------------------

def _core(policy: str = "governor", **settings: Any) -> RouterCore:
    config = GovernorConfig(routing_policy=policy,
                            task_admission=TaskAdmissionConfig(target_load=1e-6), **settings)
    core = RouterCore(config)
    for i in range(2):
        core.observe(status_factory(f"w{i}", i, at=T0), T0)
    return core


def test_the_core_refuses_a_task_that_does_not_fit_and_then_its_later_steps() -> None:
    core = _core()
    assert core.route(task("first"), T0).dispatch is not None
    refused = core.route(task("second"), T0)
    assert refused.denial is not None and refused.denial.reason == "load_shed"
    told = core.told(task("second"), refused.denial)
    assert told.retry_after_s is None and "fails with it" in told.detail  # no retry can help
    later = request_factory("second-2", task_id="second", step=2, steps_total=4, model=MODEL)
    assert core.route(later, T0 + 10).denial.reason == "task_failed"


def test_baseline_policies_admit_every_task() -> None:
    core = _core("round_robin")
    assert all(core.route(task(f"t{i}"), T0).dispatch is not None for i in range(5))


def test_a_refused_task_is_not_charged_to_its_tenant() -> None:
    limit = TenantLimit(requests_per_s=1.0, tokens_per_s=1e6, burst_s=1.0)
    core = _core(tenants={"acme": limit})
    assert core.route(task("first", tenant="acme"), T0).dispatch is not None
    core.observe(status_factory("w0", 0, at=T0 + 1_000), T0 + 1_000)
    core.observe(status_factory("w1", 1, at=T0 + 1_000), T0 + 1_000)
    assert core.route(task("second", tenant="acme"), T0 + 1_000).denial.reason == "load_shed"
    # The bucket refilled one request in that second and the refusal gave it back.
    alone = request_factory("single", tenant="acme", model=MODEL)
    assert core.route(alone, T0 + 1_000).dispatch is not None


def test_the_rate_ahead_is_the_sum_over_the_tasks_in_progress() -> None:
    import random

    from controllers.router.task_admission import _InProgress, _Task

    rng = random.Random(7)
    tasks = _InProgress()
    for i in range(2_000):
        work_s = rng.choice([rng.uniform(1e-4, 50.0), 1.25, 0.5])  # equal works too
        tasks.add(("t", str(i)), _Task(i * 0.01, i * 0.01 + 10.005, rng.randrange(10), work_s,
                                       4, work_s / rng.uniform(30.0, 300.0), True))
    tasks.expire(20.0)  # ends the first thousand
    assert len(tasks.tasks) == 1_000
    assert tasks.rate == pytest.approx(sum(t.rate for t in tasks.tasks.values()), rel=1e-9)
    for _ in range(200):
        priority, work_s = rng.randrange(10), rng.choice([rng.uniform(1e-4, 60.0), 1.25, 0.5])
        expected = sum(t.rate for t in tasks.tasks.values()
                       if t.priority > priority or (t.priority == priority and t.work_s <= work_s))
        assert tasks.ahead(priority, work_s) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_later_steps_of_models_no_live_worker_serves_leave_nothing_behind() -> None:
    # A client names the model: later steps of made-up models, routed (and refused, no worker
    # serving them) one after another, kept an entry each for good before 7 Dec
    core = RouterCore()
    core.fleet.observe(status_factory("w0", 0, at=T0))
    for i in range(1_000):
        for step in (2, 3):
            core.route(request_factory(f"r{i}-{step}", task_id=f"t{i}", step=step,
                                       steps_total=4, model=f"made-up-{i}"), T0 + step)
    assert core.task_admission._gaps == {}
    learn_gap(core.task_admission, 5.0, T0)  # (a served model's steps are still measured)
    assert list(core.task_admission._gaps) == [MODEL]
