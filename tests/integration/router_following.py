"""Helpers of the operator-command and configuration integration tests: a router that follows
the topics, and a topic read to its end."""

import asyncio
import contextlib

from controllers.router.service import RouterService
from infra.bus import Outbox, now_ms, partitions, reading
from schemas.config import ConfigSet
from schemas.events import ConfigApplied


async def applied_by(typed, component: str, key: str) -> None:
    async with asyncio.timeout(60):
        while not any(isinstance(item.message, ConfigApplied) and item.message.key == key
                      and item.message.component.startswith(component)
                      for item in await typed.fetch(200)):
            pass


@contextlib.asynccontextmanager
async def a_router_following(bootstrap, catalog, group: str):
    """A router that has read ``tenants.acme`` (1 request/s) and follows the topics; yields the
    test's reader, the router and its task."""
    async with reading(bootstrap, catalog, [catalog.telemetry], group,
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(), key="tenants.acme",
                                              value={"requests_per_s": 1, "tokens_per_s": 1e6}),
                    "tenants.acme")
        await outbox.flush()
        stop = asyncio.Event()
        router = RouterService(bootstrap, catalog)
        running = asyncio.create_task(router.run(stop))
        try:
            await applied_by(typed, "router", "tenants.acme")
            yield typed, router, running
        finally:
            stop.set()
            await running


async def until(condition, running: asyncio.Task) -> None:
    async with asyncio.timeout(30):
        while not condition():
            assert not running.done(), running.exception()
            await asyncio.sleep(0.05)  # (polling the router's state: a condition)




async def every_record(typed, catalog, topic: str) -> list:
    """Every record of ``topic`` (one partition) up to its end, read by ``typed`` from the
    earliest."""
    (partition,) = partitions(catalog, [topic])
    end = (await typed.consumer.end_offsets([partition]))[partition]
    read = []
    async with asyncio.timeout(30):
        while len(read) < end:
            for batch in (await typed.consumer.getmany(timeout_ms=500)).values():
                read.extend(batch)
    return read
