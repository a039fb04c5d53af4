"""The router's producer keeps the metadata of the topics it writes after its first send to a
client's reply topic created after it started (``infra.bus.track_topics``), on the real broker.

Until 5 Dec it tracked none of them. A router that sent nothing for its first 5 minutes
(aiokafka's ``metadata_max_age_ms``) knew them from the refresh of every topic that a client
tracking none makes, and its first end of a stream sent to a reply topic that refresh did not
hold (a client's, created since) made aiokafka track that topic alone: the next refresh held it
alone, the router's own topics lost their leaders, and a message to one of them lingering then
(the ``Rejected`` sent after the stream end of a malformed request, in a walkthrough) was
failed at the request timeout, 15 s later, and the router stopped (``Undelivered: could not
deliver to governor.telemetry (key '...'): NotLeaderForPartitionError()``).
"""

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from controllers.router.service import RouterService
from infra.bus import create_topic, delete_topics, now_ms

pytestmark = pytest.mark.integration


async def _after_a_stream_end_to_a_new_topic(bootstrap: str, catalog) -> dict[str, bool]:
    """Whether the router's producer still knows each topic it writes, once it has ended the
    stream of a malformed request on a reply topic created after the router started."""
    stop = asyncio.Event()
    router = RouterService(bootstrap, catalog, no_worker_wait_s=0.2)
    running = asyncio.create_task(router.run(stop))
    reply_to = f"{catalog.namespace}-client-{uuid.uuid4().hex[:6]}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    replies = AIOKafkaConsumer(reply_to, bootstrap_servers=bootstrap,
                               auto_offset_reset="earliest")
    try:
        async with asyncio.timeout(30):  # its producer's periodic refresh, made now: of every
            # topic where it tracks none
            while getattr(router, "producer", None) is None \
                    or router.producer.client.cluster.partitions_for_topic(catalog.telemetry) is None:
                await asyncio.sleep(0.1)
                if getattr(router, "producer", None) is not None:
                    await router.producer.client.force_metadata_update()
        await create_topic(bootstrap, reply_to)
        await producer.start()
        t = now_ms()
        await producer.send_and_wait(catalog.requests, json.dumps({
            "type": "inference_request", "request_id": "bad", "prompt_tokens": -5,
            "max_tokens": 10, "created_ms": t, "event_time_ms": t, "reply_to": reply_to,
        }).encode(), key=b"bad")
        await replies.start()
        async with asyncio.timeout(60):  # its stream's end: the router has sent to the topic
            while not await replies.getmany(timeout_ms=200):
                pass
        cluster = router.producer.client.cluster
        return {topic: cluster.partitions_for_topic(topic) is not None
                for topic in (catalog.telemetry, catalog.dispatch, catalog.responses,
                              catalog.deadletter, catalog.signals)}
    finally:
        await replies.stop()
        await producer.stop()
        stop.set()
        await running
        await delete_topics(bootstrap, [reply_to])


def test_a_stream_end_to_a_new_reply_topic_leaves_the_routers_topics_known(kafka_bootstrap,
                                                                           catalog):
    known = asyncio.run(_after_a_stream_end_to_a_new_topic(kafka_bootstrap, catalog))
    assert known == dict.fromkeys(known, True)
