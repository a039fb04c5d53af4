"""The store side of exactly-once: a flush written twice, or half then whole, lands once; two
sink runs' flushes of the same id both land."""

import time

import pytest

from analytics.batch import Batch, OffsetRange
from analytics.journal import Flush, Journal
from analytics.rows import message_row, record_row
from analytics.store import StoreError
from schemas.events import Queued, WorkerStatus
from schemas.examples import examples
from schemas.requests import ResponseChunk
from schemas.topics import TopicCatalog

NOW = int(time.time() * 1000)


def _batch(first_offset: int = 0, n: int = 10) -> Batch:
    """n records on each of three partitions: lifecycle events, heartbeats, chunks."""
    batch = Batch()
    for i in range(first_offset, first_offset + n):
        for topic, partition, model in (("ns.telemetry", 0, Queued),
                                        ("ns.telemetry", 1, WorkerStatus),
                                        ("ns.responses", 0, ResponseChunk)):
            message = examples()[model].model_copy(update={"event_time_ms": NOW + i})
            if model is Queued:
                message = message.model_copy(update={"request_id": f"r-{i}"})
            table, columns = message_row(message, topic.split(".")[1])
            batch.add(table, (topic, partition, i, message.event_time_ms, *columns))
    return batch


def _counts(store) -> dict[str, int]:
    sql = """SELECT
        (SELECT count() FROM request_events), (SELECT count() FROM worker_status),
        (SELECT count() FROM response_chunks), (SELECT sum(events) FROM request_minute),
        (SELECT sum(heartbeats) FROM worker_minute), (SELECT sum(chunks) FROM response_summaries),
        (SELECT count() FROM request_outcomes FINAL WHERE bitAnd(events, 2) != 0)"""
    names = ["events", "status", "chunks", "minute_events", "heartbeats", "summary_chunks",
             "queued"]
    return dict(zip(names, store.query(sql).rows[0], strict=True))


EXACT = {"events": 10, "status": 10, "chunks": 10, "minute_events": 10, "heartbeats": 10,
         "summary_chunks": 10, "queued": 10}


def test_a_committed_flush_moves_the_marks_and_leaves_nothing_pending(store):
    journal = Journal(store)
    assert journal.state().next_flush_id == 1 and journal.state().pending == ()
    assert journal.commit(1, _batch()) == 30
    state = journal.state()
    assert (state.pending, state.next_flush_id) == ((), 2)
    assert journal.marks(["ns.telemetry", "ns.responses"]) == {
        ("ns.telemetry", 0): 10, ("ns.telemetry", 1): 10, ("ns.responses", 0): 10}
    assert journal.marks(["ns.kv"]) == {}
    assert _counts(store) == EXACT


def test_a_flush_interrupted_after_its_inserts_is_pending_and_writing_it_again_adds_nothing(store):
    batch = _batch()
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    crashed = Journal(store, "run-a")
    crashed.begin(flush)
    crashed.write(flush, batch)  # ... and the sink dies before the marks
    journal = Journal(store, "run-b")  # the sink started again: a run of its own
    state = journal.state()
    assert state.pending == (flush,) and state.next_flush_id == 2
    assert journal.marks(["ns.telemetry"]) == {}
    journal.commit(1, _batch(), list(flush.ranges), run="run-a")  # with run-a's tokens
    assert _counts(store) == EXACT  # raw tables and every rollup: each record once
    assert journal.state().pending == ()


def test_a_flush_that_failed_half_way_is_completed_by_its_retry(store):
    journal = Journal(store, "run-a")
    batch = _batch()
    journal.begin(Flush("run-a", 1, tuple(batch.ranges())))
    first = batch.inserts("run-a:1")[0]  # one table made it before the store went away
    store.insert(first.table, first.data, token=first.token)
    journal.commit(1, batch)
    assert _counts(store) == EXACT


