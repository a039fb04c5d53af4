"""A worker serving with tensor parallelism is billed for each of its GPUs (``gpus`` on its
heartbeat) by the streams and by ``governor report cost`` alike; a heartbeat without the field
(a worker of before 6 Dec, or one GPU) is one GPU."""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.rows import TopicRows, record_row
from analytics.schema import TABLES
from model_probes import CATALOG
from model_probes import record as kafka_record
from schemas import events
from schemas.codec import encode
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from streams.signals.workers import WorkerBook
from tests.unit.analytics.test_last_attempt import _write

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)).timestamp() * 1000)
if T0 // 86_400_000 != (T0 + 60_000) // 86_400_000:
    T0 -= 120_000  # the report counts by day: keep the heartbeats within one


def _beats(worker_id: str, model: str, gpus: int) -> list[events.WorkerStatus]:
    """10 s of heartbeats, one every 0.5 s."""
    return [events.WorkerStatus(
        event_time_ms=T0 + i * 500, worker_id=worker_id, slot=0, pool=f"h100@{model}",
        gpu_type="h100", gpus=gpus, models_loaded=[model], started_ms=T0 - 1000)
        for i in range(21)]


def test_a_tp4_worker_costs_four_gpus_in_the_streams_and_the_report(store):
    beats = _beats("w70", "llama-2-70b", 4) + _beats("w8", "llama-3-8b", 1)
    book = WorkerBook({}, DEFAULT_GPU_PRICES_USD_PER_HOUR)
    streams_usd = {w: sum(out.payload["usd"] for beat in beats if beat.worker_id == w
                          for out in book.heartbeat(beat) if out.key == f"worker:{w}")
                   for w in ("w70", "w8")}
    price_s = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
    assert streams_usd == pytest.approx({"w70": 4 * 10 * price_s, "w8": 10 * price_s})
    _write(store, 1, [("telemetry", beat) for beat in beats])
    rows = run_report(StoreSource(store), "cost").dicts()
    gpu_s = {r["pool"]: r["gpu_hours"] * 3600 for r in rows}  # (gpu_hours: 4 digits)
    usd = {r["pool"]: r["cost_usd"] for r in rows}
    assert gpu_s == pytest.approx({"h100@llama-2-70b": 40, "h100@llama-3-8b": 10}, abs=0.4)
    assert usd == pytest.approx({"h100@llama-2-70b": streams_usd["w70"],
                                 "h100@llama-3-8b": streams_usd["w8"]}, abs=1e-6)


def test_the_sinks_hot_path_keeps_a_heartbeats_gpus_and_one_where_it_says_none():
    spec = CATALOG.spec(CATALOG.telemetry)
    column = [name for name, _ in TABLES["worker_status"].columns].index("gpus")
    for gpus in (4, 1):
        beat = _beats("w", "llama-2-70b", gpus)[0]
        record = kafka_record(spec, encode(beat))
        table, row = TopicRows(spec).row(record)
        assert (table, row[column]) == ("worker_status", gpus)
        assert row == record_row(spec, *record)[1]  # (pydantic's, off the hot path)
