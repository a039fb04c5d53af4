"""A batch gives the same inserts for the same records, however their fetches interleaved."""

import pytest

from analytics.batch import Batch, OffsetRange, covers
from analytics.rows import message_row
from schemas.examples import examples
from schemas.events import WorkerStatus
from schemas.requests import ResponseChunk

STATUS = message_row(examples()[WorkerStatus], "telemetry")
CHUNK = message_row(examples()[ResponseChunk], "responses")


def _record(topic: str, partition: int, offset: int, kind=STATUS) -> tuple[str, tuple]:
    table, columns = kind
    return table, (topic, partition, offset, 1_700_000_000_000 + offset, *columns)


RECORDS = [_record("ns.telemetry", p, o) for p in (0, 1) for o in range(5)] + [
    _record("ns.responses", 2, o, CHUNK) for o in range(10, 13)]


def _batch(order: list[tuple[str, tuple]]) -> Batch:
    batch = Batch()
    for table, row in order:
        batch.add(table, row)
    return batch


def test_ranges_and_rows_do_not_depend_on_how_partitions_interleaved():
    by_partition = _batch(RECORDS)
    interleaved = _batch(sorted(RECORDS, key=lambda r: (r[1][2], -r[1][1])))  # offset-major
    assert by_partition.ranges() == interleaved.ranges() == [
        OffsetRange("ns.responses", 2, 10, 12), OffsetRange("ns.telemetry", 0, 0, 4),
        OffsetRange("ns.telemetry", 1, 0, 4)]
    for one, other in zip(by_partition.inserts(7), interleaved.inserts(7), strict=True):
        assert (one.table, one.token) == (other.table, other.token)
        assert one.data.equals(other.data)
    assert [i.token for i in by_partition.inserts(7)] == ["7:response_chunks", "7:worker_status"]
    assert len(by_partition) == 13 and by_partition.records == 13


def test_rows_of_a_partition_must_come_in_offset_order():
    batch = _batch(RECORDS[:3])
    with pytest.raises(ValueError, match=r"ns.telemetry\[0\]@1 is not after 2"):
        batch.add(*_record("ns.telemetry", 0, 1))
    assert batch.last_offset("ns.telemetry", 0) == 2 and batch.last_offset("ns.kv", 0) == -1


def test_an_offset_range_round_trips_through_the_journal_form():
    item = OffsetRange("ns.telemetry", 3, 100, 250)
    assert OffsetRange.from_list(item.as_list()) == item
    assert covers([item], "ns.telemetry", 3, 100) and covers([item], "ns.telemetry", 3, 250)
    assert not covers([item], "ns.telemetry", 3, 251) and not covers([item], "ns.telemetry", 2, 100)


def test_an_empty_batch_writes_nothing():
    assert Batch().inserts(1) == [] and Batch().ranges() == [] and not Batch()


def test_a_batch_is_gapless_when_no_offset_is_missing_between_a_partitions_records():
    """The journal looks for a pending flush's rows held in their hours only when so
    (``Journal._not_held``): a record missing in between may be held in any hour."""
    assert _batch(RECORDS).gapless()
    assert not _batch([r for r in RECORDS if r[1][:3] != ("ns.telemetry", 1, 2)]).gapless()
    assert _batch([r for r in RECORDS if r[1][:3] != ("ns.telemetry", 1, 4)]).gapless()
