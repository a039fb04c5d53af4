"""Fault scenarios through `governor demo --fault ...` on the real broker, the whole stack up."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def _demo(bootstrap: str, tmp_path, *args: str) -> dict:
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--duration", "20", "--bootstrap", bootstrap,
         "--no-analytics", "--json", str(out), *args],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_worker_slowed_5x_has_its_breaker_opened_and_its_traffic_moved(kafka_bootstrap, tmp_path):
    report = _demo(kafka_bootstrap, tmp_path, "--fault", "slow:0:5@5")
    assert report["faults_injected"] == ["slow:0@5"]
    assert report["breaker_opened_after_s"] is not None
    assert 0 < report["breaker_opened_after_s"] <= 3.0
    # Its in-flight requests moved to other workers and continued token by token.
    assert report["resumed_streams"] == report["resumed_streams_verified"]
    assert report["unfinished"] == 0 and report["multiple_terminal_states"] == 0
    assert report["streams_broken"] == 0


def test_a_worker_killed_mid_stream_has_its_requests_finished_elsewhere_exactly(kafka_bootstrap,
                                                                                tmp_path):
    report = _demo(kafka_bootstrap, tmp_path, "--fault", "kill:1@8")
    assert report["components_exited"] == ["worker-1"]
    assert report["resumed_streams"] > 0
    assert report["resumed_streams_verified"] == report["resumed_streams"]
    assert report["unfinished"] == 0 and report["multiple_terminal_states"] == 0
    assert report["completed"] == report["requests_sent"]
    assert report["streams_broken"] == 0
