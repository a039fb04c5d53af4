"""A SIGTERM or SIGHUP that comes while ``governor up`` starts a component does not leave that
component running. Before 7 Dec the signal raised ``KeyboardInterrupt`` wherever ``up``'s main
thread was: raised once ``subprocess.Popen`` had forked the component but before the stack had
recorded it (``Stack._spawn``), the stack's stop did not know it, and it ran on, in a process
group of its own that no Ctrl-C reaches. Now the signal cancels ``up``'s task from its loop, at
its next ``await``: the start is not cut partway.

``governor up`` itself, on the real broker, in a process of its own; its stack is the real
``Stack`` whose components are stand-ins (a sleeping process each), and the signal comes as the
first of them is forked."""

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
import os, signal, subprocess, sys
import infra.stack, infra.up
from infra.cli import run

sent = getattr(signal, sys.argv[1])

class ForkedWhenSignalled(infra.stack.Stack):
    '''The real stack; each component a process that sleeps until SIGTERM. The stop signal
    comes as the first is forked, before Popen has returned.'''
    signalled = False

    def _start_process(self, name, args):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, process_group=0)
        print(process.pid, flush=True)
        if not self.signalled:
            ForkedWhenSignalled.signalled = True
            os.kill(os.getpid(), sent)
        return process

async def no_supervisor(stack, bootstrap, catalog, stopping):
    await stopping.wait()

infra.up.Stack, infra.up.supervise = ForkedWhenSignalled, no_supervisor
bootstrap, namespace, where = sys.argv[2:]
sys.argv = ["governor", "up", "--bootstrap", bootstrap, "--namespace", namespace,
            "--fleet", "h100:1", "--log-dir", where, "--data-dir", where]
run()
"""


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_up_forks_a_component_stops_it(kafka_bootstrap, catalog, tmp_path,
                                                           sent):
    up = subprocess.run([sys.executable, "-c", PROGRAM, sent, kafka_bootstrap,
                         catalog.namespace, str(tmp_path)], cwd=REPO, capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL)
    pids = [int(line) for line in up.stdout.split()]
    try:
        assert pids, up.stderr[-3000:]
        deadline = time.monotonic() + 30  # (each stopped is reaped by up's stop first)
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)  # polls the processes with a deadline
        assert [pid for pid in pids if alive(pid)] == [], up.stderr[-3000:]
        assert up.returncode == 0 and "stopped" in up.stderr, up.stderr[-3000:]
    finally:
        for pid in pids:  # (the test failed: none left running)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
