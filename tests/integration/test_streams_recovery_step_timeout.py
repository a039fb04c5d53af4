"""A streams worker whose broker has no answer for a step of the tables' recovery within
``broker_request_timeout`` logs an ERROR naming the step and the changelog partitions it was
recovering, and exits non-zero, on the real broker.

Before 7 Dec Faust ended its recovery task silently on such a timeout (mode answers a wait that
timed out as "stopped"): the worker sat for ever, its stream partitions paused, publishing
nothing, and no later rebalance recovered either. The step is the highwaters' request, which the
support script leaves unanswered (no real broker can be made to miss one on cue), with a bound
of 6 s rather than the worker's 90 s (6 s is the least: the session timeout's)."""

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from streams.worker import ensure_topics, settings_for
from streams_support import start_streams_worker, stop, the_one_error

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 6
#: Before 7 Dec the worker was still sitting after this long.
EXIT_WITHIN_S = 60


def test_a_recovery_step_without_an_answer_ends_the_worker(kafka_bootstrap, catalog, tmp_path):
    asyncio.run(ensure_topics(settings_for(catalog.namespace, kafka_bootstrap)))
    log = tmp_path / "worker.log"
    worker = start_streams_worker(
        kafka_bootstrap, catalog.namespace, log, "--recovery-stall-s", "600",
        launcher=(str(Path(__file__).with_name("unanswered_highwaters.py")), str(STEP_TIMEOUT_S)))
    try:
        status = worker.wait(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        status = None
    finally:
        stop(worker)
    text = log.read_text()
    assert status not in (None, 0), f"exit status {status}: {text[-3000:]}"
    error = the_one_error(text)
    assert re.search(
        r"the tables' recovery step _build_highwaters had no answer in "
        rf"{STEP_TIMEOUT_S} s \(the bound, broker_request_timeout\): the changelog partitions "
        rf"{re.escape(catalog.namespace)}\.streams-\w+-changelog\[0\], .* and \d+ more are not "
        "recovered", error), error
