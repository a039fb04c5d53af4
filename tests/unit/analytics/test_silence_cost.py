"""The streams' spend and ``governor report cost`` provision a worker's GPU by one rule: each
heartbeat to the next, a silence counted up to 3 s, nothing after a ``stopped`` heartbeat nor
across a restart. Before 6 Dec the streams counted a silence in full up to 5 s and nothing past
it, and a gap across a restart: for the heartbeats below they charged 35 GPU-seconds where the
report charged 36."""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from streams.signals.workers import WorkerBook
from tests.unit.analytics.test_last_attempt import _write

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)).timestamp() * 1000)
if T0 // 86_400_000 != (T0 + 60_000) // 86_400_000:
    T0 -= 120_000  # the report counts by day: keep the minute of heartbeats within one


def _beats() -> list[events.WorkerStatus]:
    """A first run: 0-10 s, silent 4 s, 14-20 s, silent 10 s, 30-35 s, then gone (a crash). A
    second run: 36-45 s, then stopped. A heartbeat every 0.5 s."""
    def beat(t_s: float, started_s: float, state: str = "warm") -> events.WorkerStatus:
        return events.WorkerStatus(
            event_time_ms=T0 + int(t_s * 1000), worker_id="w1", slot=0, pool="h100@m",
            gpu_type="h100", started_ms=T0 + int(started_s * 1000) - 1000, state=state)

    def run(start: int, end: int, started_s: float) -> list[events.WorkerStatus]:
        return [beat(i / 2, started_s) for i in range(start * 2, end * 2 + 1)]
    return [*run(0, 10, 0), *run(14, 20, 0), *run(30, 35, 0), *run(36, 44, 36),
            beat(44.5, 36), beat(45, 36, "stopped")]


def test_silences_and_restarts_cost_the_same_in_the_streams_and_the_report(store):
    provisioned_s = 10 + 3 + 6 + 3 + 5 + 9  # the 4 s and 10 s silences each count 3 s
    book = WorkerBook({}, DEFAULT_GPU_PRICES_USD_PER_HOUR)
    streams_usd = sum(out.payload["usd"] for beat in _beats() for out in book.heartbeat(beat)
                      if out.key == "fleet:all")
    price_s = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
    assert streams_usd == pytest.approx(provisioned_s * price_s)
    _write(store, 1, [("telemetry", beat) for beat in _beats()])
    rows = run_report(StoreSource(store), "cost").dicts()
    assert sum(r["gpu_hours"] for r in rows) == pytest.approx(provisioned_s / 3600, abs=1e-4)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(streams_usd, abs=1e-6)


def test_a_silence_across_midnight_costs_its_part_of_each_day(store):
    """Heartbeats up to 1 s before midnight and from 1 s after it: the 2 s silence costs 1 s on
    each day, and a 10 s silence from 0.5 s before midnight its 3 s cap, 0.5 s before and 2.5 s
    after. Before 6 Dec the report counted a worker's heartbeats day by day: a silence across
    midnight cost nothing, while the streams counted it."""
    midnight_ms = (T0 // 86_400_000 - 1) * 86_400_000  # yesterday's: inside the 7-day window

    def beats(worker_id: str, times_s: list[float]) -> list[events.WorkerStatus]:
        return [events.WorkerStatus(
            event_time_ms=midnight_ms + int(t * 1000), worker_id=worker_id, slot=0,
            pool="h100@m", gpu_type="h100", started_ms=midnight_ms - 60_000, state="warm")
            for t in times_s]

    def half_seconds(start_s: float, end_s: float) -> list[float]:
        return [start_s + i / 2 for i in range(int((end_s - start_s) * 2) + 1)]
    w1 = beats("w1", half_seconds(-5, -1) + half_seconds(1, 5))  # 4 + 2 + 4 s
    w2 = beats("w2", half_seconds(-2, -0.5) + half_seconds(9.5, 10))  # 1.5 + 3 + 0.5 s
    book = WorkerBook({}, DEFAULT_GPU_PRICES_USD_PER_HOUR)
    streams_usd = sum(out.payload["usd"] for beat in w1 + w2 for out in book.heartbeat(beat)
                      if out.key == "fleet:all")
    price_s = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
    assert streams_usd == pytest.approx(15 * price_s)
    _write(store, 1, [("telemetry", beat) for beat in w1 + w2])
    rows = run_report(StoreSource(store), "cost").dicts()
    by_day = {str(r["day"]): r["cost_usd"] / price_s for r in rows}  # (gpu_hours: 4 digits)
    day_before = dt.datetime.fromtimestamp(midnight_ms / 1000 - 1, dt.UTC).date().isoformat()
    day_after = dt.datetime.fromtimestamp(midnight_ms / 1000, dt.UTC).date().isoformat()
    assert by_day == pytest.approx({day_before: 4 + 1 + 1.5 + 0.5, day_after: 1 + 4 + 2.5 + 0.5},
                                   abs=0.01)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(streams_usd, abs=1e-6)
