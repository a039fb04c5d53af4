"""The streams and the report count a task whose step was retried under a new request id alike:
it succeeds when each of its steps has a request that completed by its deadline (DESIGN.md),
whatever its other requests did and in whichever order they were read.

The same events (``streams.synthetic.retried_steps_scenario``) go to the in-memory pipeline (the
stages the Faust workers run) and, as the sink writes them, to a chdb store. Before 6 Dec the
streams closed a task at its first failed, cancelled or late step, and a later retry changed
nothing: 0 tasks succeeded live where the report counted 4. And a failure from the worker of an
attempt the router had replaced, read before the Started of the attempt that replaced it, ended
the request and failed its task, where the router, the audit and the report take it as no
state of the request (it completed)."""

import datetime as dt

from analytics.audit import run_audit
from analytics.query import StoreSource
from analytics.reports import run_report
from streams.pipeline import Pipeline
from streams.synthetic import (RETRIED_STEPS_FAILED, RETRIED_STEPS_SUCCEEDED,
                               retried_steps_scenario)
from tests.unit.analytics.test_last_attempt import _write

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
T0 = int((_today - dt.timedelta(hours=23)).timestamp() * 1000)


def _report_tasks(source: StoreSource) -> tuple[float, int]:
    """(successful tasks, tasks that did not succeed) by the report."""
    succeeded = sum(row["successful_tasks"] for row in run_report(source, "cost").dicts())
    failed = sum(row["tasks"] for row in run_report(source, "task-failures").dicts())
    return succeeded, failed


def _streams_tasks(messages, order=None) -> dict[str, float]:
    pipeline = Pipeline()
    pipeline.send(*(messages if order is None else order(messages)))
    return pipeline.values("fleet:all")


def test_the_streams_and_the_report_count_retried_steps_alike(store):
    messages = retried_steps_scenario(T0)
    _write(store, 1, [("telemetry", m) for m in messages])
    report = _report_tasks(StoreSource(store))
    assert report == (RETRIED_STEPS_SUCCEEDED, RETRIED_STEPS_FAILED)
    assert run_audit(StoreSource(store))["violations"] == 0  # (t6's failure is no state of it)
    fleet = _streams_tasks(messages)
    streams = (fleet["tasks_succeeded"], fleet["tasks_failed"] + fleet["tasks_timed_out"])
    assert streams == report
    assert fleet["tasks_closed"] == RETRIED_STEPS_SUCCEEDED + RETRIED_STEPS_FAILED
    failed = run_report(StoreSource(store), "rejections").dicts()  # (t2's and t5's, not t6's)
    assert fleet["failed"] == sum(r["requests"] for r in failed if r["outcome"] == "failed") == 2


def test_a_step_outcome_read_out_of_order_changes_nothing():
    """On Kafka a task's requests are on different partitions: their outcomes may reach the
    task's partition in any order. Reversed, the retries' completions come before the failures
    they retried."""
    in_order = _streams_tasks(retried_steps_scenario(T0))
    reversed_ = _streams_tasks(retried_steps_scenario(T0),
                               lambda ms: sorted(ms, key=lambda m: -m.event_time_ms))
    names = ("tasks_closed", "tasks_succeeded", "tasks_failed", "tasks_timed_out")
    assert [reversed_[n] for n in names] == [in_order[n] for n in names] == [
        RETRIED_STEPS_SUCCEEDED + RETRIED_STEPS_FAILED, RETRIED_STEPS_SUCCEEDED,
        RETRIED_STEPS_FAILED, 0]
