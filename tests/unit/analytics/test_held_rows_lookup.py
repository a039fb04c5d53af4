"""A pending flush written again looks for the rows its tables without views hold in the hours
of its rows only (``Journal._not_held``), and finds what the whole table's scan found."""

import random
import time

import pyarrow as pa
import pytest
from analytics.batch import Batch
from analytics.journal import Flush, Journal
from analytics.rows import record_row
from analytics.schema import TABLES
from benchmarks.flush_replay import fill
from schemas.topics import TopicCatalog

HOUR_MS = 3_600_000
#: Today's midnight, UTC: a flush around it has rows of two days (two partitions of the table).
MIDNIGHT_MS = int(time.time() * 1000) // (24 * HOUR_MS) * (24 * HOUR_MS)


def _dispatches(topic: str, partition: int, offsets, time_of) -> pa.Table:
    return TABLES["dispatches"].to_arrow([
        (topic, partition, offset, time_of(offset), "dispatch", f"r-{topic}-{partition}-{offset}",
         "", "t-1", "m", "w-1", 0, 0, 0, "router-0") for offset in offsets])


def _around_midnight(offset: int) -> int:
    """A record an hour and some after the one before it, from 5 hours before midnight."""
    return MIDNIGHT_MS - 5 * HOUR_MS + offset * (HOUR_MS + 61_000)


def _flush_of(partitions, offsets) -> Batch:
    batch = Batch()
    for partition in partitions:
        batch.add_partition("ns.dispatch", partition, offsets[0], offsets[-1], {
            "dispatches": _dispatches("ns.dispatch", partition, offsets, _around_midnight)})
    return batch


def _held(store, table: str = "dispatches") -> list[list]:
    return store.query(f"SELECT kafka_topic, kafka_partition, kafka_offset, count() FROM {table} "
                       "GROUP BY ALL ORDER BY ALL").rows


