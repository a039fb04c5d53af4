"""The Faust app: thin agents around ``streams.stages``, tables, and the publishing timer.

Topics (``<ns>`` is the namespace; all repartition topics have the telemetry topic's partition
count, so Faust's assignor gives partition N of every one of them, and of every table's changelog,
to the same worker):

* in: ``<ns>.telemetry``, ``<ns>.requests`` (of no other count: ``streams.sources``); out:
  ``<ns>.signals`` (and ``<ns>.deadletter``);
* repartition: ``<ns>.streams.by-worker``, ``<ns>.streams.by-task``, ``<ns>.streams.by-scope``;
* changelogs (Faust's): ``<ns>.streams-{requests,workers,tasks,windows,times}-changelog``.

Each agent takes events in batches, runs them through the pure stages over ``StagedTable`` views
of its tables, sends what they produce and waits for the broker's acknowledgement, and only then
writes its state back (explicitly, with the partition of the records that changed it), then
the event times of the partitions it read (the ``times`` table), which cover that state. A record
the stages fail on is undone and dead-lettered; a batch whose sends or writes fail stops the
worker (``streams.commits``). The books' sweeps follow each partition's event time, and a timer
moves that of partitions gone idle (``_sweep_idle``).
"""

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import faust
import orjson

from infra.bus import PRODUCER_METADATA_MS, FetchAnswers, now_ms, track_topics
from schemas.codec import DecodeError, decode, encode
from schemas.events import DeadLetter, DeadLetterReason, SignalSnapshot
from schemas.limits import MAX_DEAD_LETTER_RAW_BYTES, MAX_REASON_CHARS
from schemas.topics import STREAMS_ROUTES, STREAMS_SUFFIXES, STREAMS_TABLES, TopicCatalog
from streams.commits import CommitGate, GatedConsumer
from streams.crash import ThreadEndedOnCrash, told
from streams.delivery import InlineDelivery
from streams.expiry import ExpiryIndex
from streams.membership import Membership, watch_heartbeats
from streams.metrics import SOURCES, SignalMetrics
from streams.recovery import GuardedTableManager, RecoveryWatch, watch_recovery
from streams.rewind import RewindingConsumer, rewind_uncommitted
from streams.settings import COMMIT_INTERVAL_S, StreamsSettings
from streams.sources import SourcesAssignor, SourcesWatch, sources
from streams.stages import SUB_INDEX, FutureEvent, Send, Stages, partition_of
from streams.staging import StagedTable

logger = logging.getLogger(__name__)

TABLES = STREAMS_TABLES
#: How often (event time, per partition) each sweep runs. The workers' reads every key (a few)
#: and runs often, so that a silent worker's cost is charged soon. The requests' and tasks' read
#: only the entries due (``streams.expiry``), so they run every second: what they forget is
#: spread evenly instead of coming in bursts.
_SWEEP_EVERY_MS = {"workers": 5_000, "requests": 1_000, "tasks": 1_000}
_RECORD_BYTES = 500_000  # repartition records stay well under Kafka's 1 MB default
#: A scope key whose sliding windows have not changed is sent again this often (its Prometheus
#: gauges are set on every tick; a reader that starts meanwhile has it within this long).
RESEND_MS = 30_000


def internal_topics(namespace: str) -> dict[str, str]:
    """Repartition topic names by route."""
    return {route: f"{namespace}.streams.by-{route}" for route in STREAMS_ROUTES}


def all_streams_topics(namespace: str) -> list[str]:
    """Every topic the streams app creates (repartition topics, changelogs and Faust's leader
    election topic), for clean-up."""
    return [f"{namespace}.{suffix}" for suffix in STREAMS_SUFFIXES]


def _chunks(pairs: list, limit: int = _RECORD_BYTES) -> list[bytes]:
    """``pairs`` encoded as few records as stay under ``limit`` bytes each, in order."""
    encoded = orjson.dumps(pairs)
    if len(encoded) <= limit or len(pairs) == 1:
        return [encoded]
    half = len(pairs) // 2
    return _chunks(pairs[:half], limit) + _chunks(pairs[half:], limit)


def _time_partition(key: str) -> int:
    """The partition whose event time a key of the times table is (``t|2``: 2)."""
    return int(key.rpartition("|")[2])


