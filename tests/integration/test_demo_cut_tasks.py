"""``governor demo --duration S`` sends only the rows arriving within S: a task whose later steps
arrive after that is sent in part, and cannot succeed. The demo says how many tasks and steps
its cut left out, in a warning and in its report (``tasks_cut_short``, ``steps_cut_short``), as
``sim`` warns of them. Before 6 Dec it cut them silently, and the report's task figures
counted them with the rest. The real broker and the whole stack."""

import json
import subprocess
import sys

import pytest

from infra.traces import TraceRequest, write_governor_jsonl

pytestmark = pytest.mark.integration


def _step(at: float, task: str, step: int, steps: int) -> TraceRequest:
    return TraceRequest(at, 64, 4, task_id=task, step=step, steps_total=steps)


ROWS = [_step(0.0, "a", 1, 2), _step(0.5, "b", 1, 3), _step(1.0, "a", 2, 2),
        _step(2.0, "b", 2, 3), _step(2.5, "c", 1, 2),
        _step(4.0, "c", 2, 2), _step(5.0, "b", 3, 3), TraceRequest(6.0, 64, 4)]  # past 3 s


def test_demo_says_how_many_tasks_and_steps_its_duration_cut(kafka_bootstrap, tmp_path,
                                                              namespaces_to_delete):
    trace, out = tmp_path / "tasks.jsonl", tmp_path / "demo.json"
    write_governor_jsonl(ROWS, trace)
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--trace", str(trace), "--duration", "3",
         "--fleet", "h100:1", "--no-analytics", "--bootstrap", kafka_bootstrap, "--json",
         str(out)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    report = json.loads(out.read_text()) if out.exists() else {}
    if "run_id" in report:
        namespaces_to_delete.append(report["run_id"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 worker up; logs in" in result.stderr  # (it said "1 workers up")
    assert ("warning: 2 tasks have steps outside the run's rows (2 steps, cut off by "
            "--duration, --limit or the file): they count as not succeeded") in \
        " ".join(result.stderr.split())
    assert report["requests_sent"] == 5 and report["unfinished"] == 0
    assert (report["tasks_cut_short"], report["steps_cut_short"]) == (2, 2)
