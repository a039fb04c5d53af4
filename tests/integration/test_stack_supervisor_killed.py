"""The components of a stack whose supervisor (``governor up``, ``demo``) is killed outright
stop by themselves (``infra.supervised``): before 7 Dec they ran on unsupervised, in process
groups of their own, a worker holding its slot's requests and the router its id.

The real ``Stack`` and its real components, on the real broker, started by a process of its own
that the test kills with SIGKILL once they serve."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import alive

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import sys, time
from pathlib import Path
from infra.stack import PoolSpec, Stack

bootstrap, namespace, logs = sys.argv[1:]
stack = Stack(bootstrap, namespace, [PoolSpec("h100", 1)], Path(logs), speedup=20,
              with_streams=True, sink_data_dir=Path(logs) / "analytics")
stack.start()
for name, process in stack.processes.items():
    print(name, process.pid, flush=True)
time.sleep(600)  # (until killed)
"""
COMPONENTS = {"router", "controllers", "streams", "sink", "worker-0"}
STOPPED_WITHIN_S = 90.0  # each stops gracefully: a worker hands back, the streams commit


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)  # polling processes and logs under a deadline


def test_the_components_of_a_killed_supervisor_stop_by_themselves(kafka_bootstrap, catalog,
                                                                  tmp_path):
    supervisor = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, kafka_bootstrap, catalog.namespace, str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True)
    pids: dict[str, int] = {}
    try:
        while set(pids) != COMPONENTS:
            line = supervisor.stdout.readline()
            assert line, f"the stack started only {sorted(pids)}"
            name, pid = line.split()
            pids[name] = int(pid)
        # each serving: its watch of the supervisor started with it
        _wait(lambda: all("serving" in (tmp_path / f"{name}.log").read_text()
                          for name in COMPONENTS), 120, "the components did not all serve")
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(10)
        _wait(lambda: not any(alive(pid) for pid in pids.values()), STOPPED_WITHIN_S,
              f"still running: {[name for name, pid in pids.items() if alive(pid)]}")
        for name in COMPONENTS:
            assert "is gone: stopping" in (tmp_path / f"{name}.log").read_text(), name
    finally:
        supervisor.kill()
        supervisor.wait(10)
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
