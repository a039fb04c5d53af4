"""The store side of the sink's exactly-once protocol: a journal of flushes and offset marks.

A flush writes one batch of records in three steps:

1. intent: ``sink_flushes`` gets the flush id and the batch's offset ranges;
2. data: one insert per table, each with the dedup token ``<flush_id>:<table>``;
3. done: ``sink_offsets`` gets the next offset to read of every partition in the batch, in a single
   insert (so all of them or none), tagged with the flush id.

Only then does the sink commit the Kafka offsets. If it dies between 1 and 3, ``state()`` reports
the flush as pending; the sink reads exactly its ranges again and repeats steps 2 and 3 with the
same tokens, so the store drops the inserts it already has and adds the ones it missed. A failed
insert is retried the same way. The marks are where the sink resumes: Kafka's committed offsets
are kept in step for lag tools, but the store's own record of what it holds decides.

Why tokens rather than only a ReplacingMergeTree: the materialized views (per-minute rollups) see
every inserted block, including a duplicate one; a token stops the duplicate before the views.
The base tables are ReplacingMergeTree on the Kafka coordinates as well, for what the journal
cannot see (two sinks briefly owning one partition during a rebalance, a re-ingest).
"""

import json
import logging
from dataclasses import dataclass

from analytics.batch import Batch, OffsetRange
from analytics.store import Store

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JournalState:
    """Where a starting sink stands: an unfinished flush (if any) and the next flush id."""

    pending_id: int | None
    pending_ranges: tuple[OffsetRange, ...]
    next_flush_id: int


class Journal:
    def __init__(self, store: Store) -> None:
        self.store = store

    def state(self) -> JournalState:
        last = self.store.query(
            "SELECT flush_id, ranges FROM sink_flushes FINAL ORDER BY flush_id DESC LIMIT 1").rows
        done = self.store.query("SELECT max(flush_id) FROM sink_offsets").rows[0][0] or 0
        if not last or last[0][0] <= done:
            return JournalState(None, (), done + 1)
        flush_id, ranges = last[0]
        parsed = tuple(OffsetRange.from_list(item) for item in json.loads(ranges))
        return JournalState(flush_id, parsed, flush_id + 1)

    def begin(self, flush_id: int, ranges: list[OffsetRange]) -> None:
        text = json.dumps([r.as_list() for r in ranges], separators=(",", ":"))
        self.store.insert_rows("sink_flushes", [[flush_id, text]], ["flush_id", "ranges"])

    def write(self, flush_id: int, batch: Batch) -> int:
        """Insert the batch's rows, table by table; return the rows written."""
        written = 0
        for insert in batch.inserts(flush_id):
            self.store.insert(insert.table, insert.data, token=insert.token)
            written += insert.data.num_rows
        return written

    def finish(self, flush_id: int, ranges: list[OffsetRange]) -> None:
        rows = [[r.topic, r.partition, r.last + 1, flush_id] for r in ranges]
        self.store.insert_rows("sink_offsets", rows,
                                 ["kafka_topic", "kafka_partition", "next_offset", "flush_id"])

    def commit(self, flush_id: int, batch: Batch, ranges: list[OffsetRange] | None = None) -> int:
        """Steps 1 to 3 for one batch; safe to call again with the same id after a failure.

        ``ranges`` overrides the batch's own when a pending flush is written again: records the
        broker no longer has (retention, compaction) leave the batch smaller than the flush was.
        """
        ranges = batch.ranges() if ranges is None else ranges
        self.begin(flush_id, ranges)
        written = self.write(flush_id, batch)
        self.finish(flush_id, ranges)
        return written

    def marks(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """The next offset to read of every partition of ``topics`` the store holds records of."""
        rows = self.store.query(
            "SELECT kafka_topic, kafka_partition, max(next_offset) FROM sink_offsets "
            "WHERE kafka_topic IN {topics:Array(String)} GROUP BY kafka_topic, kafka_partition",
            parameters={"topics": topics}).rows
        return {(topic, partition): offset for topic, partition, offset in rows}
