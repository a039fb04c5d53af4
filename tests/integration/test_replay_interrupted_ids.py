"""``governor replay`` stopped partway names the ids of the requests it sent, where they are not
the trace's first rows: under ``--rate-scale`` a task's later step keeps its offset from the
task's start and is sent after rows below it (as in a closed loop, where a step waits for the
one before it). Before 7 Dec it named ``<run id>-000000 to <run id>-<sent - 1>``, the first
rows, some of them not sent, and left out ids it had sent. The real broker."""

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.traces import TraceRequest, write_governor_jsonl
from tests.integration.test_replay_closed_loop import records_on

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: at --rate-scale 20, rows 0-2, 4 and 5 are due within 3.2 s; the task's step 2 (row 3, 59 s
#: after its task's start, kept) at 59 s: the replay is stopped in between
ROWS = [TraceRequest(0.0, 64, 4),
        TraceRequest(1.0, 64, 4, task_id="t", steps_total=2),
        TraceRequest(2.0, 64, 4),
        TraceRequest(60.0, 64, 4, task_id="t", step=2, steps_total=2),
        TraceRequest(62.0, 64, 4),
        TraceRequest(64.0, 64, 4)]


def test_an_interrupted_replay_names_the_ids_it_sent(kafka_bootstrap, catalog, tmp_path):
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl(ROWS, trace)
    replay = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "replay", str(trace), "--bootstrap", kafka_bootstrap,
         "--namespace", catalog.namespace, "--run-id", "ir", "--rate-scale", "20"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        sent = asyncio.run(records_on(kafka_bootstrap, catalog.requests, 5))
        replay.send_signal(signal.SIGTERM)
        output, _ = replay.communicate(timeout=60)
    finally:
        if replay.poll() is None:
            replay.kill()
    assert sorted(r.key.decode() for r in sent) == [f"ir-00000{i}" for i in (0, 1, 2, 4, 5)]
    assert replay.returncode == 130, output
    assert (f"interrupted: sent 5 of 6 requests to {catalog.requests} (ids ir-000000 to "
            "ir-000002, ir-000004 to ir-000005)") in " ".join(output.split()), output
