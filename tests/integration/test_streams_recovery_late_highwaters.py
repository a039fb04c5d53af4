"""A streams worker whose broker answers the recovery's request for the changelogs' highwaters
late (within the step's bound) says it waits for them, and says the tables are recovered once,
when Faust's recovery has ended, on the real broker.

Before 7 Dec the worker logged ``recovered the tables in 5.0 s: 0 records`` while the highwaters
were awaited: Faust drops its ``in_recovery`` whenever it knows of nothing left to read (its
changelog reader waits 5 s for a record), and the watch took that for the end. The late answer
comes from the support script (no real broker can be made slow on cue)."""

import asyncio
import re
import time
from pathlib import Path

import pytest

from streams.worker import ensure_topics, settings_for
from streams_support import start_streams_worker, stop

pytestmark = pytest.mark.integration

#: Past two of the changelog reader's 5 s waits for a record.
LATE_S = 12


def _wait_for_line(log: Path, worker, pattern: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, text := log.read_text()):
        assert worker.poll() is None, f"the worker exited: {text[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in {timeout_s} s: {text[-3000:]}"
        time.sleep(0.2)  # the worker's next line
    return text


def test_late_highwaters_are_waited_for_and_the_end_told_once(kafka_bootstrap, catalog,
                                                               tmp_path):
    asyncio.run(ensure_topics(settings_for(catalog.namespace, kafka_bootstrap)))
    log = tmp_path / "worker.log"
    worker = start_streams_worker(
        kafka_bootstrap, catalog.namespace, log,
        launcher=(str(Path(__file__).with_name("late_highwaters.py")), str(LATE_S)))
    try:
        text = _wait_for_line(log, worker, r"recovered the tables in", 120)
    finally:
        stop(worker)
    assert re.search(r"recovering the tables for \d+ s: waiting for the changelogs' end "
                     r"offsets \(\d+ changelog partitions\)", text), text[-3000:]
    recovered = [float(s) for s in re.findall(r"recovered the tables in ([\d.]+) s", text)]
    assert len(recovered) == 1 and recovered[0] >= LATE_S, text[-3000:]
