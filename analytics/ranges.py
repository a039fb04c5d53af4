"""Read exactly the records of some offset ranges back from Kafka, to write a flush again."""

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from analytics.batch import Batch, OffsetRange
from analytics.rows import TopicRows
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


async def existing_partitions(bootstrap: str, topics: set[str]) -> set[tuple[str, int]]:
    """The partitions of ``topics`` the broker has. Every topic is described (a request that
    names topics creates the missing ones on a broker that creates topics on use: a deleted
    topic would come back)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        described = await admin.describe_topics()
    finally:
        await admin.close()
    return {(t["topic"], p["partition"]) for t in described
            if t["error_code"] == 0 and t["topic"] in topics for p in t["partitions"]}


async def read_ranges(bootstrap: str, catalog: TopicCatalog, ranges: list[OffsetRange],
                      timeout_s: float = 60.0) -> tuple[Batch, list[OffsetRange]]:
    """The records in ``ranges`` that the broker still has, and the ranges it could read.

    A range of a partition that no longer exists (its topic was deleted) is left out of the
    ranges returned, so no offset mark is written for it; records retention or compaction
    removed from an existing partition are gone for good and simply absent from the batch.
    Raises ``TimeoutError`` if the broker delivers nothing for ``timeout_s``: a read that keeps
    delivering takes as long as it needs. (Before 7 Dec ``timeout_s`` bounded the whole read,
    and a flush of more records than are read in 60 s, about 4.5 million here at 75,000 a
    second, could never be written again: the sink read it from the start again for ever, its
    partitions paused.)
    """
    batch = Batch()
    existing = await existing_partitions(bootstrap, {r.topic for r in ranges})
    wanted = {TopicPartition(r.topic, r.partition): r for r in ranges
              if (r.topic, r.partition) in existing}
    for r in ranges:
        if (r.topic, r.partition) not in existing:
            logger.warning("%s[%d] no longer exists; its records of a pending flush are gone",
                           r.topic, r.partition)
    if not wanted:
        return batch, []
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(list(wanted))
        starts = await consumer.beginning_offsets(list(wanted))
        ends = await consumer.end_offsets(list(wanted))
        stop_at = {tp: min(r.last + 1, ends[tp]) for tp, r in wanted.items()}
        for tp, item in wanted.items():
            consumer.seek(tp, max(item.first, starts[tp]))
        async with asyncio.timeout(timeout_s) as stalled:
            while [tp for tp in wanted if await consumer.position(tp) < stop_at[tp]]:
                fetched = await consumer.getmany(timeout_ms=200)
                for tp, records in fetched.items():
                    records = [r for r in records if r.offset < stop_at[tp]]
                    if records:
                        rows = TopicRows(catalog.spec(tp.topic))  # the sink's own path
                        batch.add_partition(tp.topic, tp.partition, records[0].offset,
                                            records[-1].offset, rows.tables(records))
                if fetched:  # delivering: a stall is timed from here
                    stalled.reschedule(asyncio.get_running_loop().time() + timeout_s)
        return batch, sorted(wanted.values())
    finally:
        await consumer.stop()
