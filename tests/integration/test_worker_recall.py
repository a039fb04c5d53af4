"""A worker that reads a dispatch and, further on in its partition, the router's recall of that
attempt (the router resumed it elsewhere while no worker ran the slot) does not start it."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from infra.stack import PoolSpec, Stack
from schemas.events import RequestEvent
from schemas.requests import CancelRequest, Dispatch, InferenceRequest

pytestmark = pytest.mark.integration


def _dispatch(request_id: str) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=16)
    return Dispatch(event_time_ms=t, request=request, worker_id="worker-0", slot=0)


async def _scenario(bootstrap, catalog, stack) -> tuple[list[RequestEvent], int | None]:
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)
    # What a new worker on a crashed slot finds: the dispatch of an attempt the router has
    # resumed elsewhere, the recall of that attempt, and a dispatch still to serve.
    recall = CancelRequest(event_time_ms=now_ms(), request_id="recalled", attempt=1,
                           reason="superseded: resumed on worker-1")
    for message, key in ((_dispatch("recalled"), "recalled"), (recall, "recalled"),
                         (_dispatch("served"), "served")):
        outbox.emit(catalog.dispatch, message, key, partition=0)
    await outbox.flush()
    await producer.stop()

    stack.start()  # the worker starts on slot 0 with all three records waiting
    telemetry = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                 auto_offset_reset="earliest")
    await telemetry.start()
    typed = TypedConsumer(telemetry, catalog, make_producer(bootstrap), "recall-test")
    events: list[RequestEvent] = []
    try:
        async with asyncio.timeout(60):
            while not any(e.request_id == "served" and e.type == "completed" for e in events):
                events += [i.message for i in await typed.fetch(200)
                           if isinstance(i.message, RequestEvent)]
        worker_group = AIOKafkaConsumer(bootstrap_servers=bootstrap,
                                        group_id=f"{catalog.namespace}.worker-0")
        await worker_group.start()
        try:
            partition = TopicPartition(catalog.dispatch, 0)
            async with asyncio.timeout(30):  # the commit follows the terminal event's ack
                while ((committed := await worker_group.committed(partition)) or 0) < 3:
                    await asyncio.sleep(0.1)  # polling the broker's committed offset
        finally:
            await worker_group.stop()
        return events, committed
    finally:
        await telemetry.stop()


def test_a_dispatch_recalled_further_on_in_the_same_fetch_is_not_started(
        kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  engine="sim", with_router=False)
    try:
        events, committed = asyncio.run(_scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    assert [e.type for e in events if e.request_id == "recalled"] == []  # no Started, no Requeued
    assert [e.type for e in events if e.request_id == "served"][0] == "started"
    # past the recalled dispatch too: it is finished, not left open (and past the supersede the
    # worker writes behind a dispatch it finished, once it has read it: 4)
    assert committed in (3, 4)
