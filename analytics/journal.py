"""The store side of the sink's exactly-once protocol: a journal of flushes and offset marks.

A flush writes one batch of records in four steps:

1. intent: ``sink_flushes`` gets the flush (its id and the sink run's, ``run``) and the batch's
   offset ranges, unfinished;
2. data: one insert per table, each with the dedup token ``<run>:<flush_id>:<table>``; as the
   insert into a table with materialized views returns, the flush's row is written again with
   that table among those ``written`` (schema version 18);
3. marks: ``sink_offsets`` gets the next offset to read of every partition in the batch, in a
   single insert (so all of them or none), tagged with the flush id;
4. done: the flush's ``sink_flushes`` row again, finished (the table keeps a key's last row).

Only then does the sink commit the Kafka offsets. If it dies before 4, ``state()`` reports the
flush as pending; the sink next given its partitions reads exactly its ranges again and repeats
steps 2 to 4 (``Journal.write``): a table ``written`` gets nothing; another table with views gets
the whole insert again with the same token, so the store drops the parts it already has (the
raw table's, a view's) and adds the ones it missed; a table without views gets only the rows
whose Kafka coordinates it does not hold (looked for in their hours: ``Journal._not_held``). A
failed insert is retried the same way. The marks are where the sink resumes: Kafka's committed
offsets are kept in step for lag tools, but the store's own record of what it holds decides.

Why not the tokens alone: the store keeps the last 1,000 tokens of a table
(``non_replicated_deduplication_window``), and a flush written again after more inserts than
that into its tables (the other sinks of the store writing on meanwhile) was inserted again whole
(before 7 Dec), the rollups counting its records twice; so was a dead letter stamped with the
sink's clock, written again in another month (``analytics.rows.dead_letter_row``: another
partition, whose block the token does not drop). Why not the coordinates alone for every table
(tried on 7 Dec, and reverted): one insert commits the raw table's part and each view's part
one after another, so a sink killed between them leaves the raw table holding rows a rollup
lacks; given none of them again, the rollup lost them. Only the whole insert with its token
gives that view its part. What stays the tokens' alone: the one table with views whose insert
a crash cut (or that returned just before it, its row not yet written again); written again
after more than 1,000 later blocks inserted into it or its views' tables (an insert is a block
per day, or month, that its rows fall in), its records are counted twice.

How many come between (``analytics/sink.py``): the flush is written again by the sink next
given its partitions, as it positions them and before any flush of its own starts
(``tests/unit/analytics/test_sink_replay_first.py``). So a store with one sink
(``governor up``'s) gets no insert between the crash and the replay, however long the sink
stays down. With several sinks in the group, the others write on: until the group drops the
crashed sink (its 6 s session timeout; at once for one that left), through the rebalance (each
lets its flush in flight land), and after it, each as soon as its own partitions are
positioned: none waits for the sink given the crashed one's partitions to read the flush's
records from Kafka (retried for as long as the broker fails to give them) and write it. A sink
flushes at most about twice a second (``max_batch_age_s``, 0.5 s, on a live stream; fewer,
larger flushes in a backlog), one insert into the table each; so with k other sinks writing
it, the window is passed once the replay comes more than about 500/k seconds after the crash
(two minutes with four): never in the seconds a rebalance takes, but it can be when that read
fails for minutes while the other sinks' partitions are read, and the records are then counted
twice. A migration that rebuilds such a table between the crash and the replay (an upgrade
started on it; ``m004``'s exchange did) loses its tokens too.

Several sinks may write one store (the sink's consumer group splits the partitions): each run
has its own ``run`` id, so two runs' flushes never share a token, and a sink given partitions
writes their pending flushes, whichever run began them (the tokens make that safe even for one
still in flight). Flush ids count up across runs; two runs may take the same id, never the same
token.

Why tokens rather than only a ReplacingMergeTree: the materialized views (per-minute rollups) see
every inserted block, including a duplicate one; a token stops the duplicate before the views.
The base tables are ReplacingMergeTree on the Kafka coordinates as well, for what the journal
cannot see (two sinks briefly owning one partition during a rebalance, a re-ingest).
"""

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from analytics.batch import Batch, Insert, OffsetRange
from analytics.rows import clock_stamped
from analytics.store import Store

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Flush:
    """A flush as the journal names it: the sink run that began it, its id and its ranges."""

    run: str
    flush_id: int
    ranges: tuple[OffsetRange, ...]
    #: The tables with views whose inserts of it returned, as its journal row last said: a
    #: flush written again inserts nothing more into them (``Journal.write``).
    written: tuple[str, ...] = field(default=(), compare=False)
    #: Whether it was begun before (a pending flush): its tables without views are then given
    #: only the rows they do not hold.
    again: bool = field(default=False, compare=False)

    @property
    def token(self) -> str:
        """The prefix of its inserts' dedup tokens (runs before schema version 7 had no id)."""
        return f"{self.run}:{self.flush_id}" if self.run else str(self.flush_id)


