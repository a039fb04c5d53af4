"""What ``governor demo`` prints: a command it suggests stays one line to copy, and no line is
split at the console's width."""

import ast
import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console

import analytics.progress
from infra import cli, demo, up
from infra.demo import DemoOptions
from schemas.topics import TopicCatalog


class _Stack:
    log_dir = Path(".governor/demo/demo-x")

    def running(self, name: str) -> bool:
        return True


def _printed(monkeypatch, summary: dict, width: int = 40) -> str:
    async def demo_summary(*args, **kwargs) -> dict:
        return summary

    monkeypatch.setattr(analytics.progress, "demo_summary", demo_summary)
    out = io.StringIO()
    console = Console(file=out, width=width)  # narrower than the line, as a log's 80 columns are
    asyncio.run(demo._analytics(DemoOptions(bootstrap=""), TopicCatalog("demo-x"), _Stack(),
                                Path(".governor/demo/demo-x[1]/analytics"), console))
    return out.getvalue()


def test_the_analytics_query_is_printed_on_one_line_as_written(monkeypatch) -> None:
    # before: wrapped at the console's width (80 columns in a log), so a copied command broke
    assert _printed(monkeypatch, {"analytics_rows": 12061}) == (
        "analytics: 12061 rows; query them with `governor sql --data-dir "
        ".governor/demo/demo-x[1]/analytics --namespace demo-x \"SHOW TABLES\"`\n")


def test_an_analytics_failure_is_printed_as_written(monkeypatch) -> None:
    printed = _printed(monkeypatch, {"analytics_rows": None,
                                     "analytics_error": "the sink exited [code 1]"})
    assert printed == "analytics: the sink exited [code 1] (see .governor/demo/demo-x)\n"


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_is_a_plain_line_now_and_then_where_no_terminal_shows_the_bars(terminal) -> None:
    # before: with its output to a file, the demo printed nothing between "workers up" and the
    # end of the run, a minute later; rich draws its bars only at the end there
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=80)

    async def run() -> None:
        task = asyncio.create_task(demo._plain_progress(console, lambda: "sent 3/9, finished 1/9",
                                                        every_s=0.01))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    lines = out.getvalue().splitlines()
    assert lines == [] if terminal else (lines and set(lines) == {"sent 3/9, finished 1/9"})


def test_the_progress_line_has_thousands_separators() -> None:
    # before: "sent 1234/12345, finished 1200/12345", where the demo says "12,345 requests"
    assert demo._progress_line(1234, 1200, 12_345) == "sent 1,234/12,345, finished 1,200/12,345"


def _console_prints(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "print"
            and "console" in ast.unparse(node.func.value)]


def _demo_and_up_code() -> dict[str, ast.AST]:
    """The code of ``demo`` and ``up``: their modules whole, and what of ``infra.cli`` they run
    (the commands, and the embedded broker's progress lines they print as they start one)."""
    modules = [Path(module.__file__) for module in (demo, up)]
    code: dict[str, ast.AST] = {path.name: ast.parse(path.read_text()) for path in modules}
    cli_tree = ast.parse(Path(cli.__file__).read_text())
    code.update({f"cli.py:{node.name}": node for node in ast.walk(cli_tree)
                 if isinstance(node, ast.FunctionDef) and node.name in ("demo", "up", "_kafka")})
    return code


def test_demo_and_up_print_each_line_whole_where_the_output_is_no_terminal() -> None:
    # before: "N workers up; logs in DIR", "interrupted after ... s: stopping the stack; ..."
    # and others were wrapped at the console's width, split mid-line in a log (80 columns)
    code = _demo_and_up_code()
    assert {"demo.py", "up.py", "cli.py:demo", "cli.py:up", "cli.py:_kafka"} <= set(code)
    wrapped = [f"{where}:{call.lineno}" for where, tree in code.items()
               for call in _console_prints(tree)
               if not any(keyword.arg == "soft_wrap" for keyword in call.keywords)]
    assert wrapped == []
