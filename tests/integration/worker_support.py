"""Plays the router and a client for one real worker process on slot 0: sends it dispatches
and commands, reads what it publishes."""

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from schemas.events import WorkerStatus
from schemas.requests import Dispatch


def command(cls, **kw):
    """A command of type ``cls`` to worker-0."""
    return cls(event_time_ms=now_ms(), command_id=f"c-{now_ms()}", worker_id="worker-0", **kw)


class Observer:
    """Reads worker-0's telemetry and sends it commands, dispatches and cancellations."""

    def __init__(self, bootstrap, catalog):
        self.bootstrap, self.catalog = bootstrap, catalog
        self.statuses: list[WorkerStatus] = []
        self.events: list = []

    async def __aenter__(self):
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        self.outbox = Outbox(self.producer)
        self.consumer = AIOKafkaConsumer(self.catalog.telemetry, bootstrap_servers=self.bootstrap,
                                         auto_offset_reset="earliest")
        await self.consumer.start()
        self.typed = TypedConsumer(self.consumer, self.catalog, self.producer, "worker-test")
        return self

    async def __aexit__(self, *exc):
        await self.consumer.stop()
        await self.producer.stop()

    async def until(self, condition, timeout_s=60):
        async with asyncio.timeout(timeout_s):
            while not condition():
                for item in await self.typed.fetch(200):
                    m = item.message
                    (self.statuses if isinstance(m, WorkerStatus) else self.events).append(m)

    async def command(self, cmd):
        self.outbox.emit(self.catalog.control, cmd, "worker-0")
        await self.outbox.flush()

    async def dispatch(self, *messages):
        """Dispatches and cancellations, onto the slot's partition in this order."""
        for m in messages:
            key = m.request.request_id if isinstance(m, Dispatch) else m.request_id
            self.outbox.emit(self.catalog.dispatch, m, key, partition=0)
        await self.outbox.flush()

    def state(self):
        return self.statuses[-1].state if self.statuses else None

    def has(self, kind, rid):
        return any(isinstance(e, kind) and e.request_id == rid for e in self.events)

    def kinds(self, request_id: str) -> list[str]:
        """The events of a request, but its first token."""
        return [e.type for e in self.events
                if getattr(e, "request_id", None) == request_id and e.type != "first_token"]

    async def committed(self) -> tuple[int | None, int]:
        """The worker's committed offset on the slot, and the partition's end."""
        partition = TopicPartition(self.catalog.dispatch, 0)
        group = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                 group_id=f"{self.catalog.namespace}.worker-0")
        await group.start()
        try:
            return (await group.committed(partition),
                    (await group.end_offsets([partition]))[partition])
        finally:
            await group.stop()
