"""``governor sim`` and ``governor workload build`` from the command line."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.traces import TraceRequest, write_governor_jsonl
from infra.workloads import default_traces_dir


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=300 + i, output_tokens=20,
                                       task_id=f"t{i // 2}", step=i % 2 + 1, steps_total=2)
                          for i in range(20)], path)
    return path


def test_sim_prints_and_writes_the_report(trace: Path, tmp_path: Path):
    out = tmp_path / "out" / "sim.json"
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "kv_aware", "--fleet", "h100:2",
                                      "--seed", "3", "--rate-scale", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == printed
    assert printed["policy"] == "kv_aware" and printed["requests"] == 20
    assert printed["tasks"] == 10 and printed["completed"] == 20 and printed["unfinished"] == 0


def test_sim_refuses_an_unknown_policy(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "random"])
    assert result.exit_code != 0
    assert "unknown policy" in str(result.exception) + result.output


@pytest.mark.skipif(not (default_traces_dir() / "sharegpt_lengths").is_dir(), reason="no shared data")
def test_workload_build_writes_governor_jsonl(tmp_path: Path):
    out = tmp_path / "w.jsonl"
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(out),
                                      "--duration", "30", "--arrivals", "poisson", "--mean-rps", "0.5"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("task_id" in r and r["tenant"] == "sharegpt" for r in rows)


def test_sim_settings_and_autoscaler(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:3", "--autoscale",
                                      "--set", "breaker.itl_ratio=1000", "--set", "slo.ttft_slo_s=3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["fleet_timeline"][0] == [0.0, 3, 3] and report["unfinished"] == 0
    bad = CliRunner().invoke(app, ["sim", str(trace), "--set", "breaker.nope=1"])
    assert bad.exit_code != 0 and "bad --set" in str(bad.exception) + bad.output
