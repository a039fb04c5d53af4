"""A task is in a report's window when its latest request is; its earlier steps count from up to
``TASK_LOOKBACK_DAYS`` (1) before the window began.

Each request is one step sent at its offset from now, and completes in time a second later on
``w1`` (one H100 heart-beating around it). ``--days 1`` reports on the last 24 hours.
"""

import datetime as dt

from analytics.outcomes import TASK_LOOKBACK_DAYS
from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

HOUR_MS = 3_600_000


def _step(task: str, step: int, total: int, sent_hours_ago: float) -> list[tuple[str, object]]:
    """(The clock is read here, as the test runs: read at import, the suite's minutes before a
    test moved a step sent 23 h 55 min ago out of the last day.)"""
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    sent = now - int(sent_hours_ago * HOUR_MS)
    common = {"request_id": f"{task}-{step}", "tenant": "acme", "model": "m", "created_ms": sent,
              "task_id": task}
    return [("telemetry", events.WorkerStatus(
                event_time_ms=sent - 1000 + i * 500, worker_id="w1", slot=0, pool="h100@m",
                gpu_type="h100", started_ms=now - 100 * HOUR_MS)) for i in range(6)] + [
        ("requests", InferenceRequest(event_time_ms=sent, step=step, steps_total=total,
                                      prompt_tokens=100, max_tokens=10, **common)),
        ("telemetry", events.Queued(event_time_ms=sent, prompt_tokens=100, max_tokens=10,
                                    step=step, steps_total=total, **common)),
        ("telemetry", events.Started(event_time_ms=sent, worker_id="w1", **common)),
        ("telemetry", events.Completed(event_time_ms=sent + 1000, worker_id="w1",
                                       prompt_tokens=100, output_tokens=10, e2e_s=1.0,
                                       **common))]


def _reports(store, *steps) -> tuple[float, list[tuple]]:
    _write(store, 1, [row for step in steps for row in step])
    source = StoreSource(store)
    tasks = sum(r["successful_tasks"] for r in run_report(source, "cost", days=1).dicts())
    failures = [(r["step"], r["outcome"], r["tasks"])
                for r in run_report(source, "task-failures", days=1).dicts()]
    return tasks, failures


def test_a_task_whose_first_step_was_sent_just_before_the_window_succeeds_in_it(store):
    assert _reports(store, _step("t", 1, 2, 24 + 5 / 60), _step("t", 2, 2, 23 + 55 / 60)) == (
        1, [])


def test_a_task_whose_latest_step_was_sent_before_the_window_is_not_in_it(store):
    assert _reports(store, _step("t", 1, 2, 24.5), _step("t", 2, 2, 24.2),
                    _step("failing", 1, 2, 24.1)) == (0, [])


def test_a_step_sent_more_than_the_lookback_before_the_window_counts_as_not_sent(store):
    assert TASK_LOOKBACK_DAYS == 1
    assert _reports(store, _step("t", 1, 2, 24 + 24 + 1), _step("t", 2, 2, 1)) == (
        0, [(1, "not_sent", 1)])
