"""The router process: admits requests and places them on worker slots.

It consumes ``governor.requests`` in a consumer group (several routers split the partitions),
follows worker heartbeats and terminal events on ``governor.telemetry``, publishes ``Queued`` or
``Rejected`` for each request and a ``Dispatch`` to the chosen worker's partition, and commits a
request only after all of that is acknowledged. While no worker is alive it holds the request
(uncommitted) rather than drop it, up to ``no_worker_wait_s``, then rejects it with a reason.
"""

import asyncio
import logging
import time
from collections import OrderedDict

from aiokafka import AIOKafkaConsumer

from controllers.router.admission import Denial, admit
from controllers.router.fleet import FleetView, WorkerView
from controllers.router.round_robin import RoundRobin
from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from schemas.base import Message
from schemas.events import TERMINAL_EVENT_TYPES, Queued, Rejected, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)

_REMEMBERED = 200_000  # request ids kept to drop redelivered requests


class RouterService:
    def __init__(
        self,
        bootstrap: str,
        catalog: TopicCatalog,
        *,
        router_id: str = "router-0",
        heartbeat_timeout_s: float = 3.0,
        no_worker_wait_s: float = 30.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.router_id = router_id
        self.no_worker_wait_s = no_worker_wait_s
        self.fleet = FleetView(int(heartbeat_timeout_s * 1000))
        self.placement = RoundRobin()
        self._in_flight: dict[str, int] = {}  # request_id -> slot
        self._seen: OrderedDict[str, None] = OrderedDict()  # recent request ids, to drop redeliveries
        self._fleet_changed = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        self.producer = make_producer(self.bootstrap)
        self.outbox = Outbox(self.producer)
        requests = AIOKafkaConsumer(
            self.catalog.requests,
            bootstrap_servers=self.bootstrap,
            group_id=f"{self.catalog.namespace}.router",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
        )
        telemetry = AIOKafkaConsumer(
            self.catalog.telemetry, bootstrap_servers=self.bootstrap, auto_offset_reset="latest"
        )
        await self.producer.start()
        await telemetry.start()
        await requests.start()
        follower = asyncio.create_task(self._follow_telemetry(telemetry, stop))
        typed = TypedConsumer(requests, self.catalog, self.producer, self.router_id)
        logger.info("router %s consuming %s", self.router_id, self.catalog.requests)
        try:
            batches = typed.batches()
            while not stop.is_set():
                items = await anext(batches)
                for item in items:
                    await self._on_message(item.message, stop)
                if items:
                    await self.outbox.flush()
                    await requests.commit()
        finally:
            follower.cancel()
            await requests.stop()
            await telemetry.stop()
            await self.producer.stop()

    async def _follow_telemetry(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        typed = TypedConsumer(consumer, self.catalog, self.producer, f"{self.router_id}-telemetry")
        async for items in typed.batches():
            for item in items:
                message = item.message
                if isinstance(message, WorkerStatus):
                    self.fleet.observe(message)
                    self._fleet_changed.set()
                elif message.type in TERMINAL_EVENT_TYPES:
                    self._in_flight.pop(message.request_id, None)

    async def _on_message(self, message: Message, stop: asyncio.Event) -> None:
        if isinstance(message, CancelRequest):
            slot = self._in_flight.get(message.request_id)
            if slot is not None:
                self.outbox.emit(self.catalog.dispatch, message, message.request_id, slot)
            return
        assert isinstance(message, InferenceRequest)
        if message.request_id in self._seen:
            return  # a redelivered request: it already has its Queued or Rejected
        self._seen[message.request_id] = None
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        denial = admit(message, now_ms())
        worker = None if denial else await self._place(message, stop)
        if worker is None:
            denial = denial or Denial(
                "no_capacity", f"no live worker serves {message.model}", retry_after_s=5.0
            )
            self.outbox.emit(self.catalog.telemetry, _rejected(message, denial), message.request_id)
            return
        self.outbox.emit(self.catalog.telemetry, _queued(message), message.request_id)
        dispatch = Dispatch(
            event_time_ms=now_ms(), request=message, worker_id=worker.worker_id,
            slot=worker.slot, router_id=self.router_id,
        )
        self.outbox.emit(self.catalog.dispatch, dispatch, message.request_id, worker.slot)
        self._in_flight[message.request_id] = worker.slot

    async def _place(self, request: InferenceRequest, stop: asyncio.Event) -> WorkerView | None:
        """A live worker for ``request``, waiting for one to appear up to ``no_worker_wait_s``."""
        give_up = time.monotonic() + self.no_worker_wait_s
        while True:
            worker = self.placement.place(self.fleet, request, now_ms())
            left = give_up - time.monotonic()
            if worker is not None or left <= 0 or stop.is_set():
                return worker
            self._fleet_changed.clear()
            try:
                await asyncio.wait_for(self._fleet_changed.wait(), timeout=min(left, 1.0))
            except TimeoutError:
                pass



def _queued(request: InferenceRequest) -> Queued:
    return Queued(
        event_time_ms=now_ms(), request_id=request.request_id, task_id=request.task_id,
        tenant=request.tenant, model=request.model, prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens, priority=request.priority, step=request.step,
        steps_total=request.steps_total, created_ms=request.created_ms,
        deadline_ms=request.deadline_ms,
    )


def _rejected(request: InferenceRequest, denial: Denial) -> Rejected:
    return Rejected(
        event_time_ms=now_ms(), request_id=request.request_id, task_id=request.task_id,
        tenant=request.tenant, model=request.model, reason=denial.reason,
        detail=denial.detail, retry_after_s=denial.retry_after_s,
    )

