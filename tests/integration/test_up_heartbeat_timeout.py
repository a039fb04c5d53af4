"""``governor up``'s live view judges a worker silent by the heartbeat timeout in force (the
configuration topic's ``worker_heartbeat_timeout_s``), not by the default. The real view loop
on the real broker; the components' processes and the autoscaler's supervisor are left out."""

import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console

import infra.up
from infra.bus import make_producer, now_ms, send
from infra.config_cli import set_setting
from schemas.events import WorkerStatus

pytestmark = pytest.mark.integration


class _NoProcesses:
    """The stack ``up`` runs, without its processes."""

    namespace, slots, log_dir = "", [0], Path(".")

    def __init__(self, bootstrap, namespace, *args, **kwargs) -> None:
        self.namespace = namespace

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def revive(self) -> dict: return {}
    def refused(self) -> dict: return {}
    def dead(self) -> list: return []
    def running_workers(self) -> dict: return {}
    def rotate_logs(self) -> None: ...


async def _no_supervisor(stack, bootstrap, catalog, stopping: asyncio.Event) -> None:
    await stopping.wait()


def _state(table) -> str | None:
    """worker-0's state as ``table`` draws it, if it has a row."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(table)
    for line in console.export_text().splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] == "worker-0":
            return cells[2]
    return None


def test_a_worker_is_silent_only_past_the_heartbeat_timeout_in_force(kafka_bootstrap, catalog,
                                                                     monkeypatch, tmp_path):
    """``governor config set worker_heartbeat_timeout_s 10``: a worker whose heartbeats come
    5 s late is alive to the router, and shown so. Before 6 Dec the view took the default, 3 s,
    whatever the configuration said, and showed it silent with no running count."""
    drawn: list[str | None] = []
    new_draw = asyncio.Event()
    table = infra.up._table

    def drawing(*args):
        drawn.append(_state(made := table(*args)))
        new_draw.set()
        return made

    monkeypatch.setattr(infra.up, "Stack", _NoProcesses)
    monkeypatch.setattr(infra.up, "supervise", _no_supervisor)
    monkeypatch.setattr(infra.up, "_table", drawing)

    async def scenario() -> None:
        await set_setting(kafka_bootstrap, catalog, "worker_heartbeat_timeout_s", 10)
        up = asyncio.create_task(infra.up.run_up(
            kafka_bootstrap, catalog.namespace, "h100:1", tmp_path / "logs", tmp_path / "data",
            Console(file=io.StringIO())))
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        try:
            while drawn[-1:] != ["warm"]:  # a heartbeat each draw, each stamped 5 s ago
                await send(producer, catalog.telemetry, WorkerStatus(
                    event_time_ms=now_ms() - 5_000, worker_id="worker-0", slot=0,
                    pool="h100@llama-3-8b", gpu_type="h100", started_ms=now_ms() - 60_000,
                    running=2), "worker-0")
                new_draw.clear()
                await asyncio.wait_for(new_draw.wait(), 30)
                assert not up.done(), up
        finally:
            up.cancel()
            await asyncio.gather(up, return_exceptions=True)
            await producer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))  # (the view draws twice a second)
