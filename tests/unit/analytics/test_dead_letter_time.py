"""A record the sink cannot decode is kept as a dead letter whatever its Kafka timestamp: a
producer may stamp a record with any 64-bit time, and the store's ``DateTime`` rules (TTL) end in
February 2106. One stamped out of the times the messages accept (before 1970 or at it, past
``MAX_EPOCH_MS``) is stamped with the sink's clock, and its error says so."""

import pytest

from analytics.batch import Batch
from analytics.rows import record_row
from analytics.window import wall_clock_ms
from schemas.limits import MAX_EPOCH_MS
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("t")


@pytest.mark.parametrize("timestamp_ms", [
    2**63 - 1,  # (reading the row failed)
    4_323_283_200_000,  # 2107: its TTL, a 32-bit DateTime, wrapped to 1970 (expired at once)
    0, -1,  # (-1: Kafka's "no timestamp"; expired at once, 30 days after 1970)
])
def test_a_dead_letter_stamped_out_of_range_is_kept_at_the_sinks_time(store, timestamp_ms):
    spec = CATALOG.spec(CATALOG.telemetry)
    before = wall_clock_ms()
    table, row = record_row(spec, CATALOG.telemetry, 0, 7, timestamp_ms, b"k", b"\xff not json")
    batch = Batch()
    batch.add(table, row)
    for insert in batch.inserts(1):
        store.insert(insert.table, insert.data, token=insert.token)
    rows = store.query("SELECT toUnixTimestamp64Milli(time), source_offset, reason, error "
                       "FROM dead_letters FINAL").rows
    assert [(offset, reason) for _, offset, reason, _ in rows] == [(7, "undecodable")]
    time_ms, _, _, error = rows[0]
    assert before <= time_ms <= wall_clock_ms()
    assert f"record timestamp {timestamp_ms} out of range" in error


def test_a_dead_letter_stamped_in_range_keeps_its_records_time():
    """(So that reading the record again gives the same row.)"""
    spec = CATALOG.spec(CATALOG.telemetry)
    for timestamp_ms in (1, MAX_EPOCH_MS):
        _, row = record_row(spec, CATALOG.telemetry, 0, 7, timestamp_ms, b"k", b"\xff")
        assert row[3] == timestamp_ms and "out of range" not in row[9]
