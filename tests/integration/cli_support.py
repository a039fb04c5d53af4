"""Helper of the integration tests that run a long-running ``governor`` command as a process."""

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def output_until(args: list[str], said: Callable[[list[str]], bool], cwd: Path,
                 timeout_s: float = 90) -> list[str]:
    """The output lines (stdout and stderr) of ``governor ARGS`` run in ``cwd`` once ``said``
    holds of them; the command is stopped by SIGTERM then, and its lines to its exit returned.
    Fails if it exits first, or ``said`` does not hold within ``timeout_s``."""
    proc = subprocess.Popen([sys.executable, "-m", "infra.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, cwd=cwd)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not said(lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.1)  # polls the output with a deadline
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    return lines
