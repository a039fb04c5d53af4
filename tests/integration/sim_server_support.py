"""A ``governor sim-server`` subprocess for the tests that drive the vLLM adapter against it."""

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-3-8b"
SPEEDUP = 20


def served_url(proc: subprocess.Popen, deadline_s: float = 60.0) -> str:
    """The URL the sim-server says it serves (started on port 0: any free one). Its stderr is
    read on to the end, so that a full pipe never blocks it."""
    lines: queue.Queue[str] = queue.Queue()

    def read_on() -> None:
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=read_on, daemon=True).start()
    said: list[str] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            said.append(lines.get(timeout=0.1))
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if " at http://" in said[-1]:
            return said[-1].rsplit(" at ", 1)[1].strip()
    raise RuntimeError(f"sim-server told no URL (exit code {proc.poll()}): {''.join(said)}")


def wait_healthy(url: str, proc: subprocess.Popen, deadline_s: float = 60.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        # (TimeoutError: it took the request and did not answer within 1 s, a server stalled by
        # a loaded machine: asked again, until the deadline)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)  # polling interval, not a wait for readiness
    raise TimeoutError(f"sim-server at {url} not healthy after {deadline_s}s")


@contextlib.contextmanager
def sim_server(speedup: float = SPEEDUP, *options: str):
    """A sim-server subprocess on any free port: (its URL, the process). ``options``: more of
    ``governor sim-server``'s."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "sim-server", "--port", "0", "--gpu", "h100",
         "--model", MODEL, "--speedup", str(speedup), *options],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = served_url(proc)
        wait_healthy(url, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
