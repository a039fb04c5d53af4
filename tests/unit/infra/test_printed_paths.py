"""What the commands print of a path is the path: a ``[...]`` in it is no Rich markup, and a
line is not split at 80 columns where the output is no terminal.

Before 7 Dec ``governor demo``'s first line, ``workload build``'s ``wrote ...`` and ``schemas
export``'s paths went through Rich's markup: ``/tmp/run[old]/trace.jsonl`` was printed
``/tmp/run/trace.jsonl`` (an unknown style, dropped), and ``/tmp/run[/]/trace.jsonl`` ended the
command with a ``MarkupError`` (a closing tag with nothing to close)."""

import ast
import asyncio
import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from infra import cli, demo
from infra.cli import app
from infra.sim import cli as sim_cli
from infra.traces import TraceRequest

#: Folder names Rich took for markup: a style it dropped, a closing tag that raised.
MARKUP_LIKE = ["run[old]", "run[/]"]


class _Stop(Exception):
    """Ends the demo after its first line."""


@pytest.mark.parametrize("folder", MARKUP_LIKE)
def test_the_demo_names_its_trace_as_it_is(tmp_path: Path, monkeypatch, folder: str) -> None:
    async def no_broker(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(demo, "create_topics", no_broker)
    trace = tmp_path / folder / "trace.jsonl"
    out = io.StringIO()
    options = demo.DemoOptions(bootstrap="", trace=trace, fleet="h100:1")
    items = [TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=2)]
    with pytest.raises(_Stop):
        asyncio.run(demo.run_demo(options, Console(file=out, width=40), items=items))
    assert re.fullmatch(rf"demo-[-\d]+-\w+: 1 request over 0s of {re.escape(str(trace))}, "
                        r"fleet h100:1, speedup 1\n", out.getvalue()), out.getvalue()


@pytest.mark.parametrize("folder", MARKUP_LIKE)
def test_workload_build_names_its_file_as_it_is(tmp_path: Path, monkeypatch, folder: str) -> None:
    import infra.workloads

    built = [TraceRequest(arrival_s=i, prompt_tokens=10, output_tokens=2) for i in range(3)]
    monkeypatch.setattr(infra.workloads, "build_workload", lambda *a, **k: built)
    out = tmp_path / ("a-folder-name-long-enough-to-pass-80-columns-" + folder) / "w.jsonl"
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(out),
                                      "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"wrote 3 requests (3 tasks) to {out}\n"


@pytest.mark.parametrize("folder", MARKUP_LIKE)
def test_schemas_export_names_its_files_as_they_are(tmp_path: Path, folder: str) -> None:
    result = CliRunner().invoke(app, ["schemas", "export", str(tmp_path / folder)])
    assert result.exit_code == 0, result.output
    printed = result.stderr.splitlines()
    assert printed and sorted(printed) == sorted(str(p) for p in (tmp_path / folder).iterdir())


def _console_prints(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "print"
            and "console" in ast.unparse(node.func.value)]


def test_the_commands_print_each_line_whole_where_the_output_is_no_terminal() -> None:
    """Every line the command modules print on the console keeps to one line in a log (80
    columns there), as ``demo``'s and ``up``'s do (``test_demo_output``): before, ``report:
    PATH`` of ``bench``, ``wrote ... to PATH`` of ``workload build`` and others were split."""
    from benchmarks import policy_bench

    wrapped = [f"{Path(module.__file__).name}:{call.lineno}"
               for module in (cli, sim_cli, policy_bench)
               for call in _console_prints(ast.parse(Path(module.__file__).read_text()))
               if not any(keyword.arg == "soft_wrap" for keyword in call.keywords)]
    assert wrapped == []
