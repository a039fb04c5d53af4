"""The store side of exactly-once: a flush written twice, or half then whole, lands once."""

import time

from analytics.batch import Batch, OffsetRange
from analytics.journal import Journal
from analytics.rows import message_row
from schemas.events import Queued, WorkerStatus
from schemas.examples import examples
from schemas.requests import ResponseChunk

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
    assert journal.state().next_flush_id == 1 and journal.state().pending_id is None
    assert journal.commit(1, _batch()) == 30
    state = journal.state()
    assert (state.pending_id, state.next_flush_id) == (None, 2)
    assert journal.marks(["ns.telemetry", "ns.responses"]) == {
        ("ns.telemetry", 0): 10, ("ns.telemetry", 1): 10, ("ns.responses", 0): 10}
    assert journal.marks(["ns.kv"]) == {}
    assert _counts(store) == EXACT


def test_a_flush_interrupted_after_its_inserts_is_pending_and_writing_it_again_adds_nothing(store):
    journal = Journal(store)
    batch = _batch()
    journal.begin(1, batch.ranges())
    journal.write(1, batch)  # ... and the sink dies before the marks
    state = journal.state()
    assert state.pending_id == 1 and list(state.pending_ranges) == batch.ranges()
    assert journal.marks(["ns.telemetry"]) == {}
    journal.commit(1, _batch(), list(state.pending_ranges))  # the restarted sink's second try
    assert _counts(store) == EXACT  # raw tables and every rollup: each record once
    assert journal.state().pending_id is None


def test_a_flush_that_failed_half_way_is_completed_by_its_retry(store):
    journal = Journal(store)
    batch = _batch()
    journal.begin(1, batch.ranges())
    first = batch.inserts(1)[0]  # one table made it before the store went away
    store.insert(first.table, first.data, token=first.token)
    journal.commit(1, batch)
    assert _counts(store) == EXACT


def test_later_flushes_add_and_the_marks_only_move_forward(store):
    journal = Journal(store)
    journal.commit(1, _batch(0, 10))
    journal.commit(2, _batch(10, 5))
    assert _counts(store)["events"] == 15 and _counts(store)["minute_events"] == 15
    assert journal.marks(["ns.telemetry"])[("ns.telemetry", 0)] == 15
    journal.finish(1, [OffsetRange("ns.telemetry", 0, 0, 9)])  # a stale writer: no step back
    assert journal.marks(["ns.telemetry"])[("ns.telemetry", 0)] == 15
