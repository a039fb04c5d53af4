"""Ctrl-C, SIGTERM or a closed terminal while ``governor up`` starts its embedded broker stops
that broker. The broker runs in a session of its own, which a terminal's Ctrl-C does not reach,
and before 7 Dec ``up`` stopped it only once the stack had started: interrupted during the
broker's start (about 10 s, minutes while Kafka downloads), ``up`` exited and left it running,
and the next ``up`` took it for a broker already running, which it leaves running when it
stops."""

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports, install_kafka

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _up_starting_its_broker(tmp_path: Path, **output) -> Iterator[tuple[EmbeddedKafka,
                                                                       subprocess.Popen]]:
    """``governor up`` on an embedded broker of its own (``output``: where its stdout and
    stderr go), once it has spawned the broker's JVM (its pid file written), before the broker
    answers; then up killed and the broker stopped, should the test fail with them running."""
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port))
    install_kafka(kafka.settings.version)  # (the tests' broker's: not downloaded during the run)
    up = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "up", "--broker-port", str(port), "--controller-port",
         str(controller_port), "--fleet", "h100:1", "--log-dir", str(tmp_path / "logs"),
         "--data-dir", str(tmp_path / "analytics")],
        cwd=REPO, stdin=subprocess.DEVNULL, **output)
    try:
        deadline = time.monotonic() + 120
        while not kafka.pid_file.exists():
            assert up.poll() is None, "up exited before it started its broker"
            assert time.monotonic() < deadline, "up did not start its broker"
            time.sleep(0.05)  # (polls the pid file with a deadline)
        yield kafka, up
    finally:
        up.kill()
        kafka.stop()
        shutil.rmtree(kafka.home, ignore_errors=True)


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_while_up_starts_its_broker_stops_the_broker(tmp_path, sent):
    lines: queue.Queue = queue.Queue()
    with _up_starting_its_broker(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) as (kafka, up):
        threading.Thread(target=lambda: [lines.put(line) for line in up.stdout],
                         daemon=True).start()
        up.send_signal(sent)  # (Ctrl-C: the terminal's SIGINT reaches up alone)
        up.wait(timeout=90)
        left_running = kafka.status().running
    output = "".join(lines.queue)
    assert "Kafka is up" not in output, output  # (interrupted while it started)
    assert not left_running, output


def test_a_terminal_closed_while_up_starts_its_broker_stops_the_broker(tmp_path):
    """The terminal ``up`` runs in closes: its shell forwards SIGHUP, and a write to the hung-up
    terminal fails (EIO). Before 7 Dec the cleanup's first line ("stopping Kafka ...") ended it
    before it stopped the broker, left running (so too once the stack ran: ``up``'s "stopped")."""
    terminal, its_end = os.openpty()
    try:
        with _up_starting_its_broker(tmp_path, stdout=its_end, stderr=its_end,
                                     start_new_session=True) as (kafka, up):
            os.close(its_end)
            its_end = None
            os.close(terminal)  # (the window closes: the terminal hangs up)
            terminal = None
            up.send_signal(signal.SIGHUP)  # (its shell's)
            up.wait(timeout=90)
            left_running = kafka.status().running
    finally:
        for fd in (terminal, its_end):
            if fd is not None:
                os.close(fd)
    assert not left_running
