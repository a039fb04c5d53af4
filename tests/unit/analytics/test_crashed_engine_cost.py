"""A worker whose engine crashed, still up and heart-beating ``crashed`` (a vLLM server that
stopped answering), holds its GPU: the cost report charges that time, as the streams' spend
does (each heartbeat to the next unless ``stopped``). Before 6 Dec the report left ``crashed``
heartbeats out: a live H100 worker whose sim-server was stopped showed 73.5 GPU-s ($0.0612) in
the streams and 35.7 GPU-s ($0.0298) in ``governor report cost``."""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from streams.signals.workers import WorkerBook
from tests.unit.analytics.test_last_attempt import _write

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)).timestamp() * 1000)


def _beats() -> list[events.WorkerStatus]:
    """20 s warm, then 20 s crashed, a heartbeat every 0.5 s, then stopped."""
    return [events.WorkerStatus(
        event_time_ms=T0 + i * 500, worker_id="w1", slot=0, pool="h100@m", gpu_type="h100",
        started_ms=T0 - 1000, state="warm" if i < 40 else "crashed" if i < 80 else "stopped")
        for i in range(81)]


def test_a_crashed_engines_heartbeats_cost_as_in_the_streams(store):
    book = WorkerBook({}, DEFAULT_GPU_PRICES_USD_PER_HOUR)
    streams_usd = sum(out.payload["usd"] for beat in _beats() for out in book.heartbeat(beat)
                      if out.key == "fleet:all")
    assert streams_usd == pytest.approx(40 * DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600)
    _write(store, 1, [("telemetry", beat) for beat in _beats()])
    rows = run_report(StoreSource(store), "cost").dicts()
    assert sum(r["gpu_hours"] for r in rows) == pytest.approx(40 / 3600, abs=1e-4)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(streams_usd, abs=1e-6)
