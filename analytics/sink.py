"""The analytics sink: every topic of a namespace into the analytics store, each record once.

It reads all topics in its store's consumer group (``analytics_group``), maps each record to one
row (``analytics/rows.py``), and writes batches (Arrow, one insert per table) through the journal
protocol of ``analytics/journal.py``: a batch is in the store exactly once, or not yet. Kafka
offsets are committed only after the store has the batch. One batch is written while the next is
read, and reading pauses while a full batch waits, so memory stays bounded.

While the store is unavailable the sink backs off (0.2 s doubling to 5 s), commits nothing and
loses nothing: the batch waits in memory, and if the sink dies meanwhile the records are read
again; stopped meanwhile, it starts no later flush (the failed one stays pending). On every
partition assignment it first writes again (same dedup tokens) the flushes of those partitions that
other runs began and did not finish (its own previous run, or a sink of its group, that crashed),
then seeks to the store's own offset marks (the beginning where the store has none, or a mark past
the partition's end: its topic was created again, or the broker's data lost), so a new data
directory fills with all the history the topics still retain. The
partitions stay paused until then: a failed read of those flushes' records from Kafka (a broker
restarting) is retried like the store's writes, never skipped. Several sinks can share a
store: each run names its flushes (its ``run``), a sink giving partitions up in a rebalance
finishes its flush in flight and starts none until it is given its new ones, and a sink makes
sure before each flush that the group still counts it a member (``_owns``).
"""

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from analytics.batch import Batch, OffsetRange
from analytics.journal import Flush, Journal, new_run
from analytics.ranges import existing_partitions, read_ranges
from analytics.rows import TopicRows
from analytics.store import Store, StoreError, StoreLocation, StoreNotOpened
from infra.bus import GROUP_METADATA_MS
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: How long a sink the group refused a commit waits before it asks again.
_NOT_OWNER_BACKOFF_S = 0.2
#: What ``AnalyticsSink._retry`` returns when its ``before_retry`` check said to give up.
_GIVEN_UP: Any = object()


def analytics_group(namespace: str, location: StoreLocation) -> str:
    """The consumer group of the sinks of one store: ``<namespace>.analytics.<digest>``, the
    digest of where the store is (its data directory, resolved; or its server and database,
    whoever logs in). The group splits the partitions among its members, which is right for
    sinks writing one store and wrong for sinks of two: before 6 Dec every sink of a namespace
    joined ``<namespace>.analytics``, and a ``governor sink --data-dir other`` started beside
    ``governor up``'s sink took about half the partitions from it, so each store held about half
    of what was produced while both ran."""
    if location.data_dir is not None:
        where = f"chdb:{location.data_dir.resolve()}"
    else:
        # (as the client reaches it: its default port where none is named, and no path, the
        # database being given apart)
        parts = urlsplit(location.url or "")
        port = parts.port or (8443 if parts.scheme == "https" else 8123)
        where = f"{parts.scheme}://{parts.hostname}:{port}"
    digest = hashlib.sha256(f"{where}|{location.database}".encode()).hexdigest()[:12]
    return f"{namespace}.analytics.{digest}"


def failure_said(what: str, exc: Exception, location: StoreLocation) -> str:
    """A failed attempt as the sink's retry line says it: a store it could not open yet as the
    store it waits for and why (``waiting for ClickHouse at URL (database D): Failed to establish
    a new connection: [Errno 111] Connection refused``); any other as ``WHAT failed: ERROR``.
    (Before 7 Dec: ``opening the store failed: cannot open the analytics store at URL ...:`` and
    the HTTP client's whole message, a new ``query_id`` in each.)"""
    if isinstance(exc, StoreNotOpened):
        return f"waiting for {location.named()}: {exc.cause}"
    return f"{what} failed: {exc}"


@dataclass(frozen=True)
class SinkSettings:
    #: Records a flush takes at most (a backlog is written in flushes of this size; a live stream
    #: flushes at ``max_batch_age_s``). Each flush writes its journal, one insert per table (and
    #: the rollups' views) and its marks, so fewer flushes cost the engine less: on the 2-core
    #: machine 100,000 against 50,000 took the backlog benchmark from about 95,000 to 107,000
    #: rows/s, and 200,000 against 100,000 gained 0-33 % in three pairs (README, analytics). A
    #: flush holds its rows as Arrow, about 160 bytes a record: some 31 MiB at 200,000.
    max_batch_records: int = 200_000
    max_batch_age_s: float = 0.5
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0
    #: Stopped, the sink reads on, for at most this long, until its partitions' positions reach
    #: the end offsets they had at the stop, then writes what it read: what was written before
    #: the stop is stored (a stack's workers' final heartbeats: ``Stack.stop`` stops the sink
    #: once they have exited).
    stop_drain_s: float = 10.0


