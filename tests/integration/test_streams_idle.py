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


def _one_request(t: int, tenant: str, **queued) -> list:
    """A request of ``tenant`` queued at ``t``, started and completed on one worker, then
    nothing more."""
    common = dict(request_id=f"{tenant}-1", tenant=tenant, created_ms=t,
                  task_id=queued.pop("task_id", None))
    return [Queued(event_time_ms=t, prompt_tokens=10, max_tokens=5, **queued, **common),
            Started(event_time_ms=t + 100, worker_id=f"w-{tenant}", **common),
            Completed(event_time_ms=t + 500, worker_id=f"w-{tenant}", prompt_tokens=10,
                      output_tokens=5, e2e_s=0.5, **common)]


async def _then_quiet(bootstrap, catalog, tmp_path, messages, until) -> SignalsReader:
    """A streams worker whose idle partitions move on after 1 s; ``messages`` produced, then
    nothing while each ``(condition, what, explain)`` of ``until`` comes true in turn."""
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "worker.log",
                                  "--allowed-lateness-s", "1")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, f"{catalog.namespace}.streams", 1, 90, [worker])
            await produce(bootstrap, catalog, messages)
            for condition, what, explain in until(signals):
                await signals.wait_until(condition, 60, what, [worker], explain)
            return signals
    finally:
        stop(worker)


def test_a_task_whose_partitions_go_quiet_times_out(kafka_bootstrap, catalog, tmp_path):
    messages = _one_request(int(time.time() * 1000) - 200_000, "acme", task_id="t1", step=1,
                            steps_total=2)  # step 1 of 2, then nothing
    signals = asyncio.run(_then_quiet(kafka_bootstrap, catalog, tmp_path, messages, lambda s: [
        (lambda: s.total("tenant:acme").get("tasks_closed") == 1, "the idle task's timeout",
         lambda: s.total("tenant:acme"))]))
    total = signals.total("tenant:acme")
    assert (total["tasks_timed_out"], total["tasks_succeeded"], total["completed"]) == (1, 0, 1)
    log = (tmp_path / "worker.log").read_bytes()  # plain text: no terminal spinner's codes
    assert b"\x1b[" not in log and b"Ready" in log


def test_the_windows_of_keys_no_record_reaches_empty_with_the_clock(kafka_bootstrap, catalog,
                                                                   tmp_path):
    """A worker drained for good, a tenant gone quiet: their partitions of the by-scope topic
    receive nothing more, and their 10 s windows used to repeat their last values for good."""
    messages = _one_request(int(time.time() * 1000) - 3_000, "quiet")
    signals = asyncio.run(_then_quiet(kafka_bootstrap, catalog, tmp_path, messages, lambda s: [
        (lambda: s.window("tenant:quiet", "10").get("completed") == 1,
         "the completion in the 10 s window", lambda: s.window("tenant:quiet", "10")),
        (lambda: s.window("tenant:quiet", "10").get("completed") == 0,
         "the 10 s window to empty as the clock goes on", lambda: s.window("tenant:quiet", "10"))]))
    window = signals.window("tenant:quiet", "10")
    assert window["completed"] == 0 and window.get("requests_per_s", 0.0) == 0.0
    assert signals.total("tenant:quiet")["completed"] == 1  # the running total keeps it
