"""``governor up``'s live view: the table of the workers, drawn from their heartbeats."""

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from infra.bus import now_ms
from infra.up import _FleetView, _live, _table
from schemas.events import WorkerStatus


def _stack(running: dict[int, str] | None = None) -> SimpleNamespace:
    """A stack as the view asks it: its worker processes running (slot -> pool)."""
    return SimpleNamespace(namespace="t", dead=lambda: [],
                           running_workers=lambda: dict(running or {}))


_STACK = _stack()


def _rows(workers: dict[str, WorkerStatus], stack: SimpleNamespace = _STACK
          ) -> dict[str, list[str]]:
    """Each worker's cells after its name, as the table draws them."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(_table(workers, {"completed": 3}, stack))
    rows = {}
    for line in console.export_text().splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].startswith("worker-"):
            rows[cells[0]] = cells[1:]
    return rows


def test_a_worker_silent_past_the_heartbeat_timeout_is_not_shown_busy() -> None:
    """worker-1 was SIGKILLed 10 s ago with 5 requests running (the router has moved them on):
    before 6 Dec its row kept saying warm, 5 running, 2 waiting, for as long as the view ran
    (until the worker came back), only its 'last seen' growing."""
    now = now_ms()

    def status(worker: str, slot: int, at_ms: int, **fields) -> WorkerStatus:
        return WorkerStatus(event_time_ms=at_ms, worker_id=worker, slot=slot,
                            pool="h100@llama-3-8b", gpu_type="h100", started_ms=now - 60_000,
                            **fields)

    rows = _rows({"worker-0": status("worker-0", 0, now, running=3),
                  "worker-1": status("worker-1", 1, now - 10_000, running=5, waiting=2,
                                     requests_completed=40),
                  "worker-2": status("worker-2", 2, now - 10_000, state="stopped")})
    assert rows["worker-0"][1:5] == ["warm", "3", "0", "0"]
    assert rows["worker-1"][1:5] == ["silent", "-", "-", "40"]
    assert rows["worker-2"][1:4] == ["stopped", "0", "0"]  # (said so itself)


def test_a_long_pool_name_is_shown_whole_at_80_columns() -> None:
    """Output to a file or a pipe is 80 columns: before, the pool column was cut
    (``h100@meta-l…``), as every long vLLM model name would be."""
    pool = "h100@meta-llama/Meta-Llama-3.1-70B-Instruct"
    workers = {f"worker-{slot}": WorkerStatus(
        event_time_ms=now_ms(), worker_id=f"worker-{slot}", slot=slot, pool=pool,
        gpu_type="h100", started_ms=now_ms()) for slot in (0, 1)}
    console = Console(width=80, file=io.StringIO(), record=True)
    console.print(_FleetView(workers, {}, _STACK))
    text = console.export_text()
    assert f"{pool}: worker-0, worker-1" in text
    assert "…" not in text and max(map(len, text.splitlines())) <= 80


def test_a_table_that_fits_keeps_its_pool_column() -> None:
    """(At 80 columns even ``h100@llama-3-8b`` is cut by two characters: 120 here.)"""
    workers = {"worker-0": WorkerStatus(event_time_ms=now_ms(), worker_id="worker-0", slot=0,
                                        pool="h100@llama-3-8b", gpu_type="h100",
                                        started_ms=now_ms())}
    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(_FleetView(workers, {}, _STACK))
    text = console.export_text()
    assert "│ h100@llama-3-8b │" in text and "h100@llama-3-8b: worker-0" not in text


def test_the_last_draw_to_a_file_ends_its_line() -> None:
    """Before, ``governor up > file`` ended ``terminal events: completed 3 stopped``."""
    out = io.StringIO()
    console = Console(width=80, file=out)
    workers = {"worker-0": WorkerStatus(event_time_ms=now_ms(), worker_id="worker-0", slot=0,
                                        pool="h100@llama-3-8b", gpu_type="h100",
                                        started_ms=now_ms())}
    with pytest.raises(KeyboardInterrupt):  # (Ctrl-C ends the view)
        with _live(_FleetView(workers, {"completed": 3}, _STACK), console):
            raise KeyboardInterrupt
    console.print("stopped")
    assert out.getvalue().splitlines()[-1] == "stopped"


def test_a_worker_not_heard_from_yet_has_its_row() -> None:
    """A worker says nothing until its engine is up: `up --vllm-url` drew an empty table for as
    long as the servers loaded (up to 600 s), as if it had started no worker."""
    pool = "h100@llama-3-8b"
    heard = {"worker-0": WorkerStatus(event_time_ms=now_ms(), worker_id="worker-0", slot=0,
                                      pool=pool, gpu_type="h100", started_ms=now_ms())}
    stack = _stack({0: pool, 1: pool})
    rows = _rows(heard, stack)
    assert rows["worker-0"][:2] == [pool, "warm"]
    assert rows["worker-1"] == [pool, "not heard yet", "-", "-", "-", "-"]
    console = Console(width=60, file=io.StringIO(), record=True)  # (narrow: pools under it)
    console.print(_FleetView(heard, {}, stack))
    assert f"{pool}: worker-0, worker-1" in console.export_text()
