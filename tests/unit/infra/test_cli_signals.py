"""``governor up`` and ``governor demo`` stop on SIGTERM as on Ctrl-C: through their cleanup."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROGRAM = """
import asyncio, os, signal, sys
from infra.cli import _sigterm_as_interrupt

async def main():
    try:
        sent = getattr(signal, sys.argv[1])
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), sent)
        await asyncio.sleep(30)
    finally:
        print("cleanup ran", flush=True)

_sigterm_as_interrupt()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("stopped")
"""


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_run_the_cleanup_ctrl_c_runs(sent: str) -> None:
    """SIGHUP too (the terminal ``up`` or ``demo`` runs in closed): its components run in
    process groups of their own, which a terminal's hangup does not reach, so only the
    command's cleanup stops them. Before 6 Dec (evening) SIGHUP ended the command at once and
    left them running."""
    done = subprocess.run([sys.executable, "-c", PROGRAM, sent], cwd=REPO, capture_output=True,
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


PROGRAM_TWICE = """
import asyncio, os, signal, sys, threading
from infra.cli import _sigterm_as_interrupt

first, second = (getattr(signal, name) for name in sys.argv[1:3])
handled, outcomes, stopped = threading.Event(), [], threading.Event()

def noted(handler):
    '''``handler``, noting whether it interrupted the program or left it to go on.'''
    def note(signum, frame):
        try:
            handler(signum, frame)
        except KeyboardInterrupt:
            outcomes.append(signal.Signals(signum).name + " interrupted")
            raise
        else:
            outcomes.append(signal.Signals(signum).name + " ignored")
        finally:
            handled.set()
    return note

def stop():
    '''The stack's stop, in a thread as ``governor up`` runs it; the second signal comes now.'''
    os.kill(os.getpid(), second)
    handled.wait(30)  # (the main thread has handled it)
    stopped.set()

async def main():
    try:
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), first)
        await asyncio.sleep(30)
    finally:
        signal.signal(second, noted(signal.getsignal(second)))  # (as it is while it stops)
        await asyncio.to_thread(stop)

_sigterm_as_interrupt()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print(", ".join(outcomes), flush=True)
    print("stopped" if stopped.is_set() else "out before the stop ended", flush=True)
"""


@pytest.mark.parametrize("first, second", [("SIGHUP", "SIGHUP"), ("SIGTERM", "SIGINT"),
                                           ("SIGTERM", "SIGHUP")])
def test_a_signal_while_the_command_stops_does_not_cut_the_stop_short(first: str,
                                                                      second: str) -> None:
    """A user sends ``up`` a second ``kill`` while it stops, or presses Ctrl-C after a ``kill``
    or after the terminal's SIGHUP. Before 7 Dec the second raised ``KeyboardInterrupt`` again,
    in asyncio's cleanup that waits for the stop: ``up`` went on to stop its broker and exit
    with the components not stopped yet (or, the second landing before the stop began, never
    stopped: they run in process groups of their own). The first stop signal interrupts; those
    that follow while it stops are ignored."""
    done = subprocess.run([sys.executable, "-c", PROGRAM_TWICE, first, second], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == [f"{second} ignored", "stopped"], done.stderr


PROGRAM_FINISHING = """
import asyncio, os, signal
from infra.cli import STOP_SIGNALS, _sigterm_as_interrupt, _stop_signals

async def run():  # (as demo's: its loop takes the stop signals while the run lasts)
    for sig in STOP_SIGNALS:
        asyncio.get_running_loop().add_signal_handler(sig, lambda: None)

_sigterm_as_interrupt()
try:
    asyncio.run(run())
finally:
    _stop_signals.finishing()
    os.kill(os.getpid(), signal.SIGTERM)  # (while demo stops its broker, writes its report)
    os.kill(os.getpid(), signal.SIGHUP)
    print("finished", flush=True)
"""


def test_a_stop_signal_after_demos_loop_closed_does_not_end_it_at_once() -> None:
    """Its loop's close sets the signals it handled back to their defaults; ``finishing``
    takes them again, ignored: before 7 Dec a SIGTERM or SIGHUP while ``demo`` stopped its
    embedded broker or wrote its report ended it there, the broker left running."""
    done = subprocess.run([sys.executable, "-c", PROGRAM_FINISHING], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "finished\n"), done.stderr


PROGRAM_UP_STOPS_ITS_BROKER = """
import asyncio, os, signal, sys
from typer.testing import CliRunner
import infra.up
from infra import cli

