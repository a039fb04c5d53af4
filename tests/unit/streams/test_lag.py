"""SignalWatch: each event's lag ends at the first fleet snapshot that includes it."""

import pytest

from schemas.events import Queued, SignalSnapshot, WorkerStatus
from streams.lag import SignalWatch

T = 1_700_000_000_000


def _snapshot(window_s, last, **values):
    return SignalSnapshot(event_time_ms=T, scope="fleet", key="all", window_s=window_s,
                          window_end_ms=T, values={"last_event_ms": last, **values})


def _queued(t):
    return Queued(event_time_ms=t, request_id=f"r{t}", prompt_tokens=1, max_tokens=1, created_ms=t)


def test_lag_runs_from_event_time_to_the_first_snapshot_that_includes_it():
    watch = SignalWatch()
    for t in (T, T + 100, T + 900):
        watch.note_event(_queued(t))
    watch.note_event(WorkerStatus(event_time_ms=T, worker_id="w", slot=0, pool="p", gpu_type="g",
                                  started_ms=T))  # heartbeats are not timed
    watch.note_snapshot(_snapshot(10, T + 100), seen_ms=T + 1000)
    watch.note_snapshot(_snapshot(10, T + 100), seen_ms=T + 2000)   # nothing new included
    watch.note_snapshot(_snapshot(60, T + 900), seen_ms=T + 2100)
    assert sorted(watch.lags_s) == [0.9, 1.0, 1.2]
    assert watch.unmatched == 0
    assert watch.lag_quantile_s(0.5) == pytest.approx(1.0)


def test_report_takes_cost_figures_from_the_running_total():
    watch = SignalWatch()
    watch.note_snapshot(_snapshot(42.0, T, cost_per_successful_task_usd=0.25,
                                  spend_per_successful_task_usd=0.5, tasks_succeeded=4,
                                  spend_usd=2.0, gpu_hours=0.66666), T)
    report = watch.report()
    # DESIGN.md's meaning, as `governor sim` reports it: all spend over the tasks that succeeded
    assert report["cost_per_successful_task_usd"] == 0.5 and report["tasks_succeeded"] == 4
    assert report["attributed_cost_per_successful_task_usd"] == 0.25
    assert type(report["tasks_succeeded"]) is int  # a count, as `governor sim` reports it
    assert report["signal_lag_p99_s"] is None
    # beside the store's account of them (analytics_spend_usd, analytics_gpu_hours)
    assert (report["spend_usd"], report["gpu_hours"]) == (2.0, 0.6667)