@dataclass
class SinkStats:
    records: int = 0  # records read from Kafka (a record read again after a rebalance counts twice)
    partitions: int = 0  # partitions assigned to this sink (several sinks split them)
    rows_written: int = 0  # rows handed to the store in completed flushes
    flushes: int = 0
    replayed_rows: int = 0  # rows of a crashed run's unfinished flushes, written again
    store_failures: int = 0
    store_ok: bool = False
    kafka_failures: int = 0  # Kafka reads that positioning assigned partitions retried
    pending_records: int = 0  # records read that the store does not hold yet: batch + in flight
    last_flush_s: float = 0.0  # when the last flush landed, seconds since the epoch (0: none)
    last_error: str = ""


class AnalyticsSink:
    def __init__(self, bootstrap: str, catalog: TopicCatalog, location: StoreLocation,
                 settings: SinkSettings = SinkSettings(), group_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.location = location
        self.settings = settings
        self.group_id = group_id or analytics_group(catalog.namespace, location)
        self.stats = SinkStats()
        self.ready = asyncio.Event()  # the store is open and its journal read
        self._stop = asyncio.Event()
        self._inflight: asyncio.Task | None = None  # the flush whose Kafka commit is to come
        self._last_flush: asyncio.Task | None = None  # the latest flush, in flight or done
        self._inflight_ranges: list[OffsetRange] = []
        self._inflight_records = 0  # the records of the flush in flight
        self._floors: dict[tuple[str, int], int] = {}  # the store holds offsets below these
        #: partitions are moving (from a revocation until the next assignment is positioned):
        #: start no flush, as the batch may hold records of partitions another sink now has
        self._assigning = False
        self._reset = False  # drop the batch being filled: its partitions were sought again
        self._rows: dict[str, TopicRows] = {}
        #: what stopped it, if not its stop event: ``run`` raises it
        self.failed: BaseException | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        store = await self._retry(lambda: Store.open(self.location), "opening the store")
        if store is None:
            return
        self.journal = Journal(store, new_run())
        try:
            state = await self._retry(self.journal.state, "reading the journal")
            if state is None:
                return
            self._next_flush_id = state.next_flush_id
            self.ready.set()
            await self._consume()
        finally:
            store.close()

    async def _write_pending(self, flush: Flush) -> bool:
        """Write again a flush another run began and did not finish (it crashed, or it is
        another sink's flush in flight: the same tokens make that harmless), as far as no later
        flush has written its records since (another sink given its partitions). Reading its
        records from Kafka is retried like the store's writes (a broker restarting, one slow to
        deliver); False if the sink was stopped first."""
        topics = sorted({r.topic for r in flush.ranges})
        marks = await self._retry(lambda: self.journal.marks(topics), "reading the offset marks")
        if marks is None:
            return False
        left = [replace(r, first=max(r.first, marks.get((r.topic, r.partition), 0)))
                for r in flush.ranges if marks.get((r.topic, r.partition), 0) <= r.last]
        logger.warning("writing flush %s again (%d of its %d ranges): its run did not finish it",
                       flush.token, len(left), len(flush.ranges))
        read = await self._read_kafka(lambda: read_ranges(self.bootstrap, self.catalog, left),
                                      f"reading the records of the unfinished flush {flush.token}")
        if read is None:
            return False
        batch, readable = read
        written = await self._retry(
            lambda: self.journal.commit(flush.flush_id, batch, readable, run=flush.run,
                                        written=flush.written),
            f"writing the unfinished flush {flush.token}")
        self.stats.replayed_rows += written or 0
        return written is not None

    async def _consume(self) -> None:
        self._floors = await self._retry(lambda: self.journal.marks(list(self.catalog.topics())),
                                         "reading the offset marks") or {}
        consumer = self._new_consumer()
        await consumer.start()
        consumer.subscribe(list(self.catalog.topics()), listener=_Listener(self, consumer))
        limit, batch, opened, held = self.settings.max_batch_records, Batch(), 0.0, set()
        # every flush so far is in the store: a later one may start. (One that did not land, the
        # sink stopped while the store failed, stays pending; a later flush would move the marks
        # and Kafka's offsets past its records, and a restart would take it for written.)
        landed = True
        ends: dict[TopicPartition, int] | None = None  # the partitions' ends at the stop
        drain_until = 0.0
        try:
            while True:
                if self._stop.is_set():
                    if ends is None:
                        drain_until = time.monotonic() + self.settings.stop_drain_s
                        ends = await self._ends_at_stop(consumer, drain_until)
                    if await self._read_to(consumer, ends, drain_until):
                        break
                backlog = len(batch) >= limit
                if backlog:  # a full batch waits (for the store, or the group): read no more
                    newly = consumer.assignment() - consumer.paused()
                    consumer.pause(*newly)
                    held |= newly
                    if self._inflight is not None:
                        await asyncio.wait({self._inflight}, timeout=1.0)
                    elif self._assigning:  # for the group to settle: no loop without a pause
                        await asyncio.sleep(_NOT_OWNER_BACKOFF_S)
                elif held and not self._assigning:  # (the listener resumes what it positions)
                    consumer.resume(*(held & consumer.assignment()))
                    held = set()
                fetched = await consumer.getmany(timeout_ms=0 if backlog else 100,
                                                 max_records=limit)
                if self._reset:  # partitions were (re)assigned and sought to the store's marks
                    batch, opened, self._reset = Batch(), 0.0, False
                for tp, records in fetched.items():
                    self._add(batch, tp, records)
                if len(batch) and not opened:
                    opened = time.monotonic()
                if self._inflight is not None and self._inflight.done():
                    landed = await self._complete(consumer)
                due = len(batch) >= limit or (
                    len(batch) and time.monotonic() - opened >= self.settings.max_batch_age_s)
                if due and landed and self._inflight is None and not self._assigning:
                    if not await self._owns(consumer, batch):
                        await asyncio.sleep(_NOT_OWNER_BACKOFF_S)  # a rebalance is under way
                    elif not self._assigning and not self._reset:  # (none began meanwhile)
                        self._start_flush(batch, consumer)
                        batch, opened = Batch(), 0.0
                self.stats.pending_records = len(batch) + (
                    self._inflight_records if self._inflight is not None else 0)
            if self._inflight is not None:
                landed = await self._complete(consumer)
            if landed and len(batch) and not self._reset and not self._assigning \
                    and await self._owns(consumer, batch) \
                    and not self._reset and not self._assigning:  # (none began meanwhile)
                self._start_flush(batch, consumer)
                await self._complete(consumer)
        finally:
            if self._inflight is not None:
                await asyncio.wait({self._inflight})
            await consumer.stop()
        if self.failed is not None:
            raise RuntimeError("analytics sink: positioning its assigned partitions failed; "
                               "it stopped rather than store nothing") from self.failed

    async def _ends_at_stop(self, consumer: AIOKafkaConsumer,
                            until: float) -> dict[TopicPartition, int]:
        """The end offsets of the assigned partitions as the sink is stopped (none while its
        partitions move, or when Kafka does not answer by ``until``)."""
        if self._assigning or self._reset or self.failed is not None:
            return {}
        try:
            return await asyncio.wait_for(consumer.end_offsets(list(consumer.assignment())),
                                          max(0.0, until - time.monotonic()))
        except (KafkaError, TimeoutError) as exc:
            logger.warning("analytics sink stopped: the end offsets to read to are unknown "
                           "(%s); it stores what it has read", exc)
            return {}

    async def _read_to(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int],
                       until: float) -> bool:
        """Whether a stopped sink has read its partitions to ``ends`` (or may read no more: its
        partitions move, or ``until`` has passed, said in the log)."""
        if self._assigning or self._reset:
            return True
        assigned = consumer.assignment()
        try:
            for tp, end in ends.items():
                if tp in assigned and await asyncio.wait_for(
                        consumer.position(tp), max(0.0, until - time.monotonic())) < end:
                    break
            else:
                return True
        except (KafkaError, TimeoutError):
            pass
        if time.monotonic() < until:
            return False
        logger.warning("analytics sink stopped before it read its partitions to their ends at "
                       "the stop (within %.0f s): the rest is stored at its next start",
                       self.settings.stop_drain_s)
        return True

    def _new_consumer(self) -> AIOKafkaConsumer:
        """The sink's consumer, in its group (the unit tests give a fake one)."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group_id, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_bytes=32 << 20,
            max_partition_fetch_bytes=4 << 20, session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000, max_poll_interval_ms=600_000,
            # a rebalance waits this long for a member to give its partitions up (its revocation
            # waits for its flush in flight): one that takes longer is dropped from the group
            rebalance_timeout_ms=60_000,
            metadata_max_age_ms=GROUP_METADATA_MS,  # (partitions added: taken on this soon)
        )

    async def _owns(self, consumer: AIOKafkaConsumer, batch: Batch, unsure: bool = False) -> bool:
        """Whether the group still counts this sink a member owning the batch's partitions,
        asked right before a flush: the broker takes an offset commit (of offsets the store
        already has) only from a member of the group's current generation. A sink the group
        dropped (its heartbeats late under load, say) learns it here, before it writes records
        the partitions' new owner writes too. (A rebalance the sink is part of is another
        matter: its revocation sets ``_assigning``, which the caller reads again after this,
        and waits for a flush already started.) ``unsure``: the answer when the commit failed for
        another reason (the broker unreachable, say), which tells nothing either way."""
        offsets = {TopicPartition(r.topic, r.partition): r.first for r in batch.ranges()}
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:  # not the owner (any more)
            logger.info("analytics sink holds a flush: the group refused its commit (%s)", exc)
            return False
        except KafkaError as exc:  # something else: said, and the batch waits all the same
            self.stats.last_error = f"committing before a flush: {exc}"
            logger.warning("analytics sink holds a flush: its commit failed: %s", exc)
            return unsure
        return True

    def _add(self, batch: Batch, tp: TopicPartition, records: list) -> None:
        """Map records to rows; skip those the store or the batch already holds."""
        rows = self._rows.get(tp.topic)
        if rows is None:
            rows = self._rows[tp.topic] = TopicRows(self.catalog.spec(tp.topic))
        self.stats.records += len(records)
        skip_below = max(self._floors.get((tp.topic, tp.partition), 0),
                         batch.last_offset(tp.topic, tp.partition) + 1)
        if records and records[0].offset < skip_below:
            records = [r for r in records if r.offset >= skip_below]
        if records:
            batch.add_partition(tp.topic, tp.partition, records[0].offset, records[-1].offset,
                                rows.tables(records))

    async def _seek_to_marks(self, consumer: AIOKafkaConsumer,
                             assigned: set[TopicPartition]) -> bool:
        """Position ``assigned`` where the store's records end (the beginning where it has none),
        once the unfinished flushes of them are written; False if the sink was stopped first
        (then none is positioned). A mark past its partition's end offset is forgotten, with a
        warning: that log began again, and its records are stored from its beginning."""
        await self.wait_inflight()  # the marks must include the flush in flight
        if not await self._finish_others(assigned):
            return False
        ends = await self._read_kafka(lambda: consumer.end_offsets(list(assigned)),
                                      "reading the end offsets of the assigned partitions")
        if ends is None:
            return False
        ends_of = {(tp.topic, tp.partition): end for tp, end in ends.items()}
        past = await self._retry(lambda: self.journal.forget_past(ends_of),
                                 "forgetting offset marks past their partition's end")
        if past is None:
            return False
        for (topic, partition), mark in sorted(past.items()):
            logger.warning("%s[%d]: the store's offset mark %d is past the partition's end %d (the "
                           "topic was created again, or the broker's data lost): its records are "
                           "stored from its beginning", topic, partition, mark,
                           ends_of[(topic, partition)])
        marks = await self._retry(lambda: self.journal.marks(list(self.catalog.topics())),
                                  "reading the offset marks")
        if marks is None:
            return False
        self._floors = marks  # (without the marks forgotten)
        for tp in assigned:
            mark = marks.get((tp.topic, tp.partition))
            if mark is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, mark)
        return True

    async def _finish_others(self, assigned: set[TopicPartition]) -> bool:
        """Write the flushes of ``assigned`` partitions that other runs began and did not finish
        (a sink that crashed, or one still writing them as it let them go), or that this run
        gave up (``_flush``), so that their
        records are read from past those flushes rather than written twice; and finish those
        none of whose partitions exist any more (their topics deleted: no sink is given them).
        False if the sink was stopped first."""
        state = await self._retry(self.journal.state, "reading the journal")
        if state is None:
            return False
        # (this run's own too: one it gave up, see ``_flush``; its flush in flight has ended)
        others = list(state.pending)
        elsewhere = {(r.topic, r.partition) for f in others for r in f.ranges
                     if TopicPartition(r.topic, r.partition) not in assigned}
        existing = elsewhere
        if elsewhere:
            try:
                existing = await existing_partitions(self.bootstrap, {t for t, _ in elsewhere})
            except (KafkaError, TimeoutError) as exc:  # taken to exist: left to their owners
                logger.warning("could not list the partitions of unfinished flushes: %s", exc)
        for flush in others:
            keys = [(r.topic, r.partition) for r in flush.ranges]
            if any(TopicPartition(*key) in assigned for key in keys) or \
                    not any(key in existing for key in keys):
                if not await self._write_pending(flush):
                    return False
        return True

    def _start_flush(self, batch: Batch, consumer: AIOKafkaConsumer) -> None:
        flush_id, self._next_flush_id = self._next_flush_id, self._next_flush_id + 1
        self._inflight_ranges, self._inflight_records = batch.ranges(), len(batch)
        self._inflight = self._last_flush = asyncio.create_task(
            self._flush(flush_id, batch, consumer))

    async def _flush(self, flush_id: int, batch: Batch, consumer: AIOKafkaConsumer) -> bool | None:
        """Write a batch as flush ``flush_id``: True once the store has it, False if the sink was
        stopped first, None if it gave the flush up: the store failed it until the group no
        longer counted this sink a member.

        Each retry first asks the group (``_owns``): a revocation waits for this flush, so a
        store that fails it for longer than the rebalance timeout gets this sink dropped from
        the group, and its partitions' new owners store the batch's records from the store's
        marks (or finish this flush, if its journal entry landed). Written after that, they were
        stored twice. (Before 5 Dec the retries went on regardless: with the store out of reach
        past the timeout, the rollups counted the flush twice.) Given up, the sink starts no
        flush until its next assignment is positioned and drops the batch it is filling."""
        async def still_owns() -> bool:  # (stopped while it asks: given up)
            asking = asyncio.ensure_future(self._owns(consumer, batch, unsure=True))
            stopped = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({asking, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not asking.done():
                asking.cancel()
                return False
            return asking.result()

        written = await self._retry(lambda: self.journal.commit(flush_id, batch),
                                    f"writing flush {flush_id}", before_retry=still_owns)
        if written is _GIVEN_UP:
            logger.warning("analytics sink gave flush %d up: the store failed it until the group "
                           "no longer counted this sink a member (or it was stopped); the "
                           "partitions' owners store its records", flush_id)
            self._assigning = self._reset = True  # until the rejoin positions its partitions
            return None
        if written is None:
            return False  # stopped before the store came back: nothing committed, nothing lost
        self.stats.rows_written += written
        self.stats.flushes += 1
        self.stats.last_flush_s = time.time()
        return True

    async def _complete(self, consumer: AIOKafkaConsumer) -> bool:
        """Wait for the flush in flight; once the store has it, commit its Kafka offsets.
        False if it did not land (the sink was stopped while the store failed). The flush is in
        flight (``flushing``) until its commit is made: cleared before, a caller that waited for
        the last flush's commit read the offsets of the one before while the broker answered."""
        try:
            return await self._land(self._inflight, self._inflight_ranges, consumer)
        finally:
            self._inflight = None

    async def _land(self, task: asyncio.Task, ranges: list[OffsetRange],
                    consumer: AIOKafkaConsumer) -> bool:
        landed = await task
        if landed is None:  # given up: its records are others' to store (see ``_flush``)
            return True
        if not landed:
            logger.warning("analytics sink stopped before the store took a flush: it starts no "
                           "other, and its records are written at the next start")
            return False
        for r in ranges:
            key = (r.topic, r.partition)
            self._floors[key] = max(self._floors.get(key, 0), r.last + 1)
        assigned = consumer.assignment()
        offsets = {tp: r.last + 1 for r in ranges
                   if (tp := TopicPartition(r.topic, r.partition)) in assigned}
        if offsets:
            try:
                await consumer.commit(offsets)
            except Exception as exc:  # noqa: BLE001 - the store's marks decide where to resume
                logger.info("Kafka commit after a flush failed (%s); the store's marks stand", exc)
        return True

    async def _retry(self, action: Callable[[], T], what: str,
                     before_retry: Callable[[], Awaitable[bool]] | None = None) -> T | None:
        """Run a store action in a thread until it succeeds; None if stopped first;
        ``_GIVEN_UP`` if ``before_retry``, awaited before each attempt after the first, said
        False."""
        tried = False

        async def attempt() -> T:
            nonlocal tried
            if tried and before_retry is not None and not await before_retry():
                return _GIVEN_UP
            tried = True
            result = await asyncio.to_thread(action)
            self.stats.store_ok = True
            return result

        def failed() -> None:
            self.stats.store_ok = False
            self.stats.store_failures += 1

        return await self._until_done(attempt, what, (StoreError,), failed)

    async def _read_kafka(self, read: Callable[[], Awaitable[T]], what: str) -> T | None:
        """Await a read from Kafka until it succeeds (a restarting broker refuses connections, a
        slow one times out); None if stopped first."""
        def failed() -> None:
            self.stats.kafka_failures += 1

        return await self._until_done(read, what, (KafkaError, TimeoutError), failed)

    async def _until_done(self, attempt: Callable[[], Awaitable[T]], what: str,
                          retryable: tuple[type[Exception], ...],
                          failed: Callable[[], None]) -> T | None:
        """Await ``attempt()`` until it raises none of ``retryable``, backing off
        (``retry_initial_s`` doubling to ``retry_max_s``); None if stopped first."""
        delay = self.settings.retry_initial_s
        while True:
            try:
                return await attempt()
            except retryable as exc:
                failed()
                self.stats.last_error = f"{what}: {exc}"
                logger.warning("analytics sink: %s; retrying in %.1fs",
                               failure_said(what, exc, self.location), delay)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=delay)  # back off, unless stopped
                return None
            except TimeoutError:
                delay = min(delay * 2, self.settings.retry_max_s)

    @property
    def flushing(self) -> bool:
        """Whether a flush is in flight or its Kafka commit not yet made."""
        return self._inflight is not None

    async def wait_inflight(self) -> None:
        """Wait for the flush in flight, if any, to end (the main loop collects its result)."""
        if self._last_flush is not None:
            await asyncio.wait({self._last_flush})


