"""A worker whose supervisor (``governor up``, ``demo``) is killed outright while it runs a long
request stops as ``up``'s own stop would stop it (``Stack.stop``): it finishes what it runs for
up to ``STOP_FINISH_S`` (5 s), then hands the rest back (``Requeued``) and exits. Before 7 Dec
it stopped as on one SIGTERM, finishing for up to its ``--drain-timeout-s`` (30 s), though
README said it handed back what it ran within a few seconds.

The real ``Stack``, started by a process of its own that the test kills with SIGKILL, and the
real worker on the real broker."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import alive
from tests.integration.test_stack_stop_promptly import LONG_REQUEST_TOKENS
from tests.integration.test_worker_handback import _dispatch
from tests.integration.worker_support import Observer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import sys, time
from pathlib import Path
from infra.stack import PoolSpec, Stack

bootstrap, namespace, logs = sys.argv[1:]
stack = Stack(bootstrap, namespace, [PoolSpec("h100", 1)], Path(logs), with_router=False)
stack.start()
print(stack.processes["worker-0"].pid, flush=True)
time.sleep(600)  # (until killed)
"""
#: The worker's watch looks every second; it finishes for 5 s, then hands back: well under
#: its 30 s ``--drain-timeout-s``.
HANDED_BACK_WITHIN_S = 20.0


async def _supervisor_killed_while_running(bootstrap, catalog, supervisor) -> tuple[list, float]:
    """Kill ``supervisor`` once its worker runs a long request; the request's events, read
    until one ends it (or for ``HANDED_BACK_WITHIN_S``), and how long after the kill."""
    async with Observer(bootstrap, catalog) as observer:
        def of_long(kind: str) -> list:
            return [e for e in observer.events if e.request_id == "long" and e.type == kind]

        await observer.dispatch(_dispatch("long", max_tokens=LONG_REQUEST_TOKENS))
        await observer.until(lambda: of_long("started"), timeout_s=120)
        supervisor.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await observer.until(lambda: of_long("requeued") or of_long("completed"),
                                 HANDED_BACK_WITHIN_S)
        return [e for e in observer.events if e.request_id == "long"], time.monotonic() - killed


def test_a_worker_of_a_killed_supervisor_hands_back_what_it_runs_after_5_s(
        kafka_bootstrap, catalog, tmp_path):
    supervisor = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, kafka_bootstrap, catalog.namespace, str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True)
    worker = None
    try:
        worker = int(supervisor.stdout.readline())
        events, after_s = asyncio.run(
            _supervisor_killed_while_running(kafka_bootstrap, catalog, supervisor))
        supervisor.wait(10)
        handed_back = [e for e in events if e.type == "requeued"]
        assert [e.detail for e in handed_back] == [
            "worker stopped before the request finished"], (after_s, events)
        assert 0 < handed_back[0].tokens_done < LONG_REQUEST_TOKENS
        deadline = time.monotonic() + 30
        while alive(worker):  # (it exits once handed back: polled under a deadline)
            assert time.monotonic() < deadline, "the worker did not exit"
            time.sleep(0.2)
        log = (tmp_path / "worker-0.log").read_text()
        assert "is gone: stopping" in log
    finally:
        supervisor.kill()
        supervisor.wait(10)
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)
