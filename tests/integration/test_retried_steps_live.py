"""On the real broker, the streams worker and the analytics sink (chdb) read the same events of
tasks whose steps were retried under new request ids, and count the same tasks succeeded and
not: a step succeeds when one of its requests completed in time (DESIGN.md).

Before 6 Dec the streams closed a task at its first failed, cancelled or late step, whatever a
retry of it did: live, 1 of the scenario's first 5 tasks succeeded; the report counted 4. Nor
did they take back a failure from the worker of an attempt the router had replaced, read before
the Started of the attempt that replaced it: that request (t6, added since) failed its task."""

import asyncio
import time

import pytest

from analytics.reports import run_report
from analytics.store import StoreLocation
from analytics_support import caught_up_sink
from streams.synthetic import (RETRIED_STEPS_FAILED, RETRIED_STEPS_SUCCEEDED,
                               retried_steps_scenario)
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration


def _live(signals: SignalsReader) -> tuple[float, float]:
    fleet = signals.total("fleet:all")
    return (fleet.get("tasks_succeeded", 0.0),
            fleet.get("tasks_failed", 0.0) + fleet.get("tasks_timed_out", 0.0))


async def _scenario(bootstrap, catalog, tmp_path):
    await produce(bootstrap, catalog, retried_steps_scenario(int(time.time() * 1000) - 30_000))
    location = StoreLocation.for_namespace(catalog.namespace, tmp_path / "analytics")
    async with caught_up_sink(bootstrap, catalog, location) as (_, reader, _):
        succeeded = sum(r["successful_tasks"] for r in run_report(reader, "cost").dicts())
        failed = sum(r["tasks"] for r in run_report(reader, "task-failures").dicts())
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "streams.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await signals.wait_until(
                lambda: _live(signals) == (succeeded, failed), 90,
                "the streams' task outcomes to be the report's", [worker],
                lambda: (_live(signals), (succeeded, failed)))
            return (succeeded, failed), signals.total("fleet:all")
    finally:
        stop(worker)


def test_the_streams_and_the_report_count_tasks_with_retried_steps_alike(
        kafka_bootstrap, catalog, tmp_path):
    report, fleet = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    assert report == (RETRIED_STEPS_SUCCEEDED, RETRIED_STEPS_FAILED)
    assert fleet["tasks_closed"] == RETRIED_STEPS_SUCCEEDED + RETRIED_STEPS_FAILED
    assert fleet["tasks_succeeded"] == RETRIED_STEPS_SUCCEEDED
