"""The whole stack: `governor demo` replays the Azure trace and every request reaches one end."""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_replays_azure_trace_and_leaves_nothing_unfinished(kafka_bootstrap, azure_trace, tmp_path):
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--duration", "30", "--trace", str(azure_trace),
         "--bootstrap", kafka_bootstrap, "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report == json.loads(result.stdout)
    assert report["requests_sent"] > 0
    assert report["unfinished"] == 0
    assert report["multiple_terminal_states"] == 0
    assert report["completed"] + report["rejected"] + report["failed"] == report["requests_sent"]
    assert report["completed"] == report["requests_sent"]  # a healthy fleet serves them all
    assert report["streams_verified"] == report["completed"] and report["streams_broken"] == 0
    assert 0 < report["ttft_p50_s"] <= report["ttft_p99_s"]
    assert "components_exited" not in report


def _alive_with(text: str) -> list[int]:
    """The processes whose command line holds ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(
                    errors="replace"):
                found.append(int(proc.name))
        except OSError:  # (gone meanwhile)
            continue
    return found


def test_an_interrupted_demo_stops_its_stack_and_reports_the_run_until_then(
        kafka_bootstrap, azure_trace, tmp_path):
    """Ctrl-C in the middle of a demo: the stack stops as at the end, and the report of the run
    so far is printed and written, marked ``interrupted`` (exit status 130), not lost."""
    out = tmp_path / "demo.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "demo", "--duration", "600", "--trace",
         str(azure_trace), "--bootstrap", kafka_bootstrap, "--json", str(out), "--no-analytics"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(" up; logs in " in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.1)  # polls the output with a deadline
        run_id = next(line.split(":")[0] for line in lines if line.startswith("demo-"))
        assert _alive_with(run_id), "the demo's stack is not running"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == 130, "".join(lines)[-3000:]
    report = json.loads(out.read_text())
    assert report["run_id"] == run_id and report["interrupted"] is True
    from infra.demo import DemoOptions, workload

    whole = len(workload(DemoOptions(bootstrap="", trace=azure_trace, duration_s=600)))
    assert report["duration_s"] < 600 and report["requests_sent"] < whole
    assert "interrupted: the report covers" in "".join(lines)
    assert _alive_with(run_id) == []  # router, workers, controllers, streams: all stopped
