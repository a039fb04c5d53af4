"""Kafka records as a consumer returns them, and the plain part of a consumer, for the sink's
unit tests."""

import asyncio
import time
from dataclasses import dataclass

from aiokafka import TopicPartition

from schemas.codec import encode
from schemas.events import Queued

NOW = int(time.time() * 1000)


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes
    value: bytes


def queued(tp: TopicPartition, first: int, last: int) -> list[Record]:
    """The records ``first..last`` of ``tp``, one request's Queued event each."""
    return [Record(tp.topic, tp.partition, i, NOW, b"k", encode(Queued(
        event_time_ms=NOW + i, request_id=f"r{tp.partition}-{i}", created_ms=NOW,
        prompt_tokens=1, max_tokens=1))) for i in range(first, last + 1)]


class FakeConsumer:
    """What the sink asks of a consumer besides its records and positions: a subscription
    (its rebalance listener kept) and paused partitions."""

    def __init__(self) -> None:
        self._paused: set[TopicPartition] = set()
        self.listener = None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def subscribe(self, topics, listener=None) -> None:
        self.listener = listener

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *tps) -> None:
        self._paused |= set(tps)

    def resume(self, *tps) -> None:
        self._paused -= set(tps)


class OnePartition(FakeConsumer):
    """Partition ``tp`` alone, which delivers ``fetches`` one a fetch while it is not paused,
    and remembers the offsets committed; its end offset is that past the last of ``fetches``."""

    def __init__(self, tp: TopicPartition, fetches: list[list[Record]]) -> None:
        super().__init__()
        self.tp, self.fetches = tp, fetches
        self.commits: list[int] = []
        records = [record for fetch in fetches for record in fetch]
        self.next_offset = records[0].offset if records else 0
        self.end = records[-1].offset + 1 if records else 0

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        return {tp: self.end for tp in partitions if tp == self.tp}

    async def position(self, tp: TopicPartition) -> int:
        return self.next_offset

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    async def getmany(self, timeout_ms=0, max_records=None):
        await asyncio.sleep(0)  # lets the flush in flight run, as a real fetch does
        if self.fetches and self.tp not in self._paused:
            fetch = self.fetches.pop(0)
            self.next_offset = fetch[-1].offset + 1 if fetch else self.next_offset
            return {self.tp: fetch}
        return {}

    async def commit(self, offsets) -> None:
        self.commits.extend(offsets.values())
