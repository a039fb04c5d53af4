"""The whole stack: `governor demo` replays the Azure trace and every request reaches one end."""

import json
import subprocess
import sys

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
