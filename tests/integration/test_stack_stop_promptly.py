"""``Stack.stop`` (what ``governor up`` and ``demo`` run on Ctrl-C or SIGTERM) ends each component
by its own exit, not SIGKILL: a worker still running a long request lets it run for
``Stack.finish_s``, then hands it back (``Requeued``) and exits 0. Before 6 Dec a worker drained
for up to its 30 s ``--drain-timeout-s`` while ``stop`` killed it after 15 s, so a request running
longer was neither finished nor handed back, and each stop could take 45 s. A terminal's Ctrl-C
reaches the components only through ``stop``."""

import asyncio
import contextlib
import os

import pytest

from infra.stack import PoolSpec, Stack
from tests.integration.test_worker_handback import _dispatch
from tests.integration.worker_support import Observer

pytestmark = pytest.mark.integration

#: Tokens of a request that runs far past ``Stack.finish_s`` (minutes of a simulated H100).
LONG_REQUEST_TOKENS = 6_000


async def _stopped_while_running(bootstrap, catalog, stack: Stack) -> tuple[list[str], list]:
    """Stop ``stack`` once its worker runs a long request; what ``stop`` killed, and the
    request's events on the telemetry topic, read until one ends it (or for 20 s)."""
    async with Observer(bootstrap, catalog) as observer:
        def of_long(kind: str) -> list:
            return [e for e in observer.events if e.request_id == "long" and e.type == kind]

        await observer.dispatch(_dispatch("long", max_tokens=LONG_REQUEST_TOKENS))
        await observer.until(lambda: of_long("started"), timeout_s=120)
        killed = await asyncio.to_thread(stack.stop)
        with contextlib.suppress(TimeoutError):  # (a worker killed ends it nowhere)
            await observer.until(lambda: of_long("requeued") or of_long("completed"), 20)
        return killed, [e for e in observer.events if e.request_id == "long"]


def test_a_stack_stopped_while_a_worker_runs_a_long_request_is_killed_nowhere(
        kafka_bootstrap, catalog, tmp_path):
    data_dir = tmp_path / "analytics"
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path / "logs",
                  with_streams=True, sink_data_dir=data_dir)
    stack.start()
    try:
        killed, events = asyncio.run(_stopped_while_running(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()  # (a second stop, should the test fail before its own: nothing is left)
    assert killed == []
    assert {name: proc.returncode for name, proc in stack.processes.items()} == dict.fromkeys(
        ["sink", "router", "controllers", "streams", "worker-0"], 0)
    handed_back = [e for e in events if e.type == "requeued"]
    assert [e.detail for e in handed_back] == ["worker stopped before the request finished"]
    assert 0 < handed_back[0].tokens_done < LONG_REQUEST_TOKENS


def test_a_terminals_ctrl_c_reaches_the_components_only_through_stop(kafka_bootstrap, catalog,
                                                                     tmp_path):
    """Ctrl-C in a terminal is SIGINT to its whole foreground process group. Before 6 Dec the
    components shared the group of the ``up`` or ``demo`` that started them, so they all had it
    at once: the sink stopped beside the workers, and could exit without their final heartbeats
    (``governor up``, Ctrl-C: a worker's last stored state ``warm``, not ``stopped``). Each now
    runs in a group of its own, and ``stop`` ends them in order."""
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path / "logs",
                  with_router=False, sink_data_dir=tmp_path / "analytics")
    stack.start()
    try:
        groups = {name: os.getpgid(proc.pid) for name, proc in stack.processes.items()}
    finally:
        killed = stack.stop()
    assert groups == {name: proc.pid for name, proc in stack.processes.items()}
    assert os.getpgid(0) not in groups.values()
    assert killed == []


async def _heard(bootstrap, catalog) -> None:
    """Wait for worker-0's first heartbeat: it serves, its SIGTERM handled (``infra.cli``)."""
    async with Observer(bootstrap, catalog) as observer:
        await observer.until(lambda: observer.statuses, timeout_s=120)


def test_a_paused_component_is_resumed_and_stops_by_itself(kafka_bootstrap, catalog, tmp_path):
    """A component paused (``demo --fault pause:...``, SIGSTOP) ignores SIGTERM until resumed.
    Before 6 Dec ``stop`` did not resume it: it waited out ``timeout_s`` and killed it."""
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path / "logs",
                  with_router=False, finish_s=1.0)
    stack.start()
    try:
        asyncio.run(_heard(kafka_bootstrap, catalog))
        stack.pause("worker-0")
        killed = stack.stop(timeout_s=10)
    finally:
        stack.stop()
    assert killed == []
    assert stack.processes["worker-0"].returncode == 0
