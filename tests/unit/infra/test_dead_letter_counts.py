"""A process counts the records it dead-letters, by the topic they were read from and why
(``governor_dead_letters_total{topic,reason}``): until 6 Dec the router, the controllers and the
workers dead-lettered records with a log line alone, and no metric moved."""

import asyncio
from types import SimpleNamespace

import pytest

from controllers.metrics import EmittedMetrics
from infra.bus import TypedConsumer
from schemas.codec import DecodeError
from schemas.topics import TopicCatalog


class _AckingProducer:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
        self.sent.append(topic)
        ack = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack


def _record(topic: str, offset: int) -> SimpleNamespace:
    return SimpleNamespace(topic=topic, partition=0, offset=offset, key=b"k", value=b"{bad")


def test_dead_letters_are_counted_by_topic_and_reason_once_the_broker_has_them() -> None:
    catalog = TopicCatalog("unit")
    producer = _AckingProducer()
    metrics = EmittedMetrics()
    typed = TypedConsumer(SimpleNamespace(), catalog, producer, "router-0",
                          counted=metrics.dead_lettered)
    bad = [(_record(catalog.requests, 1), DecodeError("undecodable", "not JSON")),
           (_record(catalog.requests, 2), DecodeError("undecodable", "not JSON")),
           (_record(catalog.requests, 3), DecodeError("schema_violation", "prompt_tokens")),
           (_record(catalog.control, 4), DecodeError("undecodable", "not JSON"))]
    asyncio.run(typed.dead_letter(bad))
    assert producer.sent == [catalog.deadletter] * 4
    value = metrics.registry.get_sample_value
    assert value("governor_dead_letters_total",
                 {"topic": catalog.requests, "reason": "undecodable"}) == 2
    assert value("governor_dead_letters_total",
                 {"topic": catalog.requests, "reason": "schema_violation"}) == 1
    assert value("governor_dead_letters_total",
                 {"topic": catalog.control, "reason": "undecodable"}) == 1


def test_a_dead_letter_the_broker_refuses_is_not_counted() -> None:
    class _Refusing(_AckingProducer):
        async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
            ack = asyncio.get_running_loop().create_future()
            ack.set_exception(ConnectionError("broker gone"))
            return ack

    catalog = TopicCatalog("unit")
    metrics = EmittedMetrics()
    typed = TypedConsumer(SimpleNamespace(), catalog, _Refusing(), "worker-0",
                          counted=metrics.dead_lettered)
    with pytest.raises(ConnectionError):
        asyncio.run(typed.dead_letter([(_record(catalog.dispatch, 1),
                                        DecodeError("undecodable", "not JSON"))]))
    assert metrics.registry.get_sample_value(
        "governor_dead_letters_total", {"topic": catalog.dispatch, "reason": "undecodable"}) is None
