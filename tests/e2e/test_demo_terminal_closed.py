"""The terminal a demo runs in closes: the demo stops its stack and writes its report, as on
Ctrl-C. A write to the hung-up terminal fails (EIO): before 7 Dec the demo's first line after
the hangup ("interrupted after ...") ended it, its stack stopped but its report lost (and an
embedded broker it started left running)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.test_demo import _alive_with
from tests.terminals import Terminal

pytestmark = pytest.mark.e2e


def test_a_demo_whose_terminal_closes_stops_its_stack_and_writes_its_report(kafka_bootstrap,
                                                                            tmp_path):
    out = tmp_path / "demo.json"
    terminal = Terminal()
    demo = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "demo", "--duration", "600", "--fleet", "h100:1",
         "--bootstrap", kafka_bootstrap, "--json", str(out), "--no-analytics"],
        stdin=subprocess.DEVNULL, stdout=terminal.slave, stderr=terminal.slave,
        start_new_session=True, cwd=tmp_path)  # (its logs: under .governor there)
    terminal.close_slave()
    run_id = None
    try:
        deadline = time.monotonic() + 120
        while b" up; logs in " not in terminal.said:
            assert demo.poll() is None and time.monotonic() < deadline, terminal.said[-3000:]
            time.sleep(0.1)  # polls the output with a deadline
        said = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.said.decode())  # (no colours)
        run_id = re.search(r"demo-[0-9]+-[0-9]+-[0-9a-f]+", said).group()
        assert _alive_with(run_id), "the demo's stack is not running"
        terminal.close()
        demo.send_signal(signal.SIGHUP)  # (its shell's, as the terminal closes)
        demo.wait(timeout=120)
    finally:
        terminal.close()  # (the test failed first: its reader and the terminal go too)
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in _alive_with(run_id) if run_id else []:  # (the test failed: none left)
            os.kill(pid, signal.SIGKILL)
    assert _alive_with(run_id) == []  # router, workers, controllers, streams: all stopped
    assert demo.returncode == 130
    report = json.loads(out.read_text())
    assert report["run_id"] == run_id and report["interrupted"] is True