class Broker:  # (up's embedded broker, started by it)
    def stop(self):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))  # (while it stops the broker)
        print("broker stopped", file=sys.__stdout__, flush=True)  # (not the runner's output)

async def run_up(*args, **kwargs):  # (its stack, stopped by Ctrl-C)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.Event().wait()

cli._start_embedded = lambda ports, command: (Broker(), "127.0.0.1:1", True)
infra.up.run_up = run_up
result = CliRunner().invoke(cli.app, ["up", "--fleet", "h100:1", "--log-dir", sys.argv[2],
                                      "--data-dir", sys.argv[2]])
print(result.output.strip().splitlines()[-1], flush=True)
"""


@pytest.mark.parametrize("sent", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_stop_signal_while_up_stops_its_broker_after_ctrl_c_is_ignored(sent: str,
                                                                          tmp_path) -> None:
    """Ctrl-C stopped ``up``'s stack; then its terminal closes, a ``kill`` or a second Ctrl-C
    comes while it stops its embedded broker. Before 7 Dec (the first stop a Ctrl-C, asyncio's,
    which ``StopSignals`` did not count) it raised there, and ``up`` exited before it stopped
    the broker, left running; as ``demo``, it ignores them once its stack is stopped."""
    done = subprocess.run([sys.executable, "-c", PROGRAM_UP_STOPS_ITS_BROKER, sent,
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["broker stopped", "stopped"], done.stderr[-2000:]


PROGRAM_BROKER_START_INTERRUPTED = """
import os, signal, sys
from infra import cli

class Broker:  # (the embedded broker, Ctrl-C pressed while it starts)
    def status(self):
        return type("Status", (), {"answers": False})()

    adopted = False

    def start(self, port_options, owner):
        self.spawned = True  # (its JVM: interrupted once it was spawned)
        os.kill(os.getpid(), signal.SIGINT)

    def stop(self):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))  # (while it stops the broker)
        print("broker stopped", flush=True)

cli._kafka = lambda *ports: Broker()
cli._sigterm_as_interrupt()
try:
    cli._start_embedded((1, 2), "governor up")
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


@pytest.mark.parametrize("sent", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_stop_signal_while_a_broker_interrupted_in_its_start_stops_is_ignored(sent) -> None:
    """Ctrl-C while ``up`` or ``demo`` starts its embedded broker stops that broker; a stop
    signal then (a second Ctrl-C, the terminal closing) raised there before 7 Dec, and the
    broker, in a session of its own, was left running."""
    done = subprocess.run([sys.executable, "-c", PROGRAM_BROKER_START_INTERRUPTED, sent],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["broker stopped", "stopped"], done.stderr[-2000:]


@pytest.fixture
def signal_handlers():
    """The process's handlers of the stop signals, put back after the test."""
    import signal

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.getsignal(sig) for sig in stops}
    yield before
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_up_run_in_process_without_its_stop_signals_leaves_the_handlers_as_they_were(
        monkeypatch, tmp_path, signal_handlers) -> None:
    """A caller that runs ``up`` in its own process (a test, with ``_sigterm_as_interrupt``
    left out) keeps its Ctrl-C and SIGTERM: ``finishing`` takes the stop signals only where
    ``up`` or ``demo`` installed its handling, else a test run ignored them afterwards."""
    import signal

    from typer.testing import CliRunner

    import infra.cli as cli
    import infra.up

    async def run_up(*args, **kwargs) -> None:
        return None

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.up, "run_up", run_up)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1"])
    assert result.exit_code == 0, result.output
    assert {sig: signal.getsignal(sig) for sig in signal_handlers} == signal_handlers


def test_up_stops_at_its_end_only_a_broker_it_spawned(monkeypatch) -> None:
    """Another ``up`` (or ``broker start``) was starting the broker: it did not answer yet when
    this one asked, and this one's start found it running. Before 7 Dec this ``up`` took it for
    one it started, and stopped it at its end under the other ``up``'s stack."""
    class Broker:  # (another process's start under way: not answering yet, then found running)
        spawned = adopted = False

        def status(self):
            return type("Status", (), {"answers": False})()

        def start(self, port_options, owner):
            return "127.0.0.1:1"

    from infra import cli

    monkeypatch.setattr(cli, "_kafka", lambda *ports: Broker())
    assert cli._start_embedded((1, 2), "governor up")[1:] == ("127.0.0.1:1", False)
