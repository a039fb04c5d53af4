"""A router whose answers the broker refuses stops without committing the requests they answer:
they are read again, and answered, by the router that reads their partition next. The broker is
real; the worker is represented by the heartbeats it would send."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from controllers.router.service import RouterService
from infra.bus import Outbox, Undelivered, now_ms, partitions, read_back, reading
from schemas.codec import decode
from schemas.events import WorkerStatus
from schemas.requests import Dispatch, InferenceRequest

pytestmark = pytest.mark.integration


def _status(at_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id="worker-0", slot=0,
                        pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                        kv_blocks_free=10_000, started_ms=at_ms - 60_000)


async def _dispatch_record_limit(bootstrap: str, topic: str, limit: str | None) -> None:
    """Set (or, None, remove) the topic's own ``max.message.bytes``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic, {} if limit is None else {"max.message.bytes": limit})])
    finally:
        await admin.close()


async def _scenario(bootstrap, catalog):
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id="refused-dispatch",
                               tenant="acme", prompt_tokens=64, max_tokens=10)
    # The broker takes no record of a Dispatch's size on the dispatch topic (a topic's limit, a
    # leader lost past the producer's retries: any refusal of the router's answer will do).
    await _dispatch_record_limit(bootstrap, catalog.dispatch, "120")
    async with reading(bootstrap, catalog, [catalog.dispatch], "undelivered-test",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        stop = asyncio.Event()

        async def heartbeats():
            while not stop.is_set():
                outbox.emit(catalog.telemetry, _status(now_ms()), "worker-0")
                await outbox.flush()
                await asyncio.sleep(0.5)  # a worker's heartbeat period

        beating = asyncio.create_task(heartbeats())
        outbox.emit(catalog.requests, request, request.request_id, 0)
        await outbox.flush()
        first = RouterService(bootstrap, catalog, router_id="router-0", recovery_window_s=0)
        try:
            async with asyncio.timeout(60):
                with pytest.raises(Undelivered):  # its Dispatch refused: the router stops
                    await first.run(asyncio.Event())
            group = AIOKafkaConsumer(bootstrap_servers=bootstrap,
                                     group_id=f"{catalog.namespace}.router",
                                     enable_auto_commit=False)
            await group.start()
            try:
                committed = await group.committed(TopicPartition(catalog.requests, 0))
            finally:
                await group.stop()
            # what the first router left on the telemetry topic for the request
            async with reading(bootstrap, catalog, [], "undelivered-events",
                               offset_reset="earliest") as events:
                end = await events.consumer.end_offsets(partitions(catalog, [catalog.telemetry]))
                left = [decode(catalog.spec(catalog.telemetry), record.value).type
                        async for record in read_back(events.consumer, catalog.telemetry, 0, end)
                        if record.key == request.request_id.encode()]
            # The broker takes dispatches again; the next router reads the partition.
            await _dispatch_record_limit(bootstrap, catalog.dispatch, None)
            second = RouterService(bootstrap, catalog, router_id="router-1",
                                   recovery_window_s=0)
            running = asyncio.create_task(second.run(stop))
            placed = []
            try:
                async with asyncio.timeout(30):
                    while request.request_id not in placed:
                        assert not running.done(), running.exception()
                        placed += [item.message.request.request_id
                                   for item in await typed.fetch(200)
                                   if isinstance(item.message, Dispatch)]
            except TimeoutError:
                pass
            finally:
                stop.set()
                await asyncio.gather(running, return_exceptions=True)
        finally:
            stop.set()
            await beating
    return committed, placed, left


def test_a_request_whose_dispatch_the_broker_refused_is_not_committed_and_is_placed_again(
        kafka_bootstrap, catalog):
    committed, placed, _ = asyncio.run(_scenario(kafka_bootstrap, catalog))
    assert committed in (None, 0)  # not past the request: the next router reads it again
    assert placed == ["refused-dispatch"]


def test_a_router_sends_no_queued_whose_dispatch_the_broker_refused(kafka_bootstrap, catalog):
    """A Queued without its Dispatch on the broker is a request lost: a router following the
    topics takes it for placed by another and drops it when it is delivered again."""
    _, _, left = asyncio.run(_scenario(kafka_bootstrap, catalog))
    assert "queued" not in left