class _Listener(ConsumerRebalanceListener):
    """Every assignment starts where the store's records end, whatever was fetched before.

    A sink giving partitions up starts no flush from then until its next assignment is
    positioned, and its revocation waits for the flush in flight: the sink given them reads the
    store's marks only after every member's revocation, so its marks include that flush, and no
    flush of the records the batch held (some fetched just before the revocation) lands after
    it read them. (Before 4 Dec such a flush could start during the rebalance, and the sink
    given the partitions wrote the same records again: the rollups counted them twice.)
    aiokafka may fetch a newly assigned partition from its committed offset before this callback
    runs; so the batch being filled is dropped, no flush starts while partitions are positioned,
    and records below the store's marks are skipped (``AnalyticsSink._add``).

    The partitions stay paused from before they are sought until the batch is dropped: nothing
    else resumes them meanwhile. (Before 5 Dec the main loop resumed the partitions it had paused
    for a full batch while they were being positioned; records fetched from the store's marks
    then went with the dropped batch, their partition's position already past them: they were
    never written, or the sink stalled below the partition's end.)
    """

    def __init__(self, sink: AnalyticsSink, consumer: AIOKafkaConsumer) -> None:
        self.sink = sink
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked) -> None:
        self.sink._assigning = self.sink._reset = True
        await self.sink.wait_inflight()

    async def on_partitions_assigned(self, assigned) -> None:
        self.sink._assigning = True
        self.consumer.pause(*assigned)  # fetch nothing until sought
        positioned = False
        try:
            positioned = await self.sink._seek_to_marks(self.consumer, assigned)
        except Exception as exc:  # not one the retries wait out: a bug, say
            # aiokafka logs a listener's exception and carries on: the partitions would stay
            # paused and the sink store nothing while it looked healthy. It stops instead.
            self.sink.failed = exc
            self.sink._stop.set()
            raise
        finally:
            self.sink._reset = True
            if positioned:  # else (stopped first, or failed) they stay paused and nothing flushes
                self.consumer.resume(*(set(assigned) & self.consumer.assignment()))
                self.sink._assigning = False
        self.sink.stats.partitions = len(assigned)
        logger.info("analytics sink assigned %d partitions (group %s)", len(assigned),
                    self.sink.group_id)
