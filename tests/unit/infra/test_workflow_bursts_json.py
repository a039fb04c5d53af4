"""``python -m benchmarks.workflow_bursts --json OUT`` stopped midway (its runs take minutes):
OUT holds every row printed so far, as valid JSON. Before 7 Dec it was written only at the end,
and a run stopped midway lost every row."""

import json
import sys

import pytest

import benchmarks.workflow_bursts as bursts
from benchmarks.policy_bench import ORDER

#: The runs of one scenario, in the order their rows are printed.
RUNS = [p for p in ORDER if p != "governor"] + ["governor", "governor (fixed fleet)"]


def _report(policy: str) -> dict:
    """A run's ``sim --json`` report, of the fields the table shows."""
    return {"policy": policy, "tasks": 4, "tasks_succeeded": 3, "slo_attainment": 0.75,
            "cost_per_successful_task_usd": 0.01, "workers_used": 2,
            "rejected_by_reason": {}}


def test_the_json_holds_the_rows_so_far_when_a_run_is_stopped_midway(tmp_path, monkeypatch):
    runs = []

    def run(trace, policy, variant, settings):
        if len(runs) == len(RUNS):  # the second scenario's first run: a Ctrl-C
            raise KeyboardInterrupt
        runs.append(policy)
        return _report(policy)

    out = tmp_path / "bursts.json"
    monkeypatch.setattr(bursts, "scenarios", lambda seed: {"high": [], "base": []})
    monkeypatch.setattr(bursts, "run", run)
    monkeypatch.setattr(sys, "argv", ["workflow_bursts", "--seeds", "0", "--json", str(out)])
    with pytest.raises(KeyboardInterrupt):
        bursts.main()
    rows = json.loads(out.read_text())
    assert [(r["seed"], r["scenario"], r["run"]) for r in rows] == [
        (0, "high", label) for label in RUNS]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bursts.json"]  # (no .tmp left)


#: The benchmark, its runs stubbed, with ``argv[1:]`` as its arguments.
BURSTS_WITH_STUB_RUNS = """
import sys
import benchmarks.workflow_bursts as bursts
from tests.unit.infra.test_workflow_bursts_json import _report

bursts.scenarios = lambda seed: {"high": []}
bursts.run = lambda trace, policy, variant, settings: _report(policy)
sys.argv = ["workflow_bursts", *sys.argv[1:]]
bursts.main()
"""


def test_a_closed_stdout_ends_the_benchmark_quietly(tmp_path):
    """``... | head -3``: before 7 Dec the print after it ended the benchmark with a
    ``BrokenPipeError`` traceback; now as a ``governor`` command ends there, exit 1."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    read, write = os.pipe()
    os.close(read)  # (no reader at all: the first write to stdout fails)
    try:
        done = subprocess.run([sys.executable, "-c", BURSTS_WITH_STUB_RUNS, "--seeds", "0"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")
