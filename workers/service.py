"""The worker process: one GPU slot, its dispatch partition, an engine, and what it reports.

It reads its own partition of ``governor.dispatch`` (manual assignment; the slot is announced in
every WorkerStatus), runs the engine in real time (``speedup`` runs the engine's clock faster),
streams ResponseChunks, publishes lifecycle events and a status heartbeat, and commits a dispatch
only after its request reached a terminal state, so a crashed worker's requests are read again.
"""

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from schemas.base import Message
from schemas.events import Cancelled, Completed, FirstToken, Started, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, ResponseChunk
from schemas.topics import TopicCatalog
from workers.engine import Engine, EngineRequest, TokenBatch
from workers.offsets import OffsetTracker

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


class WorkerService:
    def __init__(
        self,
        bootstrap: str,
        catalog: TopicCatalog,
        identity: WorkerIdentity,
        engine: Engine,
        *,
        speedup: float = 1.0,
        tick_s: float = 0.05,
        status_interval_s: float = 0.5,
    ) -> None:
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.me = identity
        self.engine = engine
        self.speedup = speedup
        self.tick_s = tick_s
        self.status_interval_s = status_interval_s
        self._running: dict[str, _Running] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._offsets = OffsetTracker()
        self._completed = 0
        self._started_ms = now_ms()
        self._t0 = time.monotonic()
        self._finishing: list[int] = []  # offsets whose terminal event awaits acknowledgement

    def engine_now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    async def run(self, stop: asyncio.Event) -> None:
        partition = TopicPartition(self.catalog.dispatch, self.me.slot)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=f"{self.catalog.namespace}.worker-{self.me.slot}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.producer = make_producer(self.bootstrap)
        self.outbox = Outbox(self.producer)
        await self.producer.start()
        await consumer.start()
        consumer.assign([partition])
        typed = TypedConsumer(consumer, self.catalog, self.producer, self.me.worker_id)
        last_status = 0.0
        committed: int | None = None
        logger.info("worker %s serving slot %d", self.me.worker_id, self.me.slot)
        try:
            batches = typed.batches(timeout_ms=int(self.tick_s * 1000))
            while not stop.is_set():
                for item in await anext(batches):
                    self._on_message(item.message, item.record.offset)
                for batch in self.engine.advance(self.engine_now()):
                    self._on_tokens(batch)
                if time.monotonic() - last_status >= self.status_interval_s:
                    self._emit(self.catalog.telemetry, self._status(), self.me.worker_id)
                    last_status = time.monotonic()
                await self._flush()
                position = self._offsets.committable()
                if position is not None and position != committed:
                    await consumer.commit({partition: position})
                    committed = position
        finally:
            self._emit(self.catalog.telemetry, self._status("stopped"), self.me.worker_id)
            await self._flush()
            await consumer.stop()
            await self.producer.stop()

    def _on_message(self, message: Message, offset: int) -> None:
        if isinstance(message, CancelRequest):
            self._offsets.taken(offset)
            self._offsets.finished(offset)
            running = self._running.pop(message.request_id, None)
            if running is not None and self.engine.abort(message.request_id):
                self._finishing.append(running.offset)
                self._remember(message.request_id)
                req = running.dispatch.request
                self._emit_event(Cancelled(
                    event_time_ms=now_ms(), request_id=req.request_id, task_id=req.task_id,
                    tenant=req.tenant, model=req.model, reason=message.reason,
                    worker_id=self.me.worker_id,
                ))
            return
        assert isinstance(message, Dispatch)
        req = message.request
        if req.request_id in self._running or req.request_id in self._finished:
            logger.info("dropping redelivered dispatch of %s", req.request_id)
            return
        self._offsets.taken(offset)
        self._running[req.request_id] = _Running(message, offset)
        self.engine.add(
            EngineRequest(
                request_id=req.request_id,
                prompt_tokens=req.prompt_tokens,
                max_tokens=req.max_tokens,
                resume_from_token=message.resume_from_token,
                prefix_hashes=tuple(req.prefix_hashes),
            ),
            self.engine_now(),
        )
        self._emit_event(Started(
            event_time_ms=now_ms(), request_id=req.request_id, task_id=req.task_id,
            tenant=req.tenant, model=req.model, worker_id=self.me.worker_id,
            attempt=message.attempt,
        ))

    def _on_tokens(self, batch: TokenBatch) -> None:
        running = self._running.get(batch.request_id)
        if running is None:
            return
        dispatch, req = running.dispatch, running.dispatch.request
        stamp = now_ms()
        chunk = ResponseChunk(
            event_time_ms=stamp, request_id=req.request_id, worker_id=self.me.worker_id,
            attempt=dispatch.attempt, token_offset=batch.token_offset, tokens=list(batch.tokens),
            final=batch.finished, finish_reason=batch.finish_reason,
        )
        self._emit(req.reply_to or self.catalog.responses, chunk, req.request_id)
        common = dict(
            event_time_ms=stamp, request_id=req.request_id, task_id=req.task_id,
            tenant=req.tenant, model=req.model, worker_id=self.me.worker_id,
            attempt=dispatch.attempt,
        )
        if batch.first:
            self._emit_event(FirstToken(**common, ttft_s=max(0, stamp - req.created_ms) / 1000))
        if batch.finished:
            self._emit_event(Completed(
                **common, prompt_tokens=req.prompt_tokens,
                output_tokens=batch.token_offset + len(batch.tokens),
                finish_reason=batch.finish_reason or "length",
                e2e_s=max(0, stamp - req.created_ms) / 1000,
            ))
            del self._running[req.request_id]
            self._remember(req.request_id)
            self._completed += 1
            self._finishing.append(running.offset)

    def _status(self, state: str = "warm") -> WorkerStatus:
        stats = self.engine.stats()
        return WorkerStatus(
            event_time_ms=now_ms(), worker_id=self.me.worker_id, slot=self.me.slot,
            pool=self.me.pool, gpu_type=self.me.gpu_type, models_loaded=[self.me.model],
            state=state, kv_blocks_used=stats.kv_blocks_used, kv_blocks_free=stats.kv_blocks_free,
            running=stats.running, waiting=stats.waiting,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits, requests_completed=self._completed,
            started_ms=self._started_ms,
        )

    def _remember(self, request_id: str) -> None:
        self._finished[request_id] = None
        if len(self._finished) > _REMEMBERED:
            self._finished.popitem(last=False)

    def _emit_event(self, event: Message) -> None:
        self._emit(self.catalog.telemetry, event, event.request_id)

    def _emit(self, topic: str, message: Message, key: str) -> None:
        self.outbox.emit(topic, message, key)

    async def _flush(self) -> None:
        """Send what was emitted; once acknowledged, finished dispatches become committable."""
        await self.outbox.flush()
        finishing, self._finishing = self._finishing, []
        for offset in finishing:
            self._offsets.finished(offset)