def test_later_flushes_add_and_the_marks_only_move_forward(store):
    journal = Journal(store)
    journal.commit(1, _batch(0, 10))
    journal.commit(2, _batch(10, 5))
    assert _counts(store)["events"] == 15 and _counts(store)["minute_events"] == 15
    assert journal.marks(["ns.telemetry"])[("ns.telemetry", 0)] == 15
    journal.mark(Flush("", 1, (OffsetRange("ns.telemetry", 0, 0, 9),)))  # stale: no step back
    assert journal.marks(["ns.telemetry"])[("ns.telemetry", 0)] == 15


def test_two_runs_flushes_of_one_id_both_land(store):
    """Two sinks on one store take the same next flush id; their runs keep the tokens apart."""
    a, b = Journal(store, "run-a"), Journal(store, "run-b")
    assert a.state().next_flush_id == b.state().next_flush_id == 1
    a.commit(1, _batch(0, 10))
    b.commit(1, _batch(10, 10))
    assert _counts(store) == {name: 20 for name in EXACT}
    assert a.state() == b.state() and a.state().pending == ()


def test_a_legacy_flush_a_crash_left_unfinished_is_pending_after_version_7(location, monkeypatch):
    import analytics.migrations as migrations
    from analytics.store import Store

    batch = _batch()
    with monkeypatch.context() as patched:  # a store as version 6 left it, mid-flush 2
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:6])
        old = Store.open(location)
        old.insert_rows("sink_flushes", [[1, "[]"]], ["flush_id", "ranges"])
        old.insert_rows("sink_offsets", [["ns.kv", 0, 5, 1]],
                        ["kafka_topic", "kafka_partition", "next_offset", "flush_id"])
        old.insert_rows("sink_flushes", [[2, '[["ns.telemetry",0,0,9]]']], ["flush_id", "ranges"])
        first = batch.inserts(2)[0]  # version 6's token
        old.insert(first.table, first.data, token=first.token)
        old.close()
    store = Store.open(location)  # version 7 is applied
    try:
        journal = Journal(store, "run-new")
        state = journal.state()
        assert state.pending == (Flush("", 2, (OffsetRange("ns.telemetry", 0, 0, 9),)),)
        assert state.next_flush_id == 3
        journal.commit(2, batch, run="")  # with version 6's tokens: the first table is not added
        assert _counts(store) == EXACT and journal.state().pending == ()
    finally:
        store.close()


def test_marks_past_their_partitions_end_are_forgotten_and_the_others_kept(store):
    """A log that began again (topic created again, broker data lost) ends below the store's
    mark: that mark goes, so its records are read from the beginning; a mark at or below its
    end, or of a partition not asked about, stays."""
    journal = Journal(store)
    journal.commit(1, _batch(0, 10))  # marks of 10 on ns.telemetry 0 and 1, ns.responses 0
    ends = {("ns.telemetry", 0): 3, ("ns.telemetry", 1): 10, ("ns.kv", 0): 0}
    assert journal.forget_past(ends) == {("ns.telemetry", 0): 10}
    assert journal.marks(["ns.telemetry", "ns.responses"]) == {
        ("ns.telemetry", 1): 10, ("ns.responses", 0): 10}
    assert journal.forget_past(ends) == {}
    journal.commit(2, _batch(0, 3))  # the new log's records: stored, and marked again
    assert journal.marks(["ns.telemetry"])[("ns.telemetry", 0)] == 3


def test_an_unfinished_flush_is_pending_however_old_and_finished_ones_expire(store):
    """A sink started again more than a month after a flush it did not finish still writes it
    again. (Before 7 Dec ``sink_flushes`` expired every row after 30 days, unfinished ones too:
    that sink read the flush's records from the marks below them and stored them with new
    tokens, so that the rollups counted twice what its data inserts had stored.)"""
    journal = Journal(store, "run-b")
    ranges = '[["ns.telemetry",0,0,9]]'
    month_and_more = NOW - 31 * 86_400_000
    columns = ["flush_id", "run", "ranges", "finished", "time"]
    store.insert_rows("sink_flushes", [[1, "run-a", ranges, 0, month_and_more]], columns)
    store.insert_rows("sink_flushes", [[2, "run-a", ranges, 0, month_and_more],
                                       [2, "run-a", ranges, 1, month_and_more]], columns)
    store.command("OPTIMIZE TABLE sink_flushes FINAL")  # (merges apply the TTL)
    unfinished = Flush("run-a", 1, (OffsetRange("ns.telemetry", 0, 0, 9),))
    assert journal.state().pending == (unfinished,)
    left = store.query("SELECT flush_id, finished FROM sink_flushes ORDER BY flush_id").rows
    assert left == [[1, 0]]  # the finished flush expired


