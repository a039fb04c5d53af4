"""A ``governor up`` killed outright (SIGKILL; its machine session ended) runs no handler: its
embedded broker, in a session of its own, runs on, and its components stop by themselves
(``infra.supervised``), not at once. Before 7 Dec the next ``up`` took that broker for one the
user runs, and left it running as it exited, stopped by no one; and it started its stack
beside the components still stopping: its worker refused the slot of one still heart-beating,
its sink the store of one still storing, and the whole stack stopped.
Now the next ``up`` takes the broker over (``owner.json``), stopping it as it exits, and waits
for the components (``stack.json``) before it starts its own.

The real ``up`` on an embedded broker of its own, each a process the tests kill."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli_support import alive
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports, install_kafka

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SERVES_WITHIN_S = 180.0  # (the broker formatted and started, then five components)


class _Up:
    """``governor up`` on the broker of ``kafka``, its output (stdout and stderr) read as it
    comes, and the processes it spawned as it ran (its children: the components, the JVM)."""

    def __init__(self, kafka: EmbeddedKafka, where: Path) -> None:
        settings = kafka.settings
        self.process = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--broker-port", str(settings.port),
             "--controller-port", str(settings.controller_port), "--fleet", "h100:1",
             "--log-dir", str(where / "logs"), "--data-dir", str(where / "analytics")],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.children: dict[int, str] = {}  # pid -> command line
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout),
                                       daemon=True)
        self.reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def until(self, said: Callable[[str], bool], timeout_s: float = SERVES_WITHIN_S) -> None:
        """Wait until ``said`` holds of its output (and note its children as they come); fail
        if it exits first, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not said(self.output):
            self.children |= _children(self.process.pid)
            assert self.process.poll() is None, f"up exited:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"up did not say it:\n{self.output[-3000:]}"
            time.sleep(0.1)  # (polls its output with a deadline)
        self.children |= _children(self.process.pid)

    def child(self, component: str) -> int:
        """The pid of its ``component``."""
        return next(pid for pid, command in self.children.items()
                    if f"infra.cli {component} " in command)

    def stop(self) -> None:
        """SIGTERM, as a ``kill`` gives it (Ctrl-C, ``up``'s own stop); returns once it has
        exited and its output is read to its end."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        self.reader.join(timeout=30)


def _children(pid: int) -> dict[int, str]:
    """The processes ``pid`` runs as its children now, each with its command line."""
    found = {}
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                found[int(child)] = " ".join(
                    Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0"))
    return found


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)  # (polls processes with a deadline)


@contextlib.contextmanager
def _ups(tmp_path: Path) -> Iterator[tuple[EmbeddedKafka, Callable[[], _Up]]]:
    """The broker of ports of the test's own, and a maker of ``up`` processes on it; once the
    test ends, each ``up`` and each process it spawned killed, and the broker stopped, where
    the test left them running."""
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port),
                          progress=lambda _: None)
    install_kafka(kafka.settings.version)  # (the tests' broker's: not downloaded during the run)
    ups: list[_Up] = []

    def start() -> _Up:
        ups.append(_Up(kafka, tmp_path))
        return ups[-1]

    try:
        yield kafka, start
    finally:
        for up in ups:
            up.process.kill()
            up.process.wait()
            for pid in up.children:
                if alive(pid):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        kafka.stop()
        shutil.rmtree(kafka.home, ignore_errors=True)


def _serving(up: _Up, where: Path) -> int:
    """Once the stack of ``up`` serves (each component has said so), its broker's pid."""
    up.until(lambda said: "stack up on" in said)
    logs = [where / "logs" / f"{name}.log" for name in
            ("router", "controllers", "streams", "sink", "worker-0")]
    _wait(lambda: all(log.is_file() and "serving" in log.read_text() for log in logs),
          SERVES_WITHIN_S, "the first up's components did not all serve")
    return next(pid for pid, command in up.children.items() if "kafka.Kafka" in command)


def _kill(up: _Up) -> None:
    up.process.send_signal(signal.SIGKILL)
    up.process.wait(timeout=10)


def test_the_next_up_stops_the_broker_a_killed_up_started(tmp_path):
    with _ups(tmp_path) as (kafka, start):
        first = start()
        broker = _serving(first, tmp_path)
        _kill(first)
        assert alive(broker)  # (in a session of its own: no signal of up's reaches it)
        second = start()
        second.until(lambda said: "stack up on" in said)
        assert (f"Kafka is already running (pid {broker}) at {kafka.bootstrap}, started by "
                "governor up (pid ") in second.output
        assert "which is gone: this governor up stops it as it exits" in second.output
        assert kafka.status().owner.pid == second.process.pid
        second.stop()
        assert f"stopping Kafka (pid {broker})" in second.output
        _wait(lambda: not alive(broker), 60, "the broker runs on after the second up")
        assert not kafka.owner_file.exists()


def test_the_next_up_waits_for_the_components_a_killed_up_left_running(tmp_path):
    """The first ``up``'s sink paused once it is killed (within its look at its supervisor,
    every second): it cannot stop by itself until it is resumed, and holds its store meanwhile,
    as a sink finishing a flush does. (Not before: the kernel resumes a paused process, with a
    SIGHUP, whose process group its parent's exit leaves orphaned.)"""
    with _ups(tmp_path) as (kafka, start):
        first = start()
        broker = _serving(first, tmp_path)
        sink = first.child("sink")
        _kill(first)
        os.kill(sink, signal.SIGSTOP)
        second = start()
        second.until(lambda said: f"sink (pid {sink})" in said)
        assert f"governor up (pid {first.process.pid}), whose logs are in " in second.output
        assert "its components stop by themselves: waiting for" in second.output
        assert "stack up on" not in second.output  # (not while they run)
        os.kill(sink, signal.SIGCONT)  # (it finds its supervisor gone, and stops)
        second.until(lambda said: "they have stopped" in said and "stack up on" in said)
        assert not alive(sink)
        _wait(lambda: (tmp_path / "logs" / "sink.log").read_text().count("sink: serving") == 2,
              SERVES_WITHIN_S, "the second up's sink did not serve")
        assert second.process.poll() is None, second.output  # (its stack runs)
        second.stop()
        assert "stack is stopped" not in second.output, second.output
        _wait(lambda: not alive(broker), 60, "the broker runs on after the second up")