def test_the_rows_looked_for_in_their_hours_are_those_the_whole_table_holds(store):
    """A flush of three partitions of a topic over ten hours and two days, its insert cut with
    some of each partition's rows held; beside them, the same partitions and offsets of another
    topic, later offsets of its partitions and another partition of its topic, in the same
    hours: the rows not held, and their token, are the whole table's scan's."""
    batch = _flush_of((0, 1, 2), range(10))
    [insert] = batch.inserts("run-a:1")
    held = batch.data("dispatches").filter(pa.array(
        [(p == 0 and o < 5) or (p == 2 and o >= 5) for p, o in zip(
            insert.data["kafka_partition"].to_pylist(), insert.data["kafka_offset"].to_pylist())]))
    store.insert("dispatches", held)
    for topic, partition, offsets in (("other.dispatch", 0, range(10)),
                                      ("other.dispatch", 2, range(10)),
                                      ("ns.dispatch", 0, range(10, 20)),
                                      ("ns.dispatch", 3, range(10))):
        store.insert("dispatches", _dispatches(topic, partition, offsets, _around_midnight))
    journal = Journal(store, "run-b")
    in_hours, whole_table = journal._not_held(insert, True), journal._not_held(insert, False)
    assert in_hours[0].equals(whole_table[0]) and in_hours[1] == whole_table[1]
    rest = list(zip(in_hours[0]["kafka_partition"].to_pylist(),
                    in_hours[0]["kafka_offset"].to_pylist()))
    assert rest == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(10)] + [
        (2, o) for o in range(5)]
    assert in_hours[1].startswith("run-a:1:dispatches:rest-")
    nothing_held = _flush_of((4,), range(10)).inserts("run-a:2")[0]
    assert journal._not_held(nothing_held, True) == (nothing_held.data, nothing_held.token)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_lookup_in_hours_agrees_with_the_whole_tables_on_random_flushes(store, seed):
    """Flushes of 1-4 partitions over up to 40 hours (up to three days), a random part of each held,
    among rows of other topics at the same coordinates and of the same partitions past the
    flush's offsets: the rows not held, and their token, are the whole table's scan's."""
    rng = random.Random(seed)
    for flush_id in range(1, 4):
        step_ms = rng.choice([1_000, 60_000, HOUR_MS // 2, HOUR_MS + 7_000])
        first = rng.randrange(0, 1_000)
        offsets = range(first, first + rng.randrange(5, 40))

        def time_of(offset: int) -> int:
            return MIDNIGHT_MS - 3 * HOUR_MS + (offset - first) * step_ms

        batch = Batch()
        for partition in rng.sample(range(6), rng.randrange(1, 5)):
            batch.add_partition("ns.dispatch", partition, offsets[0], offsets[-1], {
                "dispatches": _dispatches("ns.dispatch", partition, offsets, time_of)})
            store.insert("dispatches", _dispatches(
                rng.choice(["other.dispatch", "ns.dispatch-2"]), partition, offsets, time_of))
            store.insert("dispatches", _dispatches("ns.dispatch", partition,
                                                   range(offsets[-1] + 1, offsets[-1] + 9),
                                                   time_of))
        [insert] = batch.inserts(f"run-a:{flush_id}")
        held = insert.data.filter(pa.array([rng.random() < 0.4 for _ in range(len(insert.data))]))
        if held.num_rows:
            store.insert("dispatches", held)
        journal = Journal(store, "run-b")
        in_hours, whole_table = journal._not_held(insert, True), journal._not_held(insert, False)
        assert in_hours[0].equals(whole_table[0]) and in_hours[1] == whole_table[1]
        assert in_hours[0].num_rows == insert.data.num_rows - held.num_rows
        store.command("TRUNCATE TABLE dispatches")


def test_a_pending_flush_is_looked_for_in_the_hours_of_its_rows_only(store, monkeypatch):
    """Written again into a table of 200,000 rows over 25 days and 100,000 more in the hours
    before its own that day, a pending flush of a minute has the store read a granule or two
    for its lookup of the rows held (as ``EXPLAIN ESTIMATE`` counts them): not the whole table,
    nor the whole day. (Before 7 Dec it read every row: 5.4-6.6 s a pending flush on 20
    million, ``benchmarks.flush_replay``.)"""
    now_s = MIDNIGHT_MS // 1000 + 12 * 3600  # (noon: the morning's rows are of the same day)
    fill(store, 200_000, now_s)
    store.command(f"""
INSERT INTO dispatches (kafka_topic, kafka_partition, kafka_offset, time, type, request_id)
SELECT 'morning', 0, 1000000 + number,
       toDateTime64({MIDNIGHT_MS // 1000} + intDiv(number * 39600, 100000), 3, 'UTC'),
       'dispatch', concat('m-', toString(number))
FROM numbers(100000)""")  # (00:00 to 11:00)
    batch = Batch()
    for partition in range(8):
        first = 200_000 // 8
        batch.add_partition("bench.dispatch", partition, first, first + 99, {
            "dispatches": _dispatches("bench.dispatch", partition, range(first, first + 100),
                                      lambda offset: now_s * 1000 - 60_000 + offset % 60_000)})
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    Journal(store, "run-a").begin(flush)
    [insert] = batch.inserts(flush.token)
    store.insert("dispatches", insert.data.slice(0, 400), token=insert.token)  # cut: half held
    lookups, query = [], store.query

    def noting_lookups(sql, parameters=None, settings=None):
        if "arrayExists" in sql:
            lookups.append((sql, parameters))
        return query(sql, parameters, settings)

    monkeypatch.setattr(store, "query", noting_lookups)
    journal = Journal(store, "run-b")
    [pending] = journal.state().pending
    journal.commit(1, batch, list(pending.ranges), run=pending.run)
    assert store.query("SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM dispatches "
                       "WHERE kafka_offset >= 25000 AND kafka_offset < 25100").rows == [[800, 800]]
    [(sql, parameters)] = lookups
    [[_, table, parts, rows, _]] = query(f"EXPLAIN ESTIMATE {sql}", parameters).rows
    assert table == "dispatches" and rows <= 40_000, (parts, rows)


def _dead_letter(offset: int, timestamp_ms: int) -> tuple[str, tuple]:
    """An undecodable record of the (compacted) config topic: a dead letter at its time."""
    return record_row(TopicCatalog("ns").spec("ns.config"), "ns.config", 0, offset, timestamp_ms,
                      b"setting", b"\xff not json")


def test_a_row_held_of_a_record_compacted_away_since_makes_the_token_the_rests(store):
    """The flush's insert was cut with the part of one record committed, in a day of its own;
    compaction has removed that record since, so the batch read again lacks it. Its hour
    unknown, the lookup reads the whole table, finds it, and inserts the rest under a token of
    its own: under the insert's, its one part took the committed part's block id and was
    dropped (a lookup in the batch's hours found nothing held)."""
    original = Batch()
    for offset in range(5):
        original.add(*_dead_letter(offset, MIDNIGHT_MS - (DAY := 24 * HOUR_MS) + (
            0 if offset == 2 else DAY + offset)))
    flush = Flush("run-a", 1, tuple(original.ranges()))
    Journal(store, "run-a").begin(flush)
    [insert] = original.inserts(flush.token)
    store.insert("dead_letters", insert.data.slice(2, 1), token=insert.token)  # its first part
    compacted = Batch()
    for offset in (0, 1, 3, 4):
        compacted.add(*_dead_letter(offset, MIDNIGHT_MS + offset))
    assert original.gapless() and not compacted.gapless()
    journal = Journal(store, "run-b")
    [pending] = journal.state().pending
    journal.commit(1, compacted, list(pending.ranges), run=pending.run)
    assert _held(store, "dead_letters") == [["ns.config", 0, offset, 1] for offset in range(5)]
