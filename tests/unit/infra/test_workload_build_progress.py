"""``governor workload build`` says how far it has got on a long build: before 7 Dec a ServeGen
workload of a million requests (900 s at the published rates) took half a minute to build and
write, and a day of it longer, with nothing shown until ``wrote ...``."""

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from infra.cli import app
from infra.workloads import default_traces_dir


@pytest.mark.skipif(not (default_traces_dir() / "servegen").is_dir(), reason="no shared data")
def test_a_long_workload_build_counts_the_requests_it_built_and_wrote(tmp_path: Path,
                                                                       monkeypatch):
    from infra.sim import cli

    shown = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=shown, force_terminal=False, width=200))
    monkeypatch.setattr(cli, "PROGRESS_AFTER_S", 0.0)  # every count shown, as on a long build
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)
    out = tmp_path / "servegen.jsonl"
    result = CliRunner().invoke(app, ["workload", "build", "servegen", "--duration", "5",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = out.read_text().count("\n")
    built = [int(n.replace(",", "")) for n in
             re.findall(r"^workload build ([\d,]+) requests built$", shown.getvalue(), re.M)]
    assert len(built) > 1 and built == sorted(built) and built[-1] == rows
    assert "workload build 4,096 requests written" in shown.getvalue().splitlines()
    assert shown.getvalue().splitlines()[-1] == f"wrote {rows:,} requests ({rows:,} tasks) to {out}"
