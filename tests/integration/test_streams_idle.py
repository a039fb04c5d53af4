"""A task whose partitions receive nothing more times out all the same, on the real broker: the
worker's timer moves the event time of partitions gone idle (here after 1 s) with the clock.

Before, a partition's event time was the newest read there, and the sweeps followed it: the
task below, its last step 200 s old, stayed open for good."""

import asyncio
import time

import pytest

from schemas.events import Completed, Queued, Started
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration


async def _scenario(bootstrap, catalog, tmp_path):
    t = int(time.time() * 1000) - 200_000
    common = dict(request_id="r1", task_id="t1", tenant="acme", created_ms=t)
    messages = [
        Queued(event_time_ms=t, prompt_tokens=10, max_tokens=5, step=1, steps_total=2,
               **common),
        Started(event_time_ms=t + 100, worker_id="w1", **common),
        Completed(event_time_ms=t + 1_000, worker_id="w1", prompt_tokens=10, output_tokens=5,
                  e2e_s=1.0, **common)]  # step 1 of 2, then nothing
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "worker.log",
                                  "--allowed-lateness-s", "1")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await produce(bootstrap, catalog, messages)
            await signals.wait_until(
                lambda: signals.total("tenant:acme").get("tasks_closed") == 1, 60,
                "the idle task's timeout", [worker], lambda: signals.total("tenant:acme"))
            return signals.total("tenant:acme")
    finally:
        stop(worker)


def test_a_task_whose_partitions_go_quiet_times_out(kafka_bootstrap, catalog, tmp_path):
    total = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    assert (total["tasks_timed_out"], total["tasks_succeeded"], total["completed"]) == (1, 0, 1)


async def _quiet_worker_scenario(bootstrap, catalog, tmp_path):
    t = int(time.time() * 1000) - 3_000
    common = dict(request_id="q1", tenant="quiet", created_ms=t)
    messages = [
        Queued(event_time_ms=t, prompt_tokens=10, max_tokens=5, **common),
        Started(event_time_ms=t + 100, worker_id="w-quiet", **common),
        Completed(event_time_ms=t + 500, worker_id="w-quiet", prompt_tokens=10, output_tokens=5,
                  e2e_s=0.5, **common)]  # then nothing, on any partition
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "worker.log",
                                  "--allowed-lateness-s", "1")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await produce(bootstrap, catalog, messages)
            await signals.wait_until(
                lambda: signals.window("tenant:quiet", "10").get("completed") == 1, 60,
                "the completion in the 10 s window", [worker],
                lambda: signals.window("tenant:quiet", "10"))
            await signals.wait_until(
                lambda: signals.window("tenant:quiet", "10").get("completed") == 0, 60,
                "the 10 s window to empty as the clock goes on", [worker],
                lambda: signals.window("tenant:quiet", "10"))
            return signals.window("tenant:quiet", "10"), signals.total("tenant:quiet")
    finally:
        stop(worker)


def test_the_windows_of_keys_no_record_reaches_empty_with_the_clock(kafka_bootstrap, catalog,
                                                                   tmp_path):
    """A worker drained for good, a tenant gone quiet: their partitions of the by-scope topic
    receive nothing more, and their 10 s windows used to repeat their last values for good."""
    window, total = asyncio.run(_quiet_worker_scenario(kafka_bootstrap, catalog, tmp_path))
    assert window["completed"] == 0 and window.get("requests_per_s", 0.0) == 0.0
    assert total["completed"] == 1  # the running total keeps it
