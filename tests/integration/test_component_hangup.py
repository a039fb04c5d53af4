"""A component started by hand stops gracefully when its terminal closes (SIGHUP), as on
SIGTERM, however its stop's output fails on the hung-up terminal (EIO). Before 7 Dec SIGHUP
ended it at once, with no cleanup: a worker did not hand back its requests nor say "stopped".
``router``, ``worker``, ``controllers`` and ``sink`` share one stop (``_run_until_signalled``):
the worker's stands for them; ``streams`` is Faust's and ``sim-server``'s is its own, each
tested on its own. Real CLI processes on the real broker, in a pseudo-terminal."""

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.worker_support import Observer
from tests.terminals import Terminal

pytestmark = pytest.mark.integration


def _hung_up(args: list[str], serving: bytes, cwd) -> int:
    """Run ``governor ARGS`` in a terminal until it says ``serving``, close the terminal and
    send SIGHUP (its shell's, as the terminal closes); its exit status."""
    terminal = Terminal()
    proc = subprocess.Popen([sys.executable, "-m", "infra.cli", *args], stdin=subprocess.DEVNULL,
                            stdout=terminal.slave, stderr=terminal.slave, start_new_session=True,
                            cwd=cwd)
    terminal.close_slave()
    try:
        deadline = time.monotonic() + 90
        while serving not in terminal.said:
            assert proc.poll() is None and time.monotonic() < deadline, terminal.said[-3000:]
            time.sleep(0.1)  # polls the output with a deadline
        terminal.close()
        proc.send_signal(signal.SIGHUP)
        return proc.wait(timeout=60)
    finally:
        terminal.close()  # (the test failed first: its reader and the terminal go too)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _component(command: str, bootstrap: str, namespace: str) -> list[str]:
    return [*command.split(), "--bootstrap", bootstrap, "--namespace", namespace]


def test_a_worker_whose_terminal_closes_stops_gracefully(kafka_bootstrap, catalog, tmp_path):
    assert _hung_up(_component("worker --slot 0", kafka_bootstrap, catalog.namespace),
                    b": serving ", tmp_path) == 0

    async def stopped() -> None:
        async with Observer(kafka_bootstrap, catalog) as observer:
            await observer.until(lambda: observer.state() == "stopped", timeout_s=30)

    asyncio.run(stopped())  # its last heartbeat: "stopped", as after SIGTERM


def test_a_streams_worker_whose_terminal_closes_stops_gracefully(kafka_bootstrap, catalog,
                                                                 tmp_path):
    assert _hung_up(_component("streams", kafka_bootstrap, catalog.namespace), b": serving ",
                    tmp_path) == 0


def test_a_sim_server_whose_terminal_closes_stops_gracefully(tmp_path):
    """Its own stop too (no broker)."""
    assert _hung_up(["sim-server", "--port", "0"], b"http://127.0.0.1:", tmp_path) == 0
