"""A streams ``ConfigFeed`` whose reading fails with a broker error after the configuration
topic was split, on a real broker: it starts its reading again on partition 0 alone and says
the split as an error, as a running reader does (``ConfigPartition.watch``), rather than
refusing as at its first start (its task ended: the streams worker ran on with no
configuration followed).

The broker error is injected in our own code path: ``TypedConsumer.fetch`` raises one
``KafkaConnectionError`` when armed; the broker, the topics and the records are real."""

import asyncio
import logging

from aiokafka.errors import KafkaConnectionError

import streams.config_feed
from infra.bus import TypedConsumer, make_producer, now_ms
from schemas.codec import encode
from schemas.config import ConfigSet
from streams.config_feed import ConfigFeed
from tests.integration.test_config_topic_split import (APPLIED_WITHIN_S, add_config_partition,
                                                       split_told)


class OneFetchFails:
    """``TypedConsumer.fetch``, raising a broker error once when ``armed``; ``logged_before``:
    how many of ``records`` (the log's) were there when it did."""

    def __init__(self, fetch, records: list[logging.LogRecord]) -> None:
        self.fetch, self.records, self.armed = fetch, records, False
        self.logged_before: int | None = None

    async def __call__(self, typed: TypedConsumer, *args, **kwargs):
        if self.armed:
            self.armed = False
            self.logged_before = len(self.records)
            raise KafkaConnectionError("injected: the connection to the broker was lost")
        return await self.fetch(typed, *args, **kwargs)


def test_a_feed_restarting_on_a_split_topic_reads_partition_0_and_says_it(
        kafka_bootstrap, catalog, caplog, monkeypatch):
    fault = OneFetchFails(TypedConsumer.fetch, caplog.records)
    monkeypatch.setattr(TypedConsumer, "fetch",
                        lambda typed, *args, **kwargs: fault(typed, *args, **kwargs))
    monkeypatch.setattr(streams.config_feed, "RETRY_S", 0.1)
    counts: list[int] = []
    feed = ConfigFeed(lambda taken: None, seen=counts.append)

    async def scenario() -> None:
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        following = asyncio.create_task(feed.follow(kafka_bootstrap, catalog))

        async def until(condition, timeout_s: float) -> None:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    assert not following.done(), following.exception()
                    await asyncio.sleep(0.05)  # (polling the feed's state: a condition)

        async def write(key: str, value) -> None:
            record = ConfigSet(event_time_ms=now_ms(), key=key, value=value)
            await producer.send_and_wait(catalog.config, encode(record), key=key.encode(),
                                         partition=0)

        try:
            await write("slo.ttft_slo_s", 7.0)
            await until(lambda: feed.live.config.slo.ttft_slo_s == 7.0, APPLIED_WITHIN_S)
            await add_config_partition(kafka_bootstrap, catalog)
            fault.armed = True
            await until(lambda: fault.logged_before is not None, APPLIED_WITHIN_S)
            await write("slo.deadline_s", 90.0)
            await until(lambda: feed.live.config.slo.deadline_s == 90.0, APPLIED_WITHIN_S)
            assert not following.done(), following.exception()
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await producer.stop()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    after_fault = caplog.records[fault.logged_before:]
    errors = [r.getMessage() for r in after_fault if r.levelno == logging.ERROR]
    assert any(split_told(e, catalog, kafka_bootstrap) for e in errors), [
        r.getMessage() for r in after_fault]
    assert counts[0] == 1 and counts[-1] == 2, counts  # (what the restarted reader found)
