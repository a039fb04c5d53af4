"""Every event and command type round-trips through its topic on the real broker."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import create_topics, make_producer, send
from schemas.codec import decode
from schemas.examples import examples
from schemas.topics import SPECS

pytestmark = pytest.mark.integration


async def _roundtrip(bootstrap, catalog):
    sent = []
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for spec in SPECS:
            topic = catalog.name(spec.suffix)
            for model in spec.models:
                message = examples()[model]
                await send(producer, topic, message, key=model.__name__)
                sent.append((topic, message))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(*catalog.topics(), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    received = []
    try:
        async with asyncio.timeout(30):
            while len(received) < len(sent):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    received += [(r.topic, decode(catalog.spec(r.topic), r.value)) for r in records]
    finally:
        await consumer.stop()
    return sent, received


def test_every_message_type_round_trips_through_its_topic(kafka_bootstrap, catalog):
    sent, received = asyncio.run(_roundtrip(kafka_bootstrap, catalog))
    key = lambda pair: (pair[0], pair[1].type)  # noqa: E731
    assert sorted(received, key=key) == sorted(sent, key=key)
    assert {type(m) for _, m in received} == set(examples())


def test_topics_create_is_idempotent_and_follows_the_catalog(kafka_bootstrap, catalog):
    from aiokafka.admin import AIOKafkaAdminClient

    again = asyncio.run(create_topics(kafka_bootstrap, catalog))
    assert again == []

    async def describe():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            return await admin.describe_topics(list(catalog.topics()))
        finally:
            await admin.close()

    described = {t["topic"]: len(t["partitions"]) for t in asyncio.run(describe())}
    assert described == {name: spec.partitions for name, spec in catalog.topics().items()}
