"""A streams worker whose send fails mid-batch stops, committing nothing past the batch, and the
worker started after it counts the whole stream exactly once, on the real broker.

Before, Faust acknowledged the failed batch's events and restarted the agent in the same
process, whose next batch wrote the failed batch's state back to the changelog: the worker went
on, its observations lost (the provisioned time of a heartbeat among them)."""

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from streams.pipeline import Pipeline
from streams.synthetic import synthetic_telemetry
from streams_support import (
    SignalsReader, differences, matches, produce, start_streams_worker, stop, wait_for_members,
)

pytestmark = pytest.mark.integration

#: The streams worker whose first send of observations fails half-way.
FLAKY = "flaky_streams_worker.py"
KEYS = ["fleet:all", "tenant:tenant-0", "tenant:tenant-1", "model:llama-3-8b"]


async def _scenario(bootstrap, catalog, tmp_path):
    messages, _counts = synthetic_telemetry(int(time.time() * 1000) - 20_000, 120, workers=4,
                                            spacing_ms=40)
    whole = Pipeline()
    whole.send(*messages)
    group = f"{catalog.namespace}.streams"
    flaky = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "flaky.log",
                                 launcher=(str(Path(__file__).with_name(FLAKY)),))
    try:
        await wait_for_members(bootstrap, group, 1, 90, [flaky])
        await produce(bootstrap, catalog, messages)
        try:
            status = await asyncio.to_thread(flaky.wait, 60)
        except subprocess.TimeoutExpired:
            status = None
    finally:
        stop(flaky)
    assert status not in (None, 0), f"the worker whose send failed went on ({status})"
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "second.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await signals.wait_until(
                lambda: all(matches(signals.total(k), whole.values(k)) for k in KEYS), 90,
                "the whole stream's signals from the worker after it", [worker],
                lambda: {k: differences(signals.total(k), whole.values(k)) for k in KEYS})
    finally:
        stop(worker)
    return (tmp_path / "flaky.log").read_text()


def test_a_worker_whose_send_fails_stops_and_the_next_counts_everything_once(
        kafka_bootstrap, catalog, tmp_path):
    log = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    assert log.count("the streams worker stops, committing nothing more") == 1, log[-3000:]
    # told once: before 7 Dec mode's "Crashed reason=..." said it again, with its traceback
    assert "Crashed reason=" not in log and log.count("Traceback") == 1, log[-3000:]