class StreamsConsumer(GatedConsumer, InlineDelivery, ThreadEndedOnCrash, RewindingConsumer):
    """Faust's aiokafka consumer with gated commits (``streams.commits``), the rewinds
    (``streams.rewind``), inline deliveries (``streams.delivery``) and a thread whose stop after
    a crash logs no false fault (``streams.crash``)."""


class _FetchedBy:
    """Faust's consumer as ``infra.bus.FetchAnswers`` reads one: when a partition's latest
    fetch was answered is asked of the aiokafka consumer its thread runs."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer

    def highwater(self, tp) -> int | None:
        return self.consumer.highwater(tp)

    async def position(self, tp) -> int | None:
        return await self.consumer.position(tp)

    def last_poll_timestamp(self, tp) -> int | None:
        fetcher = getattr(getattr(self.consumer, "_thread", None), "_consumer", None)
        return None if fetcher is None else fetcher.last_poll_timestamp(tp)


class StreamsApp:
    """One Faust app for one namespace; ``app.Worker`` runs it (see ``run_worker``)."""

    def __init__(self, settings: StreamsSettings, metrics: SignalMetrics | None = None, *,
                 datadir: Path, clock: Callable[[], int] = now_ms) -> None:
        """``datadir``: Faust's data directory (it holds nothing of memory tables; the worker
        gives it one of its own rather than Faust's default in the current directory).
        ``clock``: epoch milliseconds, the wall clock unless a test sets one: it stamps
        snapshots and dead letters, and events further ahead of it than
        ``max_event_ahead_s`` are dead-lettered."""
        self.settings = settings
        self.clock = clock
        self.catalog = TopicCatalog(settings.namespace)
        self.metrics = metrics or SignalMetrics()
        n = settings.partitions
        self.app = faust.App(
            f"{settings.namespace}.streams", broker=f"kafka://{settings.bootstrap}",
            store="memory://", datadir=datadir, autodiscover=False, web_enabled=False,
            topic_partitions=n, topic_replication_factor=1, table_standby_replicas=1,
            broker_session_timeout=6.0, broker_heartbeat_interval=1.0,
            broker_commit_interval=COMMIT_INTERVAL_S, consumer_auto_offset_reset="earliest",
            stream_wait_empty=False, producer_acks=-1, producer_linger=0.01,
            TableManager=GuardedTableManager,  # a recovery step that times out ends the worker
            # no partition of a source past ``n`` is assigned (``streams.sources``)
            PartitionAssignor=type(SourcesAssignor.__name__, (SourcesAssignor,), {
                "caps": {topic: n for topic in sources(self.catalog)}}),
            # the sources' partitions (tracked: ``_producer``) heard of within this
            producer_metadata_max_age_ms=PRODUCER_METADATA_MS,
        )
        self.names = internal_topics(settings.namespace)
        self.codes = {self.catalog.telemetry: "t", self.catalog.requests: "q",
                      self.names["worker"]: "w", self.names["task"]: "k",
                      self.names["scope"]: "s"}
        raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.tables = {name: self.app.Table(name, default=None, partitions=n)
                       for name in TABLES}
        self.staged = {name: StagedTable(table) for name, table in self.tables.items()}
        self.stages = Stages(settings, **self.staged)
        self.staged["requests"].expiry = ExpiryIndex(self.stages.request_book.expires_ms)
        self.staged["tasks"].expiry = ExpiryIndex(self.stages.task_book.expires_ms)
        self.staged["windows"].written_last = self.stages.is_watermark
        self.staged["times"].partition_of_key = _time_partition
        self._counters = {code: self.metrics.records.labels(name) for code, name in SOURCES.items()}
        self._outputs = [*self.names.values(), self.catalog.signals, self.catalog.deadletter,
                         *(t.changelog_topic.get_topic_name() for t in self.tables.values())]
        self._tracked = None  # the aiokafka producer that tracks them, and the sources
        self.sources = SourcesWatch(self.catalog, n, self.metrics.unread_seen,
                                    settings.bootstrap)
        #: (scope, key) -> its sliding windows' values when last sent, and when (``_to_send``)
        self._sent: dict[tuple[str, str], tuple[list, int]] = {}
        self._swept: dict[tuple[str, int], int] = defaultdict(int)
        #: When (the app's clock) a batch last read each input partition that sweeps follow.
        self._heard: dict[tuple[str, int], int] = {}
        self._fetches = FetchAnswers()  # until when each was read to its end (``_caught_up``)
        #: An agent's batches and the sweeps of its idle partitions never overlap: a sweep's
        #: write-back would write the state of a batch whose outputs are not acknowledged yet.
        self._locks = {agent: asyncio.Lock() for agent in ("ingest", "tasks", "windows")}
        self.gate = CommitGate(self._fail)
        #: The timers act on the partitions assigned here only while the group has confirmed
        #: this worker (``streams.membership``).
        self.membership = Membership(self.app.conf.broker_session_timeout)
        self._confirmed: bool | None = None  # as last judged (None: never yet), logged as it
        # changes
        self._stopping = False  # _fail has crashed the worker
        ingest = self.app.topic(self.catalog.telemetry, self.catalog.requests,
                                self.names["worker"], **raw)
        self.app.agent(ingest, name="ingest")(self._ingest_agent)
        self.app.agent(self.app.topic(self.names["task"], **raw), name="tasks")(self._task_agent)
        self.app.agent(self.app.topic(self.names["scope"], **raw), name="windows")(
            self._window_agent)
        self.app.timer(settings.tick_s)(self._publish)
        self.app.timer(1.0)(self._sweep_idle)
        self.app.timer(1.0)(self._watch_sources)
        # before the app makes its consumer: a class of its own, which commits through the gate
        self.app.transport.Consumer = type(StreamsConsumer.__name__, (StreamsConsumer,),
                                           {"gate": self.gate})
        self.app.on_rebalance_complete.connect(self._on_rebalance_complete)

    async def _on_rebalance_complete(self, sender, **_kwargs) -> None:
        """Faust has recovered the tables and is about to resume the stream partitions."""
        self._hold_deliveries()
        for staged in self.staged.values():
            if staged.expiry is not None:
                staged.expiry.reset()  # each partition is indexed again at its next sweep
        self._heard.clear()  # a partition is idle a while after its assignment at the soonest
        rewound = await rewind_uncommitted(self.app.consumer, set(self.codes))
        if rewound:
            logger.info("rewound %d input partitions without a committed offset", len(rewound))

    async def watch_recovery(self) -> None:
        """Gauge and log the progress of the tables' recovery; crash the worker when it has
        stalled for ``recovery_stall_s`` (``streams.recovery``). Runs from the worker's start:
        the app's own tasks start only once the first recovery has completed."""
        metrics = self.metrics
        await watch_recovery(self.app.tables.recovery,
                             RecoveryWatch(stall_s=self.settings.recovery_stall_s),
                             lambda look: metrics.recovery_seen(look.recovering_s, look.remaining),
                             self.app)

    def _hold_deliveries(self) -> None:
        """Hold the consumer's deliveries until Faust has positioned the new assignment.

        Faust ends a rebalance by resuming the stream partitions, seeking them to their committed
        offsets and then resuming flow control, which empties every stream's queue. Records
        delivered in between were dropped from the queues though the consumer's position had
        passed them (1 run in 20 to 40 of ``tests/integration/test_streams_cost.py`` under CPU
        contention lost the first events produced after a restart). With flow control suspended
        from this signal on, the consumer waits before delivering a record, and the resume that
        empties the queues lets it go on.
        """
        self.app.flow_control.suspend()

    # -- agents (thin: decode, stage, send, write back) --------------------------------------

    async def _ingest_agent(self, stream) -> None:
        async for events in stream.take_events(self.settings.batch_max,
                                               self.settings.batch_within_s):
            await self._batch("ingest", self._ingest, events)

    async def _task_agent(self, stream) -> None:
        async for events in stream.take_events(self.settings.batch_max,
                                               self.settings.batch_within_s):
            await self._batch("tasks", self._tasks, events)

    async def _window_agent(self, stream) -> None:
        async for events in stream.take_events(self.settings.batch_max,
                                               self.settings.batch_within_s):
            await self._batch("windows", self._windows, events)

    async def _batch(self, agent: str, handle, events) -> None:
        """Handle one batch (or one sweep of idle partitions) of ``agent``, which none of its
        others overlaps; if it fails, crash the worker (``_fail``).

        The agent itself does not raise: Faust's supervisor would restart it, and a restart
        that meets the worker's own stop (the other agents failing on the closed gate while
        the worker stops them) hung the process for good. Until the worker has stopped, its
        agents read on and handle nothing, and no offset is committed (the gate)."""
        async with self._locks[agent]:
            try:
                self.gate.check()  # closed: an earlier write failed, or a batch did
                await handle(events)
            except Exception as exc:
                await self._fail(exc)

    async def _fail(self, exc: BaseException) -> None:
        """Something the worker wrote did not reach the broker, or a batch failed: commit
        nothing more, write back nothing staged, and crash the worker (``streams.commits``).
        The tables in memory may hold what was not sent; the next worker rebuilds them from the
        changelogs and reads again from the offsets committed."""
        self.gate.close(exc)
        for staged in self.staged.values():
            staged.discard()
        if not self._stopping:
            self._stopping = True
            logger.critical("the streams worker stops, committing nothing more: %s: %s",
                            type(exc).__name__, exc, exc_info=exc)
            await self.app.crash(told(exc))  # (mode's "Crashed reason=" would repeat it)

    async def _ingest(self, events) -> None:
        """Ingest a batch, sweeping each telemetry record's partition after it as its event
        time passes (``_sweep_telemetry``), as one record at a time would: a request forgotten
        or a worker expired by then is so for the batch's later records too (before 7 Dec the
        sweep ran once after the batch)."""
        sends, now = [], self.clock()
        read: dict[str, int] = defaultdict(int)
        for event in events:
            sends += await self._ingest_one(event, now)
            read[event.message.topic] += 1
            if event.message.topic == self.catalog.telemetry:
                sends += self._sweep_telemetry([event.message.partition])
        for topic, count in read.items():
            self._counters[self.codes[topic]].inc(count)
        partitions = {e.message.partition for e in events
                      if e.message.topic == self.catalog.telemetry}
        self._heard_from("t", partitions, now)
        await self._send(sends)
        await self._write_back("requests", "workers", times_of="t")

    async def _ingest_one(self, event, now: int) -> list[Send]:
        msg = event.message
        code = self.codes[msg.topic]
        self.staged["requests"].partition = self.staged["workers"].partition = msg.partition
        if code == "w":
            return await self._apply(msg, ("requests", "workers"), lambda: [
                send for j, (key, payload) in enumerate(orjson.loads(msg.value))
                for send in self.stages.ingest(code, msg.partition, msg.offset, key, payload,
                                               j * SUB_INDEX)]) or []
        try:
            message = decode(self.catalog.spec(msg.topic), msg.value)
        except DecodeError as exc:
            await self._dead_letter(msg, exc.reason, exc.detail)
            return []
        return await self._apply(msg, ("requests", "workers"), lambda: self.stages.ingest(
            code, msg.partition, msg.offset, None, message, now_ms=now)) or []

    async def _apply(self, msg, tables: tuple[str, ...], apply: Callable[[], Any]) -> Any:
        """``apply()``, one record's work on ``tables`` and its partition's event time (the
        ``times`` table), as a unit (``StagedTable.begin``): a record it fails on changes
        nothing, goes to the dead-letter topic with why, and the agent goes on (``None``). An
        internal record is the streams' own, but one written by an older version, or a bug a
        record sets off in the stages, must not stop the agent. (Before 7 Dec the failed
        record's time stayed moved, and the books took later records as at that time.)"""
        units = [self.staged[name] for name in (*tables, "times")]
        for unit in units:
            unit.begin()
        try:
            result = apply()
        except Exception as exc:
            for unit in units:
                unit.rollback()
            if isinstance(exc, FutureEvent):  # its time would move the partition's ahead
                await self._dead_letter(msg, "future_event_time", str(exc))
            elif isinstance(exc, orjson.JSONDecodeError):
                await self._dead_letter(msg, "undecodable", str(exc))
            else:
                logger.exception("the stages failed on %s[%d]@%d", msg.topic, msg.partition,
                                 msg.offset)
                await self._dead_letter(msg, "unprocessable", f"{type(exc).__name__}: {exc}")
            return None
        for unit in units:
            unit.commit()
        return result

    async def _tasks(self, events) -> None:
        """Apply a batch of by-task records, sweeping each record's partition after it as its
        event time passes (``_sweep_tasks``), as one record at a time would. Before 7 Dec the
        sweep ran once after the batch: a step read later in it kept open a task already past
        its idle timeout, which a batch ending between the two records timed out."""
        staged, sends, now = self.staged["tasks"], [], self.clock()
        for event in events:
            msg = event.message
            staged.partition = msg.partition
            sends += await self._apply(msg, ("tasks",), lambda: self._by_task(msg)) or []
            sends += self._sweep_tasks(msg.partition)
        self._counters["k"].inc(len(events))
        self._heard_from("k", {event.message.partition for event in events}, now)
        await self._send(sends)
        await self._write_back("tasks", times_of="k")

    def _by_task(self, msg) -> list[Send]:
        """A by-task record's outputs."""
        return [send for j, (key, payload) in enumerate(orjson.loads(msg.value))
                for send in self.stages.ingest("k", msg.partition, msg.offset, key, payload,
                                               j * SUB_INDEX)]

    async def _windows(self, events) -> None:
        """Apply a batch's observations grouped by scope key, as one unit; if that fails, one
        record at a time, dead-lettering the records it fails on."""
        self._counters["s"].inc(len(events))
        staged = self.staged["windows"]
        staged.begin()
        try:
            counts = self._observe([event.message for event in events])
        except Exception:
            staged.rollback()
            counts = [0, 0]
            for event in events:
                msg = event.message
                done = await self._apply(msg, ("windows",), lambda: self._observe([msg]))
                if done is not None:
                    counts = [counts[0] + done[0], counts[1] + done[1]]
        else:
            staged.commit()
        self._heard_from("s", {event.message.partition for event in events}, self.clock())
        applied, items = counts
        self.metrics.observations.inc(applied)
        self.metrics.duplicates.inc(items - applied)
        await self._write_back("windows")

    def _observe(self, messages) -> list[int]:
        """Apply the observations of by-scope records grouped by scope key; return how many
        were new, of how many. Each is judged late against its partition's event time as it
        arrived (``Stages.arrivals``), not as the keys grouped before it moved it on; each
        partition's idle keys are forgotten after all its keys' (``Stages.forget_due``)."""
        read: dict[int, list] = defaultdict(list)  # partition -> its [key, item] pairs in order
        for msg in messages:
            read[msg.partition] += orjson.loads(msg.value)
        groups: dict[tuple[int, str], tuple[list, list]] = defaultdict(lambda: ([], []))
        for partition, pairs in read.items():
            arrived = self.stages.arrivals(partition, [item for _key, item in pairs])
            for (key, item), arrival in zip(pairs, arrived, strict=True):
                group, arrivals = groups[(partition, key)]
                group.append(item)
                arrivals.append(arrival)
        staged, applied, items = self.staged["windows"], 0, 0
        for (partition, key), (group, arrivals) in groups.items():
            staged.partition = partition
            applied += self.stages.observe_key(partition, key, group, arrivals)
            items += len(group)
        for partition in read:  # once all its keys' observations are applied
            staged.partition = partition
            self.stages.forget_due(partition)
        return [applied, items]

    # -- sending -------------------------------------------------------------------------------

    def _producer(self):
        """The app's producer, made to track every topic the app writes before its first send
        (``infra.bus.track_topics``: otherwise a changelog topic still missing from the broker's
        metadata at the first write-back could leave the other topics' batches unsent), and the
        sources (``_watch_sources``)."""
        producer = self.app.producer
        client = producer._ensure_producer()  # Faust's producer service wraps aiokafka's
        if client is not self._tracked:
            track_topics(client, [*self._outputs, *sources(self.catalog)])
            self._tracked = client
        return producer

    async def _watch_sources(self) -> None:
        """The source topics' partitions as the producer's metadata lists them (asked for every
        ``PRODUCER_METADATA_MS``), to ``streams.sources.SourcesWatch``: one added while the
        worker runs is said within that."""
        cluster = self._producer()._ensure_producer().client.cluster
        self.sources.look({topic: len(cluster.partitions_for_topic(topic) or ()) or None
                           for topic in sources(self.catalog)})

    async def _send(self, sends: list[Send]) -> None:
        """Send one record per repartition topic and partition, holding ``[key, value]`` pairs
        in the order they were made (the key decides the partition, as Kafka's default
        partitioner would), and wait for every acknowledgement. In that order, not grouped by
        key: the windows judge an observation late against those read before it in its
        partition (before 7 Dec one key's observations went before another's made earlier, so
        a batch spanning more than the allowed lateness made some late that one record at a
        time did not)."""
        grouped: dict[tuple[str, int], list] = defaultdict(list)
        n = self.settings.partitions
        for route, key, value in sends:
            grouped[(route, partition_of(key, n))].append([key, value])
        producer = self._producer()
        futures = [
            await producer.send(self.names[route], None, value, partition, None, None)
            for (route, partition), pairs in grouped.items() for value in _chunks(pairs)
        ]
        if futures:
            await asyncio.gather(*futures)

    async def _write_back(self, *tables: str, times_of: str | None = None) -> None:
        """Write staged state to the tables and their changelogs, then the event times of the
        partitions of source ``times_of`` (``t``, ``k``: the ``times`` table's keys the agent
        moves; the other agent writes back its own, after its own entries). Not awaited: Faust
        flushes the producer before it commits the offsets of the records that caused it, and
        the gate checks each write then, and before the next batch (``streams.commits``).

        The times last: a write-back cut short (the worker dies) leaves a prefix of the
        records, and a partition's time restored ahead of the entries restored with it would
        apply the records read again from the committed offset at that later time, not at
        their own, as the entries' dedupe could not tell; one restored behind them is moved
        on by those records as it was the first time (``test_times_table``). (The times are in
        a changelog of their own: aiokafka sends one request at a time to a broker, so they
        go with the entries or after them where one broker leads both partitions; Kafka
        promises no order across brokers.)"""
        self.gate.check()  # nothing more is written once the gate has closed
        records = [record for name in tables for record in self.staged[name].flush()]
        if times_of is not None:
            records += self.staged["times"].flush(lambda key: key.startswith(f"{times_of}|"))
        producer = self._producer()
        self.gate.track([await producer.send(topic, key, value, partition, None, None)
                         for topic, key, value, partition in records])

    async def _dead_letter(self, msg, reason: DeadLetterReason, detail: str) -> None:
        raw = msg.value or b""
        letter = DeadLetter(
            event_time_ms=self.clock(), source_topic=msg.topic,
            partition=msg.partition, offset=msg.offset, consumer=self.app.conf.id[:128],
            reason=reason, error=detail[:MAX_REASON_CHARS], key=msg.key[:1024] if msg.key else None,
            raw=raw[:MAX_DEAD_LETTER_RAW_BYTES], raw_size=len(raw))
        self.metrics.dead_lettered(msg.topic, reason)
        await (await self._producer().send(self.catalog.deadletter, msg.topic.encode(),
                                            encode(letter), None, None, None))
        logger.warning("dead-lettered %s[%d]@%d: %s: %s", msg.topic, msg.partition, msg.offset,
                       reason, detail)

    # -- sweeps (event time, per partition) ----------------------------------------------------

    def _due(self, table: str, code: str, partition: int) -> int | None:
        """The event time of input ``code``'s ``partition`` (``Stages.event_time``) if ``table``
        is due a sweep there."""
        watermark = self.stages.event_time((code, partition))
        if watermark - self._swept[(table, partition)] < _SWEEP_EVERY_MS[table]:
            return None
        self._swept[(table, partition)] = watermark
        return watermark

    def _keys_in(self, table: str, partition: int) -> list[str]:
        """The table's keys in ``partition``, from the memory store's key -> partition map (which
        both recovery and ``StagedTable`` keep), so a sweep costs no hashing; as the batch's
        staged writes leave them (``StagedTable.keys_in``: before 7 Dec the workers' sweep
        missed a worker its own batch made, which one record at a time it forgot)."""
        store = self.tables[table].data
        known = getattr(store, "_key_partition", None)
        if known is None:
            n = self.settings.partitions
            stored = [k for k in list(store.keys()) if partition_of(k, n) == partition]
        else:
            stored = [k for k, p in list(known.items()) if p == partition]
        return self.staged[table].keys_in(partition, stored)

    def _sweep_telemetry(self, partitions: Iterable[int]) -> list[Send]:
        """As a telemetry partition's event time passes: charge what waits on workers gone
        silent, forget old requests."""
        sends = []
        for partition in partitions:
            watermark = self._due("workers", "t", partition)
            if watermark:
                self.staged["workers"].partition = partition
                sends += self.stages.sweep_workers(self._keys_in("workers", partition), watermark,
                                                   partition)
            watermark = self._due("requests", "t", partition)
            if watermark:
                self.staged["requests"].partition = partition
                keys = self._keys_due("requests", partition, watermark)
                self.stages.sweep_requests(keys, watermark)
                self._file_again("requests", partition, keys)
        return sends

    def _sweep_tasks(self, partition: int) -> list[Send]:
        before = self._swept[("tasks", partition)]
        watermark = self._due("tasks", "k", partition)
        if not watermark:
            return []
        self.staged["tasks"].partition = partition
        keys = self._keys_due("tasks", partition, watermark)
        sends = self.stages.sweep_tasks(keys, watermark, partition, before)
        self._file_again("tasks", partition, keys)
        return sends

    def _keys_due(self, table: str, partition: int, watermark: int) -> list[str]:
        """The keys of ``table`` in ``partition`` that its sweep acts on at ``watermark``
        (``streams.expiry``); the first sweep after a (re)assignment files the partition's keys.
        Without an index, every key of the partition."""
        staged = self.staged[table]
        expiry = staged.expiry
        if expiry is None:
            return self._keys_in(table, partition)
        if partition not in expiry.indexed:
            expiry.index_partition(partition, ((key, staged[key]) for key in
                                               self._keys_in(table, partition) if key in staged))
        return expiry.due(partition, watermark)

    def _file_again(self, table: str, partition: int, keys: list[str]) -> None:
        """File again what a sweep took out of the index and kept (an entry it changed, such as a
        task it timed out, is filed under its new deadline as it is staged)."""
        staged = self.staged[table]
        if staged.expiry is None:
            return
        for key in keys:
            value = staged.get(key)
            if value is not None:
                staged.expiry.note(key, partition, value)

    # -- idle partitions -----------------------------------------------------------------------

    def _heard_from(self, code: str, partitions: Iterable[int], now: int) -> None:
        for partition in partitions:
            self._heard[(code, partition)] = now

    async def _sweep_idle(self) -> None:
        """Sweep the telemetry, by-task and by-scope partitions of this worker that have gone
        idle (a by-scope one: its windows, taken at its event time, move on with it).

        A partition's event time is the newest read there, so the sweeps of one no record
        reaches stood still: a by-task partition whose tasks' last records were read never
        timed them out, a telemetry partition whose only worker crashed never charged its
        attempts' ends. Once a partition has had no record for ``allowed_lateness_s`` of wall
        time (with nothing left to read on it, no rebalance under way and this worker's
        membership confirmed), its event time moves on with the clock, that lateness behind:
        what comes later than that is late by the windows' measure too. It moves no further
        than the time the partition is known to have been read to its end (``_caught_up``):
        a partition not fetched for a while (its fetches failing) may hold records not read
        yet, which would come late by then."""
        now = self.clock()
        lateness = int(self.settings.allowed_lateness_s * 1000)
        for agent, code, topic in (("ingest", "t", self.catalog.telemetry),
                                   ("tasks", "k", self.names["task"]),
                                   ("windows", "s", self.names["scope"])):
            idle = await self._idle(code, topic, now, lateness)
            if idle:
                await self._batch(agent, partial(self._sweep_idle_partitions, code), idle)

    async def _sweep_idle_partitions(self, code: str, idle: dict[int, tuple[int, int]]) -> None:
        """Sweep the partitions of ``idle`` (partition -> when it was last heard from, and the
        watermark it moves on to) that no batch has read since."""
        moved = {partition: watermark for partition, (heard, watermark) in idle.items()
                 if self._heard.get((code, partition)) == heard}  # not read while this waited
        for partition, watermark in moved.items():
            if code == "s":  # the windows are taken at their partition's event time: it moves on
                self.staged["windows"].partition = partition
                self.stages.advance(partition, watermark)
            else:  # the sweeps follow the stages' event time (``_due``)
                self.stages.move_on((code, partition), watermark)
        if code == "s":
            sends, tables, times_of = [], ("windows",), None
        elif code == "t":
            sends, tables, times_of = self._sweep_telemetry(moved), ("requests", "workers"), "t"
        else:
            sends = [send for partition in moved for send in self._sweep_tasks(partition)]
            tables, times_of = ("tasks",), "k"
        await self._send(sends)
        await self._write_back(*tables, times_of=times_of)

    async def _idle(self, code: str, topic: str, now: int,
                    lateness_ms: int) -> dict[int, tuple[int, int]]:
        """The partitions of ``topic`` assigned here that no record reached for ``lateness_ms``
        and that have nothing left to read, with when they were last heard from (or first
        seen) and the watermark they move on to: ``lateness_ms`` behind ``now``, and no later
        than they are known to have been read to their end; none while they may not be this
        worker's (``_speaks_for_its_partitions``: a worker resumed from a long pause found them
        all idle, and swept partitions another worker had taken meanwhile, writing to their
        changelogs)."""
        if not self._speaks_for_its_partitions():
            return {}
        consumer = self.app.consumer
        idle = {}
        for tp in self.app.assignor.assigned_actives():
            if tp.topic != topic:
                continue
            heard = self._heard.setdefault((code, tp.partition), now)
            if now - heard >= lateness_ms:
                read_until = await self._caught_up(consumer, tp)
                if read_until is not None:
                    idle[tp.partition] = (heard, min(now - lateness_ms, read_until))
        return idle

    async def _caught_up(self, consumer, tp) -> int | None:
        """Until when (the clock) the consumer has fetched and delivered everything the
        partition holds (``infra.bus.FetchAnswers``: its position at the end its latest fetch
        found, as of when the fetch before was answered, and its last record delivered); None
        where it has not, or may not have (not fetched twice yet)."""
        read_until = await self._fetches.read_to_end_at(_FetchedBy(consumer), tp)
        if read_until is None:
            return None
        read = consumer._read_offset[tp]  # the last offset delivered (None: none, or a rewind)
        return read_until if read is None or read + 1 >= consumer.highwater(tp) else None

    # -- publishing ----------------------------------------------------------------------------

    def _active(self, topic: str) -> set[int]:
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic}

    def _speaks_for_its_partitions(self) -> bool:
        """Whether the partitions assigned here are this worker's to act on (publish, sweep):
        not while it rebalances, nor once ``session_timeout`` has passed since the last
        heartbeat the broker acknowledged was sent (a worker resumed from a pause past it may
        have lost them to another; ``streams.membership``)."""
        if self.app.rebalancing:
            return False
        thread = getattr(self.app.consumer, "_thread", None)
        coordinator = getattr(getattr(thread, "_consumer", None), "_coordinator", None)
        if coordinator is not None:
            watch_heartbeats(coordinator, self.membership)
        confirmed = self.membership.confirmed(time.monotonic())
        if self._confirmed is not None and confirmed != self._confirmed:
            if confirmed:
                logger.warning("the group confirms this worker again: it publishes and sweeps")
            else:
                logger.warning("no heartbeat of this worker acknowledged for its session timeout "
                               "(%g s): it may have lost its partitions, and publishes and "
                               "sweeps nothing until the group confirms it",
                               self.membership.session_timeout_s)
        if confirmed or self._confirmed is not None:
            self._confirmed = confirmed
        return confirmed

    async def _publish(self) -> None:
        """Publish the snapshots of this worker's partitions, but not while it rebalances: Faust
        then reads each table's changelog again from where its last recovery ended, over the
        state the worker holds, so a key written since holds its older values for a while (a
        worker paused past its session timeout and resumed published its running totals from
        a minute before, then the right ones again); nor while its membership is not confirmed
        (``_speaks_for_its_partitions``)."""
        if not self._speaks_for_its_partitions():
            return
        now = self.clock()
        snapshots = self.stages.snapshots(self._active(self.names["scope"]), now)
        snapshots += self.stages.fleet_view(self._active(self.catalog.telemetry), now)
        producer = self._producer()
        to_send, sent = self._to_send(snapshots, now)
        futures = [await producer.send(self.catalog.signals, f"{s.scope}:{s.key}".encode(),
                                       encode(s), None, None, None) for s in to_send]
        if futures:
            await asyncio.gather(*futures)
        self._sent = sent  # (once the broker has them: a send that failed is made again)
        self.metrics.publish(snapshots)

    def _to_send(self, snapshots: list[SignalSnapshot], now_ms: int
                 ) -> tuple[list[SignalSnapshot], dict[tuple[str, str], tuple[list, int]]]:
        """The snapshots of the scope keys whose sliding windows changed since they were last
        sent, or that were last sent ``RESEND_MS`` ago, and the fleet view (each worker's age
        moves on). A key idle for the hour it is kept (every tenant seen in it) would otherwise
        be sent on every tick, with nothing new, to the signals topic and all its readers.
        Returns them and what ``_sent`` becomes once they are sent."""
        windows = set(self.settings.windows_s)
        by_key: dict[tuple[str, str], list[SignalSnapshot]] = defaultdict(list)
        for snapshot in snapshots:
            by_key[(snapshot.scope, snapshot.key)].append(snapshot)
        out, sent = [], {}
        for key, group in by_key.items():
            windowed = [(s.window_s, s.values) for s in group if s.window_s in windows]
            last = self._sent.get(key)
            if key[0] == "fleet" or last is None or last[0] != windowed \
                    or now_ms - last[1] >= RESEND_MS:
                out += group
                sent[key] = (windowed, now_ms)
            else:
                sent[key] = last
        return out, sent  # (the keys published now: forgotten ones leave)
