"""The worker process: one GPU slot, its dispatch partition, an engine, and what it reports.

It reads its own partition of ``governor.dispatch`` (manual assignment; the slot is announced in
every WorkerStatus), runs the engine in real time (``speedup`` runs the engine's clock faster),
streams ResponseChunks, publishes lifecycle events, a status heartbeat about every 0.5 s and
batched KV block events, exports vLLM-named Prometheus metrics, and obeys its commands on
``governor.control`` (drain, sleep and wake, load a model, injected faults).

A dispatch is committed only after its request's terminal event is acknowledged, so the requests of
a worker that dies are read again by the next worker on the slot. On SIGTERM the worker stops
taking work, lets in-flight requests finish for up to ``drain_timeout_s`` (or until a second
SIGTERM or Ctrl-C: ``hand_back_now``), and hands back the rest with a ``Requeued`` event
(uncommitted, so nothing accepted is dropped); so is a request its engine gives up on for the
engine's own trouble (a vLLM server that died). Among those read again, the attempts the router has
since resumed elsewhere come with their cancellation behind them; a dispatch cancelled further on
in the same fetch is not started at all. Taking no work (stopping, drained, asleep), the worker
still reads its partition for the cancellations and recalls of what it runs; it reads the rest
again when woken (stopping, it hands each dispatch back at once, leaving it uncommitted to the next
worker).
"""

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from controllers.metrics import EmittedMetrics
from infra.bus import (Outbox, StreamPartition, TopicList, TypedConsumer, Undelivered,
                       assign_at_ends, follower, forget_topic, make_producer, now_ms,
                       take_on_added, track_topics)
from infra.config_cli import current_config, declare_models
from infra.serving import say_serving
from schemas import commands
from schemas.base import Message
from schemas.codec import DecodeError
from schemas.config import WORKER_HEARTBEAT_S
from schemas.events import (
    Cancelled, Completed, Failed, FirstToken, KvBlocksEvicted, KvBlocksStored, Requeued, Started,
    StreamProgress, WorkerStatus, about,
)
from schemas.limits import (MAX_CHUNK_TOKENS, MAX_MAP_ENTRIES, MAX_PREFIX_BLOCKS, MAX_REASON_CHARS,
                            pool_name)
from schemas.requests import (CancelRequest, Dispatch, FinishReason, InferenceRequest,
                              ResponseChunk, stream_end)
from schemas.topics import TopicCatalog
from workers.engine import (CapacityError, Engine, EngineFailure, EngineRequest, EngineStats,
                            TokenBatch, interval_report)
from workers.metrics import EngineMetrics
from workers.offsets import OffsetTracker
from workers.sim import models
from workers.slot_check import SLOT_CHECK_S, check_slot_free

logger = logging.getLogger(__name__)

_REMEMBERED = 100_000  # finished request ids kept to drop redelivered dispatches


@dataclass(frozen=True)
class WorkerIdentity:
    slot: int
    worker_id: str
    pool: str
    gpu_type: str
    model: str


@dataclass
class _Running:
    dispatch: Dispatch
    offset: int
    tokens_done: int  # its stream's next offset, as emitted
    tokens_flushed: int = 0  # the same, as of the last flush the broker took in full
    last_token_s: float | None = None  # engine time of its last token (its inter-token latency)
    #: the router superseded it as its engine finished it (``_on_cancel``): it sends no end
    superseded: bool = False

    def __post_init__(self) -> None:
        self.tokens_flushed = self.tokens_done


def _no_reply_topic(topic: str) -> str:
    return f"reply_to topic {topic!r} no longer exists: the answer has nowhere to go"


def _refused_reply_topic(topic: str, why: object) -> str:
    return f"reply_to topic {topic!r} refused this worker's writes: {why!r}"


def _why_unanswerable(req: InferenceRequest, gone: set[str], refused: dict[str, str]) -> str | None:
    """Why ``req``'s answer cannot reach its client: its reply topic is gone, or the broker
    refused its records there (``refused``: request id -> why); None if neither."""
    if req.reply_to in gone:
        return _no_reply_topic(req.reply_to)
    return refused.get(req.request_id) if req.reply_to is not None else None


#: How old the worker's list of topics may be when it checks a reply topic it has sent to.
REPLY_TOPICS_MAX_AGE_S = 30.0

#: A ``load_model`` of a model the worker does not know reads the models the configuration
#: declares (the setting ``models``) again, for at most ``READ_MODELS_S``: its serving loop
#: waits meanwhile; for a model the last read did not find, at most this often
#: (``models.DeclaredReads``).
REREAD_MODELS_S = 10.0
READ_MODELS_S = 2.0

#: How long a worker starting on a slot may take to read the slot's backlog before serving it.
BACKLOG_READ_S = 30.0
#: A loop that stood still this long (its process paused: SIGSTOP, a frozen VM) may have been
#: given up on: the least heartbeat timeout a router runs with.
STALL_S = 2 * WORKER_HEARTBEAT_S
#: How long a worker back from such a stall reads its slot's partition before it steps on.
STALL_READ_S = 5.0


def _key(message: Message) -> tuple[str, int] | None:
    """A dispatch's request and attempt."""
    if isinstance(message, Dispatch):
        return message.request.request_id, message.attempt
    return None


def _recalled(messages: Iterable[Message]) -> dict[tuple[str, int], CancelRequest]:
    """The attempts that cancellations among ``messages`` recall or supersede, with the
    cancellation (a client's, with no attempt, ends the request instead: that one is started
    and cancelled)."""
    return {(m.request_id, m.attempt): m for m in messages
            if isinstance(m, CancelRequest) and m.attempt is not None}


