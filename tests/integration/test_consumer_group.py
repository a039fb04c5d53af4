"""A consumer group on the real broker splits partitions and rebalances when a member leaves."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import make_producer, send
from schemas.examples import example_request

pytestmark = pytest.mark.integration


def _member(bootstrap, topic, group):
    return AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                            auto_offset_reset="earliest", enable_auto_commit=False,
                            session_timeout_ms=6_000, heartbeat_interval_ms=500)


async def _until(condition, timeout_s, what):
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)  # re-check a condition with a deadline


async def _scenario(bootstrap, catalog):
    topic, group = catalog.requests, f"{catalog.namespace}.group"
    partitions = catalog.spec(topic).partitions
    a, b = _member(bootstrap, topic, group), _member(bootstrap, topic, group)
    await a.start()
    await b.start()
    received = {"a": [], "b": []}

    async def drain(name, consumer):
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                received[name] += [r.key.decode() for r in records]

    tasks = [asyncio.create_task(drain("a", a)), asyncio.create_task(drain("b", b))]
    try:
        await _until(lambda: len(a.assignment()) + len(b.assignment()) == partitions
                     and a.assignment() and b.assignment(), 30, "both members assigned")
        split = (set(a.assignment()), set(b.assignment()))

        producer = make_producer(bootstrap)
        await producer.start()
        keys = [f"req-{i}" for i in range(40)]
        for key in keys:
            await send(producer, topic, example_request(key), key=key)
        await producer.stop()
        await _until(lambda: len(received["a"]) + len(received["b"]) >= len(keys), 30, "all read")

        tasks[1].cancel()
        await b.stop()  # leaves the group: its partitions move to a
        await _until(lambda: len(a.assignment()) == partitions, 30, "a takes over")
        return split, received, keys, a.assignment()
    finally:
        tasks[0].cancel()
        await a.stop()


def test_group_splits_partitions_and_rebalances_when_a_member_leaves(kafka_bootstrap, catalog):
    (split_a, split_b), received, keys, after = asyncio.run(_scenario(kafka_bootstrap, catalog))
    partitions = catalog.spec(catalog.requests).partitions
    assert split_a and split_b and not split_a & split_b
    assert len(split_a | split_b) == partitions
    # Each record went to exactly one member.
    assert sorted(received["a"] + received["b"]) == sorted(keys)
    assert received["a"] and received["b"]
    assert len(after) == partitions
