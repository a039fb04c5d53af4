"""A request whose ``reply_to`` names an internal topic is refused, and nothing is written there.

Until 6 Dec the router refused only its own namespace's topics: a request replying to another
namespace's control, config or dispatch topic, to a streams changelog or to a ``__`` topic was
placed, and its worker wrote its response chunks into that topic. A real router and worker
processes (``Stack``), the test the client.
"""

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import Outbox, create_topic, delete_topics, make_producer, now_ms
from infra.stack import PoolSpec, Stack
from schemas.codec import decode
from schemas.events import TERMINAL_EVENT_TYPES
from schemas.requests import InferenceRequest

pytestmark = pytest.mark.integration


def _internal_topics(namespace: str) -> list[str]:
    """Topics of another namespace (inside the test's, so the fixture deletes them) that a
    client must not reach, and one named as Kafka names its own."""
    other = f"{namespace}.other"
    return [f"{other}.control", f"{other}.config", f"{other}.dispatch", f"{other}.responses",
            f"{other}.streams-requests-changelog", f"__{namespace}-internal"]


async def _ask(bootstrap: str, catalog, replies: dict[str, str]) -> dict[str, list]:
    """Send one request replying to each topic of ``replies`` (request id -> topic) and read the
    telemetry until each has ended; returns each request's events."""
    producer = make_producer(bootstrap)
    await producer.start()
    telemetry = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                 auto_offset_reset="earliest")
    await telemetry.start()
    events: dict[str, list] = {rid: [] for rid in replies}
    try:
        outbox = Outbox(producer)
        for rid, topic in replies.items():
            t = now_ms()
            outbox.emit(catalog.requests, InferenceRequest(
                event_time_ms=t, created_ms=t, request_id=rid, prompt_tokens=64, max_tokens=8,
                reply_to=topic), rid)
        await outbox.flush()
        async with asyncio.timeout(120):
            while not all(any(e.type in TERMINAL_EVENT_TYPES for e in got)
                          for got in events.values()):
                for records in (await telemetry.getmany(timeout_ms=200)).values():
                    for record in records:
                        event = decode(catalog.spec(catalog.telemetry), record.value)
                        if getattr(event, "request_id", None) in events:
                            events[event.request_id].append(event)
    finally:
        await telemetry.stop()
        await producer.stop()
    return events


async def _records_in(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """How many records each topic holds (each is of one partition, as ``create_topic`` makes)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(t, 0) for t in topics])
        return {tp.topic: end for tp, end in ends.items()}
    finally:
        await consumer.stop()


def test_a_request_replying_to_an_internal_topic_is_refused(kafka_bootstrap, catalog, tmp_path):
    internal = _internal_topics(catalog.namespace)
    for topic in internal:
        asyncio.run(create_topic(kafka_bootstrap, topic))
    replies = {f"r{i}": topic for i, topic in enumerate(internal)}
    replies["own"] = f"{catalog.namespace}-client-{uuid.uuid4().hex[:6]}"  # a client's own
    asyncio.run(create_topic(kafka_bootstrap, replies["own"]))
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path, speedup=20)
    stack.start()
    try:
        events = asyncio.run(_ask(kafka_bootstrap, catalog, replies))
        written = asyncio.run(_records_in(kafka_bootstrap, internal))
    finally:
        stack.stop()
        asyncio.run(delete_topics(kafka_bootstrap, [internal[-1], replies["own"]]))
    assert events["own"][-1].type == "completed"  # (a client's own topic is served)
    for rid, topic in replies.items():
        if rid == "own":
            continue
        assert [e.type for e in events[rid]] == ["rejected"], (topic, events[rid])
        end = events[rid][0]
        assert end.reason == "invalid_request", end
        assert end.detail.startswith(f"reply_to {topic!r} ") and "internal" in end.detail, end
    assert written == dict.fromkeys(internal, 0)