@dataclass(frozen=True)
class JournalState:
    """Where a starting sink stands: the flushes begun and not finished, and the next flush id."""

    pending: tuple[Flush, ...]
    next_flush_id: int


def new_run() -> str:
    """An id for one run of a sink."""
    return uuid.uuid4().hex[:16]


class Journal:
    def __init__(self, store: Store, run: str = "") -> None:
        self.store = store
        self.run = run
        self._views: frozenset[str] | None = None
        #: The tables written of each flush of this journal's not finished yet, by (run, id): a
        #: retry after a failure goes on from them.
        self._written: dict[tuple[str, int], tuple[str, ...]] = {}

    def state(self) -> JournalState:
        pending = tuple(
            Flush(run, flush_id, tuple(OffsetRange.from_list(item) for item in json.loads(ranges)),
                  tuple(written), again=True)
            for flush_id, run, ranges, written in self.store.query(
                "SELECT flush_id, run, ranges, written FROM sink_flushes FINAL "
                "WHERE finished = 0 ORDER BY flush_id, run").rows)
        last = self.store.query(
            "SELECT greatest((SELECT max(flush_id) FROM sink_flushes), "
            "(SELECT max(flush_id) FROM sink_offsets))").rows[0][0] or 0
        return JournalState(pending, last + 1)

    def begin(self, flush: Flush) -> None:
        self._record(flush, finished=False)

    def finish(self, flush: Flush) -> None:
        self._record(flush, finished=True)

    def _record(self, flush: Flush, finished: bool) -> None:
        text = json.dumps([r.as_list() for r in flush.ranges], separators=(",", ":"))
        self.store.insert_rows("sink_flushes", [[flush.flush_id, flush.run, text, int(finished),
                                                 list(flush.written)]],
                               ["flush_id", "run", "ranges", "finished", "written"])

    def write(self, flush: Flush, batch: Batch) -> int:
        """Insert the batch's rows, table by table (step 2 of the module's docstring); return the
        rows handed, those of tables written before included.

        A table with views is recorded ``written`` once its insert returns (its views' parts
        are committed then), and a flush written again inserts nothing more into it; one not
        recorded gets the whole insert again with its token, never a part of it (see the
        module's docstring). A table without views, in a flush written again (``Flush.again``),
        gets the rows whose Kafka coordinates it does not hold (``_not_held``): nothing else
        counts them."""
        handed, written = 0, list(flush.written)
        views = self._tables_with_views(again=flush.again)
        whole = flush.again and batch.gapless()
        for insert in batch.inserts(flush.token):
            handed += insert.data.num_rows
            if insert.table in written:
                continue
            data, token = insert.data, insert.token
            if flush.again and insert.table not in views:
                data, token = self._not_held(insert, whole)
            if data.num_rows:
                self.store.insert(insert.table, data, token=token)
            if insert.table in views:
                written.append(insert.table)
                self._written[(flush.run, flush.flush_id)] = tuple(written)
                self._record(replace(flush, written=tuple(written)), finished=False)
        return handed

    def _tables_with_views(self, again: bool = False) -> frozenset[str]:
        """The tables that materialized views read (the rollups'), as the store has them: asked
        once, and again for a flush written again (one given a part of its rows, a view of
        it created since would lose them)."""
        if self._views is None or again:
            self._views = frozenset(row[0] for row in self.store.query(
                "SELECT name FROM system.tables WHERE database = currentDatabase() "
                "AND notEmpty(dependencies_table)").rows)
        return self._views

    def _not_held(self, insert: Insert, whole: bool = False) -> tuple[pa.Table, str]:
        """The rows of ``insert`` whose Kafka coordinates its table does not hold, and the token
        to insert them with: the insert's own when it holds none of them (a writer of the flush
        still in flight then drops the same part); when it holds some (the insert was cut
        between two partitions' parts, or two blocks of one over a million rows), one of the
        rest's own: under the insert's, a block of the rest takes the token and number of a
        block already committed, and is dropped.

        The rows held are looked for in the hours of the insert's rows only, when ``whole`` (the
        batch misses no record between its partitions' first and last): a record's row has its
        record's time, so it is held in that hour or not at all, and the tables' partitions
        (days or months) and sorting keys (the hour first) let the store read those hours'
        granules and no others. (Before 7 Dec it read the whole table: 5.4-6.6 s a pending
        flush on 20 million rows, ``benchmarks.flush_replay``.) Not when the batch misses
        some (a row held of one, its hour unknown, makes the token the rest's), nor when a
        row's time may not be its record's (``analytics.rows.clock_stamped``): the whole table
        then. (A row of another record at the same coordinates, of a log begun again since, is
        found in the same hour only; the whole table's scan found it in any, and took the
        record for held.)"""
        data = insert.data
        spans = data.group_by(["kafka_topic", "kafka_partition"]).aggregate(
            [("kafka_offset", "min"), ("kafka_offset", "max")]).to_pylist()
        parameters: dict[str, Any] = {"spans": [
            (s["kafka_topic"], s["kafka_partition"], s["kafka_offset_min"], s["kafka_offset_max"])
            for s in spans]}
        in_hours = ""
        if whole and not clock_stamped(insert.table, data):
            # (times are at or after 1970, validated: the division gives the hour's floor)
            hours = pc.unique(pc.divide(pc.cast(data["time"], pa.int64()), 3_600_000))
            parameters["hours"] = pc.multiply(hours, 3600).to_pylist()
            in_hours = "toUnixTimestamp(toStartOfHour(time)) IN {hours:Array(UInt32)} AND "
        held = {tuple(row) for row in self.store.query(
            f"SELECT kafka_topic, kafka_partition, kafka_offset FROM {insert.table} WHERE "
            f"{in_hours}arrayExists(s -> kafka_topic = s.1 AND kafka_partition = s.2 AND "
            "kafka_offset BETWEEN s.3 AND s.4, {spans:Array(Tuple(String, UInt32, UInt64, "
            "UInt64))})", parameters=parameters).rows}
        if not held:
            return data, insert.token
        coordinates = list(zip(data["kafka_topic"].to_pylist(),
                               data["kafka_partition"].to_pylist(),
                               data["kafka_offset"].to_pylist()))
        rest = [key for key in coordinates if key not in held]
        digest = hashlib.sha256(json.dumps(rest).encode()).hexdigest()[:16]
        return (data.filter(pa.array([key not in held for key in coordinates])),
                f"{insert.token}:rest-{digest}")

    def mark(self, flush: Flush) -> None:
        rows = [[r.topic, r.partition, r.last + 1, flush.flush_id] for r in flush.ranges]
        if rows:  # (none when every record of a pending flush was written by a later one)
            self.store.insert_rows("sink_offsets", rows, ["kafka_topic", "kafka_partition",
                                                          "next_offset", "flush_id"])

    def commit(self, flush_id: int, batch: Batch, ranges: list[OffsetRange] | None = None,
               run: str | None = None, written: tuple[str, ...] = ()) -> int:
        """Steps 1 to 4 for one batch; safe to call again with the same id after a failure.

        ``ranges`` overrides the batch's own when a pending flush is written again: records the
        broker no longer has (retention, compaction) leave the batch smaller than the flush was.
        ``run``: the run that began the flush, when it is a pending one (another run's, or one
        this run gave up); ``written``: its tables written, as the journal said
        (``Flush.written``). A retry after a failure goes on from the tables written.
        """
        begun_by = self.run if run is None else run
        done = self._written.get((begun_by, flush_id), ())
        flush = Flush(begun_by, flush_id, tuple(batch.ranges() if ranges is None else ranges),
                      tuple(dict.fromkeys((*written, *done))), again=run is not None)
        self.begin(flush)
        handed = self.write(flush, batch)
        self.mark(flush)
        self.finish(flush)
        self._written.pop((begun_by, flush_id), None)
        return handed

    def marks(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """The next offset to read of every partition of ``topics`` the store holds records of."""
        rows = self.store.query(
            "SELECT kafka_topic, kafka_partition, max(next_offset) FROM sink_offsets "
            "WHERE kafka_topic IN {topics:Array(String)} GROUP BY kafka_topic, kafka_partition",
            parameters={"topics": topics}).rows
        return {(topic, partition): offset for topic, partition, offset in rows}

    def forget_past(self, ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Forget the marks that are past their partition's end offset in ``ends`` and return
        them: that log began again (its topic deleted and created again, the broker's data
        lost), and its records are to be read from its beginning. (Kept, such a mark made the
        sink skip every new record below it.)"""
        past = {key: mark for key, mark in self.marks(sorted({t for t, _ in ends})).items()
                if key in ends and mark > ends[key]}
        if past:
            self.store.command(
                "DELETE FROM sink_offsets WHERE (kafka_topic, kafka_partition) "
                "IN {partitions:Array(Tuple(String, UInt32))}", parameters={"partitions": list(past)})
        return past