async def _unless_stopped(starting: Awaitable, stop: asyncio.Event) -> bool:
    """Await ``starting`` unless ``stop`` is set first (then it is cancelled): whether it ended.
    The vLLM adapter waits up to 600 s for its server to answer: a SIGTERM meanwhile went
    unheard until then."""
    task = asyncio.ensure_future(starting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # (its error, where it failed)
    return True


class WorkerService:
    def __init__(
        self,
        bootstrap: str,
        catalog: TopicCatalog,
        identity: WorkerIdentity,
        engine: Engine,
        *,
        speedup: float = 1.0,
        max_tick_s: float = 0.05,
        status_interval_s: float = WORKER_HEARTBEAT_S,
        drain_timeout_s: float = 30.0,
        metrics: EngineMetrics | None = None,
        slot_check_s: float = SLOT_CHECK_S,
    ) -> None:
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.me = identity
        self.engine = engine
        self.speedup = speedup
        self.max_tick_s = max_tick_s
        self.status_interval_s = status_interval_s
        self.drain_timeout_s = drain_timeout_s
        self.slot_check_s = slot_check_s  # (see ``workers.slot_check``; 0: taken unheard)
        self.metrics = metrics or EngineMetrics(identity.model)
        #: what it emits (terminal events by reason) and dead-letters, beside vLLM's names
        self.emitted = EmittedMetrics(self.metrics.registry)
        self.models = [identity.model]
        self.mode = "serving"  # or "draining", "sleeping"
        self._handing_back = False  # stopping, it hands back what runs without finishing it
        self._running: dict[str, _Running] = {}
        #: request id -> the last attempt of it this worker finished or handed back
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._offsets = OffsetTracker()
        self._completed = 0  # requests that ended Completed
        self._started_ms = now_ms()
        self._t0 = time.monotonic()
        self._finishing: list[int] = []  # offsets whose terminal event awaits acknowledgement
        self._taken: dict[int, tuple[str, int]] = {}  # open offset -> (request id, attempt)
        #: which reply_to topics exist (listed again at most every ``REPLY_TOPICS_MAX_AGE_S``
        #: while one is in use, and for a topic this worker has not sent to yet)
        self._reply_topics = TopicList(None)
        # Inter-token latency since the last status: seconds of decoding sequences / tokens
        # produced. Prefill time is left out: a long prompt is not a slow GPU.
        self._seq_seconds = 0.0
        self._decode_seconds = 0.0  # of engine time with any sequence decoding
        self._tokens = 0
        self._last_step = time.monotonic()
        self._stall_read_at = 0.0  # when ``_read_after_a_stall`` last began to read
        self._work_reported: tuple[int | None, int | None] = (None, None)  # steps, prefilled
        self._declared = models.DeclaredReads(REREAD_MODELS_S)  # (``_learn_declared_models``)
        self._drain_deadline_ms: int | None = None  # a DrainWorker's, until it passes or a wake
        #: the partition's position when the worker stopped taking work (drained, asleep): what
        #: it reads from there on is read again when it wakes (see ``_take_cancellations``)
        self._paused_at: int | None = None
        #: the engine's state as of the last step, and as the last status gave it: a change is
        #: told at once (a vLLM server found dead was sent work for up to a heartbeat more)
        self._engine_state: str | None = None
        self._state_reported: str | None = None
        #: requests whose last tokens were emitted: (dispatch offset, terminal event, request),
        #: the event sent once a flush has taken those tokens
        self._ending: list[tuple[int, Message, InferenceRequest]] = []
        #: those whose last chunks are on the broker: their ends go with the next flush
        self._streamed: list[tuple[int, Message, InferenceRequest]] = []

    def engine_now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    async def run(self, stop: asyncio.Event) -> None:
        # Everything is stopped, last first, however far the start got (a broker that did not
        # answer left the vLLM adapter's session and scrapes running; a stop before or after a
        # failed start is harmless)
        async with contextlib.AsyncExitStack() as started:
            if hasattr(self.engine, "close"):
                started.push_async_callback(self.engine.close)
            if hasattr(self.engine, "start"):  # an engine doing I/O (the vLLM adapter) starts on this loop
                if not await _unless_stopped(self.engine.start(), stop):
                    return  # (stopped while its engine started: a vLLM server still loading)
            self.metrics.observe_stats(self.engine.stats())  # the baseline of its work
            if self.slot_check_s > 0:  # (before it says anything: not even "stopped")
                await check_slot_free(self.bootstrap, self.catalog, self.me.worker_id,
                                      self.me.slot, self._started_ms, self.slot_check_s)
                # the engine's time starts now (a cold start's loading is not spent unreported)
                self._t0 = self._last_step = time.monotonic()
            self.partition = TopicPartition(self.catalog.dispatch, self.me.slot)
            dispatch = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=f"{self.catalog.namespace}.worker-{self.me.slot}",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            control = follower(self.bootstrap)  # (partitions added since: ``_obey``)
            self.producer = make_producer(self.bootstrap)
            for client in (self.producer, dispatch, control):
                started.push_async_callback(client.stop)
            self.outbox = Outbox(self.producer, vanished=self._vanished,
                                 observe=self.emitted.emitted)
            self._reply_topics = TopicList(self.producer.client, max_age_s=REPLY_TOPICS_MAX_AGE_S)
            await self.producer.start()
            c = self.catalog  # every topic it writes, known from the start (see ``track_topics``)
            track_topics(self.producer, [c.telemetry, c.responses, c.kv, c.dispatch, c.deadletter])
            await dispatch.start()
            await control.start()
            await assign_at_ends(control, self.catalog, [self.catalog.control])
            dispatch.assign([self.partition])
            self.dispatch = dispatch
            typed, typed_control = (
                TypedConsumer(consumer, self.catalog, self.producer, self.me.worker_id,
                              counted=self.emitted.dead_lettered) for consumer in (dispatch, control))
            say_serving(f"worker {self.me.worker_id} ({self.me.pool})", self.catalog.dispatch,
                        self.bootstrap, f"slot {self.me.slot}")
            try:
                await self._serve(typed, typed_control, stop)
                await self._drain_then_hand_back(typed)
            finally:
                await self._last_flushes()

    async def _last_flushes(self) -> None:
        """What is left, then the ends of the requests whose last chunks that took, then the
        "stopped" status: not with them (a router that reads "stopped" first takes the worker's
        requests for lost, and would end one whose tokens it has all a second time), but also
        when a flush before it fails (else the router learns of the stop only by silence)."""
        try:
            await self._flush_and_commit()
            await self._flush_and_commit()
        finally:
            self._emit(self.catalog.telemetry, self._status("stopped"), self.me.worker_id)
            await self._flush_and_commit()

    async def _backlog(self, typed: TypedConsumer, stop: asyncio.Event) -> tuple[list, int]:
        """What the slot's partition holds now from where this worker starts, and the offset it
        ends at, read as one batch: a supersede written after a dispatch (by the router, or by
        the worker this one took the slot over from, once it had finished the dispatch) keeps it
        from running again, however the broker splits the backlog into fetches. Read for at
        most ``BACKLOG_READ_S`` here, heart-beating as "starting", or until a ``stop`` (none of
        it is started or committed: the next worker on the slot reads it all); the serving loop
        reads the rest, before it starts any of it."""
        end = (await self.dispatch.end_offsets([self.partition]))[self.partition]
        items: list = []
        deadline = time.monotonic() + BACKLOG_READ_S
        last_status = time.monotonic()  # (a backlog read at once goes unmentioned)
        while await self.dispatch.position(self.partition) < end and not stop.is_set():
            if time.monotonic() >= deadline:
                logger.warning("worker %s read %d records of its backlog in %gs, not all of it: "
                               "it starts none of it until it has read the rest",
                               self.me.worker_id, len(items), BACKLOG_READ_S)
                break
            # (never cut short: the consumer's position has moved past the whole fetch)
            items += await typed.fetch(200)
            if time.monotonic() - last_status >= self.status_interval_s:
                self._emit(self.catalog.telemetry, self._status("starting"), self.me.worker_id)
                await self._flush_and_commit()
                last_status = time.monotonic()
        return items, end

    async def _serve(self, typed: TypedConsumer, control: TypedConsumer, stop: asyncio.Event) -> None:
        last_status = 0.0
        backlog, end = await self._backlog(typed, stop)
        while not stop.is_set():
            holding = backlog is not None and await self.dispatch.position(self.partition) < end
            if holding:
                # A backlog cut short: read on, starting none of it (a dispatch's supersede may
                # lie further on: started, it ran a second time), taking no command (a drain
                # waits until the backlog is taken), and saying "starting" (no router places
                # work here).
                backlog += await typed.fetch(self._wait_ms())
            elif self.mode != "serving":  # drained or asleep: the partition read for its cancels
                self._take_cancellations(await typed.fetch(self._wait_ms(), dead_letter=False)
                                         + await self._read_after_a_stall(typed, False))
                await self._fail_unanswerable()
                await self._obey(control)
                await self._take_after_commands(typed)
            else:
                items, backlog = (backlog, None) if backlog is not None else (
                    await typed.fetch(self._wait_ms()), None)
                await self._take(items + await self._read_after_a_stall(typed), typed)
                await self._obey(control)
                await self._take_after_commands(typed)
            self._step()
            self._keep_drain_deadline()
            if time.monotonic() - last_status >= self.status_interval_s or \
                    self._engine_state != self._state_reported:
                self._emit(self.catalog.telemetry, self._status("starting" if holding else None),
                           self.me.worker_id)
                last_status = time.monotonic()
            await self._flush_and_commit()

    async def _obey(self, control: TypedConsumer) -> None:
        """Carry out the commands that came, then stop or start taking work as they say: a
        worker that wakes reads its partition again from where it stopped taking work."""
        await take_on_added(control.consumer)
        refused = []
        items = await control.fetch(0)
        await self._learn_declared_models([item.message for item in items])
        for item in items:
            why = self._on_command(item.message)
            if why is not None:
                logger.warning("worker %s %s", self.me.worker_id, why)
                refused.append((item.record, DecodeError(
                    "unprocessable", f"worker {self.me.worker_id} {why}")))
        if refused:  # dead-lettered, so that `governor report actions` says it did not hold
            await control.dead_letter(refused)
        control.take_dead_lettered()  # (commands are not committed: nothing to track)
        if self.mode != "serving" and self._paused_at is None:
            self._paused_at = await self.dispatch.position(self.partition)
        elif self.mode == "serving" and self._paused_at is not None:
            self.dispatch.seek(self.partition, self._paused_at)
            self._paused_at = None

    async def _take_after_commands(self, typed: TypedConsumer) -> None:
        """What a read after a stall (``_read_after_a_stall``) finds past the commands just
        obeyed, taken as they left the worker: drained or asleep, only the cancellations of what
        it runs (a wake reads the rest again from where it stopped taking work); serving, all
        of it. Before, the serving loop started what it found past a drain (and the wake, reading
        it again, took it for a redelivery and let the commit pass it while it ran), and the
        drained loop skipped the dispatches it found past a wake (and the commit passed them)."""
        if self.mode == "serving":
            if late := await self._read_after_a_stall(typed):
                await self._take(late, typed)
        else:
            self._take_cancellations(await self._read_after_a_stall(typed, False))

    async def _learn_declared_models(self, messages: list[Message]) -> None:
        """Before a ``load_model`` to this worker of a model it does not know is refused, the
        models the configuration declares (the setting ``models``), read again
        (``models.DeclaredReads``): a worker started with a built-in model never read them, and
        refused a declared one the CLI had let pass. For at most ``READ_MODELS_S`` (the serving
        loop waits that long at worst); a read that fails or takes longer leaves the model
        unknown."""
        if hasattr(self.engine, "load_model"):
            await self._declared.learn(
                (m.model for m in messages if isinstance(m, commands.LoadModel)
                 and m.worker_id == self.me.worker_id), self._read_declared_models)

    async def _read_declared_models(self, unknown: set[str]) -> None:
        await declare_models(current_config(self.bootstrap, self.catalog, refuse=False),
                             READ_MODELS_S, unknown, f"worker {self.me.worker_id}", logger)

    async def _drain_then_hand_back(self, typed: TypedConsumer) -> None:
        """Stop taking work; let what runs finish for a while, still ending what is cancelled
        or recalled meanwhile; hand back what is left."""
        self.mode = "draining"
        deadline = time.monotonic() + self.drain_timeout_s
        last_status = 0.0
        while self._running and time.monotonic() < deadline and not self._handing_back:
            # (waits for the engine's next step, at most a tick)
            items = await typed.fetch(self._wait_ms(), dead_letter=False)
            self._take_while_stopping(items + await self._read_after_a_stall(typed, False))
            await self._fail_unanswerable()
            self._take_while_stopping(await self._read_after_a_stall(typed, False))
            self._step()
            if time.monotonic() - last_status >= self.status_interval_s:
                # still heart-beating (draining): else the router takes it for dead after 3 s
                # and resumes elsewhere the requests it is finishing
                self._emit(self.catalog.telemetry, self._status(), self.me.worker_id)
                last_status = time.monotonic()
            await self._flush_and_commit()
        handed_back = 0
        for rid, running in list(self._running.items()):
            if self.engine.abort(rid):  # (one its engine has just finished ends as usual below)
                del self._running[rid]
                self._hand_back(running.dispatch, running.tokens_flushed,
                                "worker stopped before the request finished")
                handed_back += 1
        self._step()  # (before, a finished one was handed back too, its last tokens unsent)
        logger.info("worker %s handed back %d requests", self.me.worker_id, handed_back)

    def hand_back_now(self) -> None:
        """Stopping (a second SIGTERM or Ctrl-C), end the drain at its next tick: what still
        runs is handed back at once, not finished for up to ``drain_timeout_s`` (a whole stack
        that stops, ``Stack.stop``, gives its workers a few seconds, not 30)."""
        self._handing_back = True

    def _take_while_stopping(self, items: list) -> None:
        self._take_cancellations(items)
        self._hand_back_unstarted(items)

    async def _read_after_a_stall(self, typed: TypedConsumer, dead_letter: bool = True) -> list:
        """What the slot's partition holds up to its end now, if this worker stood still for
        ``STALL_S`` since its engine last stepped and since such a read last began (else
        nothing): the routers, hearing nothing from it, may have continued its requests
        elsewhere and superseded them here, and its engine, stepped first over the whole pause,
        completed them a second time (a worker SIGSTOPped for 12 s under ``governor up``: 4
        requests with two ``Completed`` each). Read for at most ``STALL_READ_S``: what is left
        is read as usual. The loops read so after each fetch and again just before the engine
        steps: a pause lands on any await between the two (obeying a command, checking a reply
        topic), and one there was stepped over (``demo --fault pause:1:8@6``: 3 requests with
        two ``Completed`` each, tests/unit/workers/test_worker_stall.py)."""
        stalled_s = time.monotonic() - max(self._last_step, self._stall_read_at)
        if stalled_s < STALL_S:
            return []
        self._stall_read_at = time.monotonic()
        try:  # (a stall may be the broker's: its end is not waited for past the bound)
            async with asyncio.timeout(STALL_READ_S):
                end = (await self.dispatch.end_offsets([self.partition]))[self.partition]
        except (TimeoutError, KafkaError) as exc:
            logger.warning("worker %s stood still %.1f s and could not learn its slot's end "
                           "(%s): it reads on as usual", self.me.worker_id, stalled_s, exc)
            return []
        items: list = []
        deadline = time.monotonic() + STALL_READ_S
        while await self.dispatch.position(self.partition) < end and time.monotonic() < deadline:
            items += await typed.fetch(200, dead_letter=dead_letter)
        return items

    async def _take(self, items: list, typed: TypedConsumer) -> None:
        """Start the dispatches among ``items`` (fetched from the slot's partition) that no
        cancellation among them recalls or supersedes, and act on those cancellations."""
        gone = await self._fail_unanswerable(items)
        recalled = _recalled(item.message for item in items)
        for item in items:
            cancel = recalled.get(_key(item.message))
            if cancel is not None:  # cancelled further on: never start it
                self._offsets.passed(item.record.offset)
                if cancel.recalls:  # the router waits for it back
                    self._hand_back(item.message, item.message.resume_from_token, cancel.reason)
                continue
            self._on_dispatch(item.message, item.record.offset, gone)
        # Done with, not read again; after the valid records they came with, which the offset
        # tracker must see first (it takes an offset below one it has seen for a redelivery,
        # and would not track a dispatch behind a bad record).
        for _partition, offset in typed.take_dead_lettered():
            self._offsets.passed(offset)

    def _take_cancellations(self, items: list) -> None:
        """While the worker takes no work (drained, asleep, stopping): act on the cancellations
        among ``items`` of the requests it runs, and on nothing else. Neither these nor the
        dispatches among ``items`` are tracked for the commit: a wake reads them again (a
        dispatch is started then; a cancellation read again finds its request ended), and a
        worker that stops leaves them uncommitted to the next one on the slot."""
        for item in items:
            if isinstance(item.message, CancelRequest):
                self._on_cancel(item.message)

    def _hand_back_unstarted(self, items: list) -> None:
        """Stopping: hand back at once the dispatches among ``items`` (read from the slot's
        partition) that this worker will not start, those placed before the router heard it
        drain, so that the router continues them elsewhere now rather than once the worker has
        stopped (up to its drain timeout). A dispatch a cancellation among them supersedes is
        not (the router has moved it already); a recalled one is, as when serving. They stay
        uncommitted: the router's supersede follows each for a next worker on the slot."""
        recalled = _recalled(item.message for item in items)
        for item in items:
            message = item.message
            if not isinstance(message, Dispatch):
                continue
            rid = message.request.request_id
            if rid in self._running or message.attempt <= self._finished.get(rid, 0):
                continue  # (its own, read again)
            cancel = recalled.get(_key(message))
            if cancel is not None and not cancel.recalls:
                continue
            self._hand_back(message, message.resume_from_token,
                            cancel.reason if cancel is not None else
                            f"{self.me.worker_id} is stopping: not started there")

    def _wait_ms(self) -> int:
        """How long to wait for input: until the engine's next event, at most one tick."""
        wait = self.max_tick_s
        due = self.engine.next_event_s()
        if due is not None:
            wait = min(wait, max(0.0, (due - self.engine_now()) / self.speedup))
        return int(wait * 1000)

    def _step(self) -> None:
        now = time.monotonic()
        decoding = getattr(self.engine, "decoding", None)
        busy = decoding() if decoding is not None else self.engine.stats().running
        elapsed = (now - self._last_step) * self.speedup  # engine time
        self._seq_seconds += busy * elapsed
        self._decode_seconds += elapsed if busy else 0.0
        self._last_step = now
        for batch in self.engine.advance(self.engine_now()):
            self._tokens += batch.count
            self._on_tokens(batch)
        drain = getattr(self.engine, "drain_kv_events", None)
        if drain is not None:
            stored, evicted = drain()
            self._emit_kv(stored, evicted)
        stats = self.engine.stats()
        self.metrics.observe_stats(stats)
        self._engine_state = stats.state

    async def _fail_unanswerable(self, items: Iterable = ()) -> set[str]:
        """The reply_to topics of the running requests and of the dispatches in ``items`` that
        no longer exist. The running requests that reply to one fail (``invalid_request``):
        their chunks have nowhere to go, and a send to a missing topic would hold this worker up
        for the producer's request timeout and then stop it, and again after every restart."""
        topics = {r.dispatch.request.reply_to for r in self._running.values()}
        topics.update(i.message.request.reply_to for i in items if isinstance(i.message, Dispatch))
        topics.discard(None)
        # A topic this worker has not sent to is checked against a list at most a second old:
        # a request replying to a missing topic is better failed before it starts than when its
        # first send has waited a second for the topic's metadata (the outbox then gives it up,
        # ``_vanished``). A send to one deleted since it was listed fails, or the outbox stops
        # waiting for its acknowledgement after a second.
        known = self.producer.client.cluster.partitions_for_topic
        gone = {topic for topic in topics
                if not await self._reply_topics.exist(topic, fresh=known(topic) is None)}
        self._fail_replying_to(gone)
        return gone

    async def _vanished(self, topics: set[str]) -> set[str]:
        """The reply topics among ``topics`` that the broker no longer has."""
        replies = topics - set(self.catalog.topics())
        return {t for t in replies if not await self._reply_topics.exist(t, fresh=True)}

    def _fail_replying_to(self, gone: set[str], refused: dict[str, str] | None = None) -> None:
        """Fail the running requests that reply to a topic in ``gone`` (deleted), or whose
        records to their reply topic the broker refused (``refused``: request id -> its error; a
        topic that exists may refuse some records only, those over its size limit), and make the
        producer forget the gone topics (else it asks for them at every metadata refresh)."""
        for topic in gone:
            forget_topic(self.producer, topic)
        for rid, running in list(self._running.items()):
            req = running.dispatch.request
            why = _why_unanswerable(req, gone, refused or {})
            if why is not None:
                logger.warning("worker %s: %s fails: %s", self.me.worker_id, rid, why)
                self.engine.abort(rid)  # if it has just finished, its last tokens are dropped
                del self._running[rid]
                self._finish(running.offset, "failed")
                self._remember(rid, running.dispatch.attempt)
                self._emit_event(Failed(
                    event_time_ms=now_ms(), **about(req), worker_id=self.me.worker_id,
                    attempt=running.dispatch.attempt, reason="invalid_request", detail=why))

    def _on_cancel(self, cancel: CancelRequest) -> None:
        """End the request ``cancel`` is for (a recall, naming its attempt: hand it back) if it
        runs here; a cancellation of an attempt not running here does nothing."""
        running = self._running.get(cancel.request_id)
        if running is None and cancel.attempt is not None and not cancel.recalls:
            self._drop_end(cancel)
        if running is None or (cancel.attempt is not None
                               and cancel.attempt != running.dispatch.attempt):
            return
        if not self.engine.abort(cancel.request_id):
            # It has just finished: its last tokens end it as usual; but superseded, not with
            # an end of its own (``_drop_end``). (Before, it completed, and the router, reading
            # an earlier attempt's Completed, cancelled the continuation it had made.)
            running.superseded |= cancel.attempt is not None and not cancel.recalls
            return
        del self._running[cancel.request_id]
        recalled = cancel.attempt is not None
        self._finish(running.offset, "handed back" if recalled else "cancelled")
        self._remember(cancel.request_id, running.dispatch.attempt)
        if recalled:  # recalled: hand it back, it lives on elsewhere
            self._hand_back(running.dispatch, running.tokens_flushed, cancel.reason)
            return
        self._end_stream(running.dispatch, running.tokens_done, "abort")
        self._emit_event(Cancelled(
            event_time_ms=now_ms(), **about(running.dispatch.request), reason=cancel.reason,
            worker_id=self.me.worker_id, attempt=running.dispatch.attempt,
        ))

    def _drop_end(self, supersede: CancelRequest) -> None:
        """The router superseded an attempt whose end is not sent yet (``_flush_and_commit``):
        it has ended the request or continued it elsewhere, and an end sent now would be a
        second one. The dispatch is done with all the same."""
        for ends in (self._ending, self._streamed):
            for entry in ends:
                if self._taken.get(entry[0]) == (supersede.request_id, supersede.attempt):
                    ends.remove(entry)
                    self._finish(entry[0], "superseded")
                    return

    def _end_streamed(self) -> None:
        """Emit the ends of the requests whose last chunks are on the broker."""
        for offset, ended, _ in self._streamed:
            self._finish(offset)
            self._emit_event(ended)
            if isinstance(ended, Completed):  # (not one its engine failed, nor one failed
                self._completed += 1          # meanwhile for its reply topic)
        self._streamed = []

    def _on_dispatch(self, message: Message, offset: int, gone: set[str] = frozenset()) -> None:
        if isinstance(message, CancelRequest):
            self._offsets.passed(offset)
            self._on_cancel(message)
            return
        assert isinstance(message, Dispatch)
        req = message.request
        running = self._running.get(req.request_id)
        if running is not None or message.attempt <= self._finished.get(req.request_id, 0):
            if running is not None and message.attempt > running.dispatch.attempt:
                # continued here as its engine finished it, superseded: its attempt ends it
                # after all (else neither would), and the router drops the continuation
                running.superseded = False
            logger.info("dropping redelivered dispatch of %s", req.request_id)
            self._offsets.passed(offset)
            return
        if req.model not in self.models:  # sent before a model switch: serve it elsewhere
            self._offsets.passed(offset)
            self._hand_back(message, message.resume_from_token,
                            f"{self.me.worker_id} serves {', '.join(self.models)} now")
            return
        self._offsets.taken(offset)
        self._taken[offset] = (req.request_id, message.attempt)
        common = dict(event_time_ms=now_ms(), **about(req), worker_id=self.me.worker_id)
        # (the router refuses a request replying to an internal topic: a dispatch that names
        # one was not placed by a router, and its chunks would land among the internal records)
        refusal = self.catalog.internal_reply_topic(req.reply_to) or (
            _no_reply_topic(req.reply_to) if req.reply_to in gone else None)
        if refusal is None:
            try:
                self.engine.add(EngineRequest(
                    request_id=req.request_id, prompt_tokens=req.prompt_tokens,
                    max_tokens=req.max_tokens, resume_from_token=message.resume_from_token,
                    prefix_hashes=tuple(req.prefix_hashes), hash_block_size=req.block_size,
                ), self.engine_now())
            except CapacityError as exc:
                refusal = str(exc)
        if refusal is not None:
            self._finish(offset, "failed")
            if not (req.reply_to in gone or self.catalog.internal_reply_topic(req.reply_to)):
                self._end_stream(message, message.resume_from_token, "error")
            self._emit_event(Failed(**common, attempt=message.attempt, reason="invalid_request",
                                    detail=refusal))
            self._remember(req.request_id, message.attempt)
            return
        self._running[req.request_id] = _Running(message, offset, message.resume_from_token)
        self._emit_event(Started(**common, attempt=message.attempt))

    def _on_tokens(self, batch: TokenBatch) -> None:
        running = self._running.get(batch.request_id)
        if running is None:
            return
        dispatch, req = running.dispatch, running.dispatch.request
        stamp = now_ms()
        tokens = list(batch.tokens)
        # The engine's trouble, not the request's (its server died, say): handed back to go on
        # elsewhere, its stream not ended
        handed_back = batch.failure is not None and batch.failure.kind == "retryable"
        final = batch.finished and not handed_back
        for start in range(0, len(tokens) if handed_back else max(len(tokens), 1),
                           MAX_CHUNK_TOKENS):
            part = tokens[start:start + MAX_CHUNK_TOKENS]
            last = final and start + MAX_CHUNK_TOKENS >= len(tokens)
            self._emit_to_stream(dispatch, ResponseChunk(
                event_time_ms=stamp, request_id=req.request_id, worker_id=self.me.worker_id,
                attempt=dispatch.attempt, token_offset=batch.token_offset + start, tokens=part,
                final=last, finish_reason=batch.finish_reason if last else None,
            ))
        running.tokens_done = batch.token_offset + batch.count
        self.metrics.observe_tokens(batch.count)
        running.last_token_s = self.metrics.observe_token_gaps(batch, running.last_token_s,
                                                               self.speedup)
        common = dict(event_time_ms=stamp, **about(req), worker_id=self.me.worker_id,
                      attempt=dispatch.attempt)
        if batch.first:
            ttft_s = max(0, stamp - req.created_ms) / 1000
            # (a continuation is prompted with the tokens streamed before, and its client had
            # its first token if there were any)
            self.metrics.observe_prefilled(req.prompt_tokens + dispatch.resume_from_token)
            if dispatch.resume_from_token == 0:
                self.metrics.observe_first_token(ttft_s)
            self._emit_event(FirstToken(**common, ttft_s=ttft_s,
                                        tokens_done=dispatch.resume_from_token))
        if handed_back:
            del self._running[req.request_id]
            self._finish(running.offset, "handed back")
            self._hand_back(dispatch, running.tokens_flushed,
                            batch.failure.detail[:MAX_REASON_CHARS], engine_failed=True)
        elif batch.finished:
            e2e_s = max(0, stamp - req.created_ms) / 1000
            reason = batch.finish_reason or "length"
            self.metrics.observe_finished(e2e_s, reason)
            if reason in ("stop", "length"):
                ended: Message = Completed(
                    **common, prompt_tokens=req.prompt_tokens, output_tokens=running.tokens_done,
                    cached_tokens=min(batch.cached_tokens, req.prompt_tokens),
                    finish_reason=reason, e2e_s=e2e_s)
            else:  # the engine gave up on the request (an HTTP error from vLLM, an abort)
                failure = batch.failure or EngineFailure(
                    "engine_error", f"engine finished the stream with {reason!r}")
                ended = Failed(**common, reason=failure.kind,
                               detail=failure.detail[:MAX_REASON_CHARS])
            # Its supersede and terminal event go out once a flush has taken its last chunks
            # (the next flush): sent together, the broker could take them and not a chunk, and
            # the client's stream would end with a gap that nobody would ever fill.
            if running.superseded:  # the router has moved on: done with, no end sent
                self._finish(running.offset, "superseded")
            else:
                self._ending.append((running.offset, ended, req))
            del self._running[req.request_id]
            self._remember(req.request_id, dispatch.attempt)

    def _on_command(self, command: Message) -> str | None:
        """Carry out a command to this worker; return why not where it cannot (``_obey``
        dead-letters it), else None."""
        if getattr(command, "worker_id", None) != self.me.worker_id:
            return None
        logger.info("worker %s: %s (%s)", self.me.worker_id, command.type, command.reason)
        match command:
            case commands.DrainWorker(deadline_ms=deadline):  # (the partition: see ``_obey``)
                self.mode = "draining"
                self._drain_deadline_ms = deadline
            case commands.SleepWorker(level=0):
                self.mode = "serving"
                self._drain_deadline_ms = None
            case commands.SleepWorker():
                self.mode = "sleeping"
            case commands.LoadModel(model=model):
                return self._load_model(model)
            case commands.InjectFault(fault="crash"):
                os.kill(os.getpid(), signal.SIGKILL)  # a crash is a crash: no goodbye
            case commands.InjectFault(fault="slow", factor=factor) if hasattr(self.engine,
                                                                              "slow_down"):
                self.engine.slow_down(factor)
            case commands.InjectFault(fault="stall", duration_s=duration) if hasattr(self.engine,
                                                                                   "stall"):
                self.engine.stall(self.engine_now() + duration * self.speedup)
            case commands.InjectFault():
                return f"cannot inject {command.fault}: its engine has no such fault"
        return None

    def _load_model(self, model: str) -> str | None:
        """Load ``model`` on the engine; or why it cannot, the worker serving its own."""
        from workers.sim.perf import PerfModel

        load = getattr(self.engine, "load_model", None)
        if load is None:
            return f"cannot load {model} on its engine (it serves the model it was started with)"
        if self._running:
            return (f"cannot load {model} while it runs {len(self._running)} requests "
                    "(drain it first)")
        perf = self.engine.perf
        try:
            models.check_spelling(model)  # (it would report a name no request has)
            load(PerfModel.load(perf.gpu.name, model, perf.tp), self.engine_now())
        except ValueError as exc:  # unknown, misspelt or too big: it keeps serving its own
            return f"cannot load {model}: {exc}"
        self.models = [model]
        if self.me.pool == pool_name(self.me.gpu_type, self.me.model):  # its GPU and model
            self.me = replace(self.me, pool=pool_name(self.me.gpu_type, model), model=model)
        self.metrics.switch_model(model)
        return None

    def _status(self, state: str | None = None) -> WorkerStatus:
        stats = self.engine.stats()
        self._state_reported = stats.state
        if state is None:  # (drained or asleep while its engine loads: so it says, as the
            # autoscaler counts every worker but a draining one as serving; a crash is told)
            state = stats.state if self.mode == "serving" or stats.state == "crashed" else self.mode
        return WorkerStatus(
            event_time_ms=now_ms(), worker_id=self.me.worker_id, slot=self.me.slot,
            pool=self.me.pool, gpu_type=self.me.gpu_type, gpus=stats.gpus,
            models_loaded=self.models,
            state=state, kv_blocks_used=stats.kv_blocks_used, kv_blocks_free=stats.kv_blocks_free,
            running=stats.running, waiting=stats.waiting,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits, preemptions=stats.preemptions,
            prefill_backlog_tokens=stats.prefill_backlog_tokens,
            prefill_context_tokens=stats.prefill_context_tokens,
            max_model_len=stats.max_model_len, requests_completed=self._completed,
            started_ms=self._started_ms,
            reply_progress=self._reply_progress(),
            **self._take_interval(stats),
        )

    def _reply_progress(self) -> list[StreamProgress]:
        """How far the streams to clients' own topics have gone (the router reads the
        responses topic only): as of the last flush the broker took in full, so a chunk still
        on its way (to another topic than the heartbeat's) is not counted as the client's."""
        progress = [StreamProgress(request_id=rid, attempt=r.dispatch.attempt,
                                   tokens_sent=r.tokens_flushed)
                    for rid, r in self._running.items() if r.dispatch.request.reply_to]
        return progress[:MAX_MAP_ENTRIES]

    def _take_interval(self, stats: EngineStats) -> dict:
        """The figures a status reports about the time since the previous one."""
        interval = interval_report(self._seq_seconds, self._tokens, self._work_reported, stats,
                                   decode_seconds=self._decode_seconds)
        self._work_reported = (stats.steps, stats.prefilled_tokens)
        self._seq_seconds, self._decode_seconds, self._tokens = 0.0, 0.0, 0
        return interval

    def _emit_kv(self, stored: list[int], evicted: list[int]) -> None:
        """KV events of the engine's prefix cache: stored hashes by the tokens each stands for."""
        stamp, key = now_ms(), self.me.worker_id
        for unit, hashes in self.engine.kv.by_unit(stored).items():
            for i in range(0, len(hashes), MAX_PREFIX_BLOCKS):
                self._emit(self.catalog.kv, KvBlocksStored(
                    event_time_ms=stamp, worker_id=key, block_size=unit,
                    block_hashes=hashes[i:i + MAX_PREFIX_BLOCKS]), key)
        for i in range(0, len(evicted), MAX_PREFIX_BLOCKS):
            self._emit(self.catalog.kv, KvBlocksEvicted(
                event_time_ms=stamp, worker_id=key, block_hashes=evicted[i:i + MAX_PREFIX_BLOCKS]), key)

    def _finish(self, offset: int, how: str = "finished") -> None:
        """The dispatch at ``offset`` ends (its terminal event is emitted next). Until the commit
        passes it (not before the next flush; never while an earlier dispatch still runs), a
        worker that takes the slot over after a crash would read it again: a supersede of it on
        the slot's partition, sent ahead of its terminal event, tells that worker not to run it
        a second time. (Should the supersede reach the broker and the terminal event not, the
        router resumes the request elsewhere, as any request of a dead worker.)"""
        request_id, attempt = self._taken.pop(offset)
        self.outbox.emit(self.catalog.dispatch, CancelRequest(
            event_time_ms=now_ms(), request_id=request_id, attempt=attempt,
            reason=f"superseded: {how} on {self.me.worker_id}"), request_id,
            partition=self.me.slot)
        self._finishing.append(offset)

    def _keep_drain_deadline(self) -> None:
        """Past a drain's deadline, what still runs is handed back to the router (which
        continues it elsewhere), so that the worker is empty by then."""
        if self._drain_deadline_ms is None or now_ms() < self._drain_deadline_ms:
            return
        self._drain_deadline_ms = None
        for rid, running in list(self._running.items()):
            if self.engine.abort(rid):  # (one that has just finished ends as usual)
                del self._running[rid]
                self._finish(running.offset, "handed back")
                self._hand_back(running.dispatch, running.tokens_flushed,
                                "the worker's drain deadline passed")

    def _hand_back(self, dispatch: Dispatch, tokens_done: int, why: str,
                   engine_failed: bool = False) -> None:
        """Give an attempt back to the router, which continues it from ``tokens_done`` (its
        ``tokens_flushed``: a chunk not yet taken by the broker may never reach the client, and
        a reader takes the continuation's chunks over the old attempt's from their offset).
        ``engine_failed``: the engine's trouble, not the worker stopping (its breaker counts it)."""
        self._remember(dispatch.request.request_id, dispatch.attempt)
        self._emit_event(Requeued(
            event_time_ms=now_ms(), **about(dispatch.request), worker_id=self.me.worker_id,
            attempt=dispatch.attempt, tokens_done=tokens_done, detail=why,
            engine_failed=engine_failed))

    def _remember(self, request_id: str, attempt: int) -> None:
        self._finished[request_id] = max(attempt, self._finished.get(request_id, 0))
        if len(self._finished) > _REMEMBERED:
            self._finished.popitem(last=False)

    def _emit_event(self, event: Message) -> None:
        self._emit(self.catalog.telemetry, event, event.request_id)

    def _end_stream(self, dispatch: Dispatch, token_offset: int,
                    finish_reason: FinishReason) -> None:
        """A request that ends here other than in an answer: its stream ends too."""
        self._emit_to_stream(dispatch, stream_end(
            dispatch.request.request_id, self.me.worker_id, token_offset, finish_reason, now_ms(),
            dispatch.attempt))

    def _emit_to_stream(self, dispatch: Dispatch, chunk: ResponseChunk) -> None:
        """A record of a request's stream: to its reply topic, on the partition the router
        pinned the stream to (``Dispatch.stream_partition``), where every other record of it
        goes, whatever partitions were added to the topic since."""
        req, pin = dispatch.request, dispatch.stream_partition
        self.outbox.emit(req.reply_to or self.catalog.responses, chunk, req.request_id,
                         partition=None if pin is None else StreamPartition(pin))

    def _emit(self, topic: str, message: Message, key: str) -> None:
        self.outbox.emit(topic, message, key)

    async def _flush_and_commit(self) -> None:
        """Send what was emitted; once acknowledged, commit past the finished dispatches. A
        flush that fails leaves the dispatches it would have finished uncommitted (the outbox
        does not send its messages again): after a restart they are read and run again.
        The ends of the requests whose last chunks an earlier flush took go with it, emitted
        only now: the loop has read its slot since (again after a stall), where a supersede of
        such a request drops its end (``_drop_end``). Before, they were emitted as the flush
        of their chunks returned, and a worker paused in that flush sent them once it ran again,
        after the router, hearing nothing and holding the whole stream, had completed the
        request on its behalf: two ``Completed`` of one attempt (``demo --fault pause:1:8@6``;
        ``tests/unit/workers/test_worker_stall.py``)."""
        self._end_streamed()
        finishing, self._finishing = self._finishing, []
        try:
            await self.outbox.flush()
        except Undelivered as exc:
            if exc.topics & set(self.catalog.topics()):
                raise  # the broker refused one of Governor's own topics
            # A client's reply topic, deleted since it was listed, or refusing this worker's
            # writes (its message size, its ACLs, too few in-sync replicas): the requests that
            # reply there fail, not this worker (which would read them again after a restart).
            gone = await self._vanished(exc.topics)
            refused = {key: _refused_reply_topic(topic, error)
                       for topic, key, error in exc.failed if topic not in gone}
            self._fail_replying_to(gone, refused)
            ending = []
            for offset, ended, req in self._ending:  # ended: did its last tokens get through?
                why = _why_unanswerable(req, gone, refused)
                if why is not None:
                    ended = Failed(event_time_ms=now_ms(), **about(req), reason="invalid_request",
                                   worker_id=self.me.worker_id,
                                   attempt=getattr(ended, "attempt", None), detail=why)
                ending.append((offset, ended, req))
            self._ending = ending
            self.outbox.forgive(exc.topics)  # dealt with
            await self.outbox.flush()  # their failures
            finishing, self._finishing = finishing + self._finishing, []
        for running in self._running.values():  # (nothing is emitted while the flush waits)
            running.tokens_flushed = running.tokens_done
        self._streamed += self._ending  # (emitted before the flush: it took their chunks)
        self._ending = []
        for offset in finishing:
            self._offsets.finished(offset)
        position = self._offsets.committable()
        if position is not None and position != getattr(self, "_committed", None):
            await self.dispatch.commit({self.partition: position})
            self._committed = position
