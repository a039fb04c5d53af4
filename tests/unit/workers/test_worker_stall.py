"""A worker back from a stall reads its slot's partition to its end before its engine steps on
(``WorkerService._read_after_a_stall``; the pause itself: tests/integration/test_worker_paused.py).
A stall may be the broker's: one that cannot say where the partition ends holds the worker up
no longer than ``STALL_READ_S``, and it serves on (no broker: the serving loop of
``test_worker_backlog`` over a partition given as a list of records)."""

import asyncio

from aiokafka.errors import KafkaTimeoutError

import workers.service as service
from schemas.codec import decode
from schemas.requests import Dispatch, InferenceRequest
from tests.unit.workers.test_worker_backlog import T, _Partition, _served


class _Unreachable(_Partition):
    """A partition whose end can be learnt once (the backlog read at the start), then not."""

    def __init__(self, records: list, hang: bool) -> None:
        super().__init__(records)
        self.asked, self.hang = 0, hang

    async def end_offsets(self, partitions):
        self.asked += 1
        if self.asked == 1:
            return await super().end_offsets(partitions)
        if self.hang:
            await asyncio.sleep(3600)
        raise KafkaTimeoutError()


def test_a_worker_whose_broker_cannot_say_where_its_slot_ends_after_a_stall_serves_on(
        monkeypatch):
    monkeypatch.setattr(service, "STALL_S", 0.0)  # every pass counts as one after a stall
    monkeypatch.setattr(service, "STALL_READ_S", 0.05)
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r", prompt_tokens=16,
                               max_tokens=8)
    for hang in (False, True):
        records = [Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0)]
        worker, partition = _served(records, fetches=40,
                                    partition=lambda r, hang=hang: _Unreachable(r, hang))
        sent = [decode(worker.catalog.spec(topic), value).type
                for topic, value in worker.producer.sent]
        assert partition.asked > 2 and "started" in sent  # asked again and again, serving
