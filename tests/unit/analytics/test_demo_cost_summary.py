"""``governor demo --json`` gives the store's account of the run's cost beside the live one:
``analytics_spend_usd``, ``analytics_gpu_hours``, ``analytics_tasks_succeeded`` and
``analytics_cost_per_successful_task_usd`` (``governor report cost`` summed), which equal the
live ``fleet:all`` running total's ``spend_usd``, ``gpu_hours``, ``tasks_succeeded`` and
``spend_per_successful_task_usd`` over the same events, within the report's rounding.

The same events (``streams.synthetic.cost_scenario``: a requeued attempt, a failed step, a shed
request) go to the in-memory pipeline (the stages the Faust workers run) and, as the sink writes
them, to a chdb store."""

import datetime as dt

import pytest

from analytics.progress import cost_summary
from analytics.query import StoreSource
from streams.pipeline import Pipeline
from streams.synthetic import cost_scenario
from tests.unit.analytics.test_last_attempt import _write

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
T0 = int((_today - dt.timedelta(hours=23)).timestamp() * 1000)


def test_the_store_and_the_live_signals_give_one_cost(store):
    messages = cost_scenario(T0)
    _write(store, 1, [("requests" if m.type == "inference_request" else "telemetry", m)
                      for m in messages])
    summary = cost_summary(StoreSource(store))
    pipeline = Pipeline()
    pipeline.send(*messages)
    live = pipeline.values("fleet:all")
    # 20 s of an h100 ($3.00/h) and of an a100 ($1.80/h); task-a and c1 succeeded
    assert summary == {
        "analytics_spend_usd": pytest.approx(live["spend_usd"], abs=3e-6),
        "analytics_gpu_hours": pytest.approx(live["gpu_hours"], abs=0.00015),
        "analytics_tasks_succeeded": live["tasks_succeeded"],
        "analytics_cost_per_successful_task_usd":
            pytest.approx(live["spend_per_successful_task_usd"], abs=3e-6)}
    assert summary["analytics_tasks_succeeded"] == 2
    assert summary["analytics_spend_usd"] == pytest.approx(20 * (3.00 + 1.80) / 3600, abs=3e-6)


def test_an_empty_store_has_no_cost_per_successful_task(store):
    assert cost_summary(StoreSource(store)) == {
        "analytics_spend_usd": 0, "analytics_gpu_hours": 0, "analytics_tasks_succeeded": 0,
        "analytics_cost_per_successful_task_usd": None}
