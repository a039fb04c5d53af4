"""A flush whose records are stamped on many days is written: the store's partitions are days."""

import time
from collections import namedtuple

from analytics.rows import TopicRows
from schemas.codec import encode
from schemas.events import WorkerStatus
from schemas.topics import TopicCatalog

_Record = namedtuple("_Record", "topic partition offset timestamp key value")
DAY_MS = 86_400_000


def test_heartbeats_stamped_on_150_days_are_written_in_one_insert(store):
    """Before 6 Dec the insert failed (ClickHouse refuses more than 100 partitions in one insert
    block by default) and the sink tried the same flush again for ever: 150 valid heartbeats,
    each stamped a day further ahead, stopped every table's history (governor up, hs2: no
    heartbeat nor request stored after them)."""
    catalog, now = TopicCatalog("t"), int(time.time() * 1000)  # (not past the table's TTL)
    records = [_Record(catalog.telemetry, 0, n, now, b"w", encode(WorkerStatus(
        event_time_ms=now + n * DAY_MS, worker_id=f"days-{n}", slot=31, pool="h100@llama-3-8b",
        gpu_type="h100", started_ms=now))) for n in range(150)]
    tables = TopicRows(catalog.spec(catalog.telemetry)).tables(records)
    store.insert("worker_status", tables["worker_status"], token="flush-1")
    assert store.query("SELECT count() FROM worker_status").rows == [[150]]