def _refusing(store, table: str) -> None:
    """A view of the test's on ``table`` that refuses every block: an insert into it fails
    after the raw part, as a sink killed mid-insert leaves it."""
    store.command(f"CREATE TABLE refused_{table} (n UInt8) ENGINE = MergeTree ORDER BY n")
    store.command(f"CREATE MATERIALIZED VIEW refusing_{table} TO refused_{table} AS "
                  f"SELECT throwIf(kafka_offset >= 0) AS n FROM {table}")


def test_an_insert_cut_between_its_raw_part_and_a_rollups_is_completed_by_writing_it_again(
        store):
    """An insert commits the raw table's part and each view's part one after another: a sink
    that dies between them (here a view of the test's refuses the block) leaves the raw table
    holding the flush's rows and a rollup without them. Written again whole with the same
    token, the raw table and the views that hold their part drop it, the others add theirs. (A
    journal that gave each table only the rows whose coordinates it did not hold, 7 Dec, wrote
    nothing to this table again: its rollups lost the flush's rows, as a sink killed mid-insert
    left them in 2 runs of 3 of ``test_a_sink_killed_and_restarted_mid_run_...``.)"""
    batch = _batch()
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    crashed = Journal(store, "run-a")
    crashed.begin(flush)
    _refusing(store, "request_events")
    with pytest.raises(StoreError):
        crashed.write(flush, batch)
    store.command("DROP VIEW refusing_request_events")
    cut = _counts(store)
    assert cut["events"] == 10  # the raw part landed ...
    # ... and a rollup's did not (which, the order the store runs the views in decides)
    assert 0 in (cut["minute_events"], cut["queued"]), cut
    Journal(store, "run-b").commit(1, _batch(), list(flush.ranges), run="run-a")
    assert _counts(store) == EXACT


def _window_of_ten(store, *tables: str) -> None:
    """The store keeps 10 tokens of each of ``tables``, not 1,000 (11 inserts pass it)."""
    for table in tables:
        store.command(f"ALTER TABLE {table} "
                      "MODIFY SETTING non_replicated_deduplication_window = 10")


def _queued(topic: str, offset: int, request_id: str) -> Batch:
    batch = Batch()
    message = examples()[Queued].model_copy(update={"event_time_ms": NOW,
                                                    "request_id": request_id})
    table, columns = message_row(message, "telemetry")
    batch.add(table, (topic, 0, offset, NOW, *columns))
    return batch


def _other_sinks_write(store, inserts: int, batch_of) -> None:
    for offset in range(inserts):
        for insert in batch_of(offset).inserts(f"other-run:{offset}"):
            store.insert(insert.table, insert.data, token=insert.token)


def test_a_pending_flush_written_again_past_the_token_window_adds_nothing_to_tables_written(
        store):
    """The store keeps the last 1,000 insert tokens of a table: a flush written again after
    more inserts than that (the other sinks of the store writing on while this one was down)
    is not dropped by its tokens. Its tables whose inserts had returned are not written again;
    the one the crash cut is completed with its token. Before 7 Dec it was inserted again whole,
    and the rollups counted the first table's records twice."""
    batch = _batch()  # request_events, response_chunks, worker_status: in that order
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    crashed = Journal(store, "run-a")
    crashed.begin(flush)
    _refusing(store, "response_chunks")
    with pytest.raises(StoreError):
        crashed.write(flush, batch)  # request_events written, response_chunks cut: the crash
    store.command("DROP VIEW refusing_response_chunks")
    _window_of_ten(store, "request_events", "request_minute", "request_outcomes")
    _other_sinks_write(store, 11, lambda offset: _queued("other.telemetry", offset, f"o-{offset}"))
    journal = Journal(store, "run-b")
    [pending] = journal.state().pending
    assert pending.written == ("request_events",)
    journal.commit(1, _batch(), list(pending.ranges), run=pending.run, written=pending.written)
    assert _counts(store) == {**EXACT, "events": 21, "minute_events": 21, "queued": 21}
    assert journal.state().pending == ()


