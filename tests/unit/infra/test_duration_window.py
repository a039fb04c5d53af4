"""``--duration`` of ``sim`` and ``demo`` on a Governor JSONL trace whose rows start later:
its ``arrival_s`` counts from 0 as written, so a window shorter than its start holds no
request. Before 7 Dec the error said only that (``has no request to simulate in its first
60 s``), leaving a user to wonder why a trace of requests had none."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.errors import GovernorError

LATER = "(its first request arrives 3,600 s in: a Governor JSONL trace's arrival_s counts from 0"


@pytest.fixture
def an_hour_in(tmp_path: Path) -> Path:
    """Three requests from 3,600 s on."""
    path = tmp_path / "hour.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=3600.0 + i, prompt_tokens=100, output_tokens=10)
                          for i in range(3)], path)
    return path


@pytest.mark.parametrize("command", [["sim"], ["demo", "--bootstrap", "127.0.0.1:1", "--trace"]])
def test_a_window_before_a_governor_jsonl_trace_starts_says_when_it_starts(command, an_hour_in):
    result = CliRunner().invoke(app, [*command, str(an_hour_in), "--duration", "60"])
    assert isinstance(result.exception, GovernorError)  # (`governor` exits 2 with its line)
    error = str(result.exception)
    assert "has no request" in error and "in its first 60 s" in error and LATER in error


@pytest.mark.parametrize("command", [["sim"], ["demo", "--bootstrap", "127.0.0.1:1", "--trace"]])
def test_a_window_under_a_second_is_refused_as_out_of_range(command, an_hour_in):
    """As ``demo``'s always was; before 7 Dec ``sim`` took ``--duration 0`` (its range began at
    0) and then found no request in it: a window holds the rows arriving before its end."""
    result = CliRunner().invoke(app, [*command, str(an_hour_in), "--duration", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--duration': must be a number from 1 to 1,209,600, got 0" in \
        " ".join(result.output.replace("│", " ").split())
