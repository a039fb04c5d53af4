"""``governor up`` and ``governor demo`` stop on SIGTERM as on Ctrl-C: through their cleanup."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROGRAM = """
import asyncio, os, signal
from infra.cli import _sigterm_as_interrupt

async def main():
    try:
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)
    finally:
        print("cleanup ran", flush=True)

_sigterm_as_interrupt()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("stopped")
"""


def test_sigterm_runs_the_cleanup_ctrl_c_runs() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True,
                          text=True, timeout=30)
    assert done.stdout.split("\n")[:2] == ["cleanup ran", "stopped"], done.stderr


def test_up_and_demo_take_sigterm_as_ctrl_c(monkeypatch) -> None:
    """Both install it before they start anything (here nothing starts: no broker answers)."""
    from typer.testing import CliRunner

    import infra.cli as cli

    installed: list[str] = []
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: installed.append("installed"))
    monkeypatch.setattr(cli, "_reachable", lambda *a, **k: (_ for _ in ()).throw(
        cli.GovernorError("no broker here")))
    for command in (["up", "--bootstrap", "127.0.0.1:1"],
                    ["demo", "--bootstrap", "127.0.0.1:1"]):
        result = CliRunner().invoke(cli.app, command)
        assert "no broker here" in str(result.exception), result.output
    assert installed == ["installed", "installed"]