def _undecodable(offset: int, timestamp_ms: int = -1, namespace: str = "ns") -> Batch:
    """A record the sink cannot decode: a dead letter (at the sink's clock if ``timestamp_ms``
    is out of range)."""
    batch, topic = Batch(), f"{namespace}.telemetry"
    batch.add(*record_row(TopicCatalog(namespace).spec(topic), topic, 0, offset, timestamp_ms,
                          b"k", b"\xff not json"))
    return batch


DAY_MS = 86_400_000


def _next_month_ms() -> int:
    """The start of next month (UTC), in ms: times around it are never past the dead letters'
    30-day TTL (dates of a fixed month would be, some day, and the store drops their rows)."""
    import datetime as dt

    today = dt.datetime.now(dt.UTC)
    start = dt.datetime(today.year + today.month // 12, today.month % 12 + 1, 1, tzinfo=dt.UTC)
    return int(start.timestamp() * 1000)


def test_a_dead_letter_stamped_by_the_clock_written_again_next_month_is_not_added(
        store, monkeypatch):
    """A dead letter stamped out of range takes the sink's clock (``dead_letter_row``): written
    again in the next month it falls in another partition, where its token does not drop it.
    Before 7 Dec the store then held two rows of the one record."""
    import analytics.rows

    def clock_at(at: int) -> None:
        monkeypatch.setattr(analytics.rows, "wall_clock_ms", lambda: at)

    clock_at(_next_month_ms() - 1000)
    batch = _undecodable(7)
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    crashed = Journal(store, "run-a")
    crashed.begin(flush)
    crashed.write(flush, batch)  # ... and the sink dies before the marks
    clock_at(_next_month_ms() + 1000)  # the sink started again the next month
    [pending] = Journal(store, "run-b").state().pending
    Journal(store, "run-b").commit(1, _undecodable(7), list(pending.ranges), run=pending.run,
                                   written=pending.written)
    assert store.query("SELECT count() FROM dead_letters").rows == [[1]]


def test_a_table_without_views_holding_part_of_a_flush_gets_the_rest_once(store):
    """An insert across two partitions commits one part per partition: cut between them, the
    table holds part of the flush's rows. Written again past the token window, the table gets
    the rest only, under a token of their own (a token of the insert's might be dropped as a
    block already committed). Before 7 Dec the part it held was inserted a second time."""
    this_month, next_month = _next_month_ms() - 5 * DAY_MS, _next_month_ms() + 23 * DAY_MS
    batch = _undecodable(7, this_month)
    batch.add(*record_row(TopicCatalog("ns").spec("ns.telemetry"), "ns.telemetry", 0, 8,
                          next_month, b"k", b"\xff not json"))
    flush = Flush("run-a", 1, tuple(batch.ranges()))
    Journal(store, "run-a").begin(flush)
    [insert] = batch.inserts(flush.token)
    store.insert("dead_letters", insert.data.slice(0, 1), token=insert.token)  # this month's part
    _window_of_ten(store, "dead_letters")
    _other_sinks_write(store, 11, lambda offset: _undecodable(offset, this_month, "other"))
    [pending] = Journal(store, "run-b").state().pending
    Journal(store, "run-b").commit(1, batch, list(pending.ranges), run=pending.run)
    rows = store.query("SELECT kafka_offset, count() FROM dead_letters "
                       "WHERE kafka_topic = 'ns.telemetry' GROUP BY kafka_offset "
                       "ORDER BY kafka_offset").rows
    assert rows == [[7, 1], [8, 1]]
