"""``governor demo --json FILE`` with a stdout whose reader has gone (``... | true``): before
7 Dec it printed the report first, the print ended it (exit 1), and FILE, written after it, was
lost with the run. Now FILE is written first, as ``sim`` writes its own. The real broker and
the smallest whole run: one request, one worker, no sink."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.traces import TraceRequest, write_governor_jsonl

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_demo_writes_its_json_report_though_stdout_is_closed(kafka_bootstrap, tmp_path,
                                                             namespaces_to_delete):
    trace, out = tmp_path / "one.jsonl", tmp_path / "demo.json"
    write_governor_jsonl([TraceRequest(0.0, 64, 4)], trace)
    read, write = os.pipe()
    os.close(read)  # (no reader at all: the first write to stdout fails)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "infra.cli", "demo", "--trace", str(trace), "--duration", "1",
             "--fleet", "h100:1", "--no-analytics", "--bootstrap", kafka_bootstrap, "--json",
             str(out)], stdout=write, stderr=subprocess.PIPE, text=True, timeout=240,
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write)
    report = json.loads(out.read_text()) if out.exists() else {}
    if "run_id" in report:
        namespaces_to_delete.append(report["run_id"])
    assert done.returncode == 1, done.stderr[-3000:]  # (click's answer to a closed stdout)
    assert report["requests_sent"] == 1 and report["unfinished"] == 0
