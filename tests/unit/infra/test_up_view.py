"""``governor up``'s live view: the table of the workers, drawn from their heartbeats."""

import io
from types import SimpleNamespace

from rich.console import Console

from infra.bus import now_ms
from infra.up import _table
from schemas.events import WorkerStatus


def _rows(workers: dict[str, WorkerStatus]) -> dict[str, list[str]]:
    """Each worker's cells after its name, as the table draws them."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(_table(workers, {"completed": 3}, SimpleNamespace(namespace="t",
                                                                   dead=lambda: [])))
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
