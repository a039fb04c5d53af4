"""A worker back from a stall reads its slot's partition to its end before its engine steps on
(``WorkerService._read_after_a_stall``; the pause itself: tests/integration/test_worker_paused.py).
A stall may be the broker's: one that cannot say where the partition ends holds the worker up
no longer than ``STALL_READ_S``, and it serves on (no broker: the serving loop of
``test_worker_backlog`` over a partition given as a list of records)."""

import asyncio
import time

from aiokafka.errors import KafkaTimeoutError

import workers.service as service
from schemas.codec import decode
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from tests.unit.workers.fake_producer import AckingProducer
from tests.unit.workers.test_worker_backlog import T, _Partition, _served


#: Fetches enough for any run: the tests below serve until ``_done_with_both`` holds.
FOREVER = 10**9


def _done_with_both(timeout_s: float = 30.0):
    """Served until the worker has committed past the dispatch and its supersede (offset 2:
    whatever it sent for them is sent), or for ``timeout_s`` at most; a fixed count of fetches
    ran out on a loaded machine before the engine sent its final chunk."""
    deadline = time.monotonic() + timeout_s
    return lambda partition: (bool(partition.commits) and partition.commits[-1] == 2) or \
        time.monotonic() > deadline


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


def test_a_stall_after_the_worker_read_its_slot_is_read_again_before_its_engine_steps(
        monkeypatch):
    """The stall lands while the worker obeys its commands, after it read its slot (any await
    between that read and the engine's step: a SIGSTOP lands where it lands), and the router
    supersedes the request meanwhile. Before, the engine stepped over the whole stall first and
    completed the request a second time (``governor demo --fault pause:1:8@6``: 3 requests with
    two ``Completed`` each)."""
    monkeypatch.setattr(service, "STALL_S", 0.1)
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r", prompt_tokens=16,
                               max_tokens=50)  # 50 ms at the engine's 1,000 tokens/s

    def commands(partition):
        async def fetch(timeout_ms: int = 0) -> list:
            if len(partition.records) == 1 and partition.read == 1:  # read, now started
                partition.records.append(CancelRequest(
                    event_time_ms=T, request_id="r", attempt=1,
                    reason="superseded: its worker went silent"))
                time.sleep(0.3)  # the fault itself: the process stands still (not a wait)
            return []
        return fetch

    records = [Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0)]
    worker, partition = _served(records, fetches=FOREVER, commands=commands,
                                until=_done_with_both())
    sent = [decode(worker.catalog.spec(topic), value) for topic, value in worker.producer.sent]
    ends = [(m.type, m.attempt) for m in sent if m.type in ("completed", "requeued")]
    assert ends == [("requeued", 1)]  # handed back, not completed over the stall


class _StallingOnTheFinalChunk(AckingProducer):
    """Stands still while the request's final chunk is sent, and the router, hearing nothing
    for its heartbeat timeout, ends the request and supersedes the attempt meanwhile (it
    completes a request whose stream the client has whole itself)."""

    def __init__(self, partition: _Partition) -> None:
        super().__init__()
        self.partition = partition

    async def send(self, topic, value, key=None, partition=None):
        if b'"final":true' in value and len(self.partition.records) == 1:
            self.partition.records.append(CancelRequest(
                event_time_ms=T, request_id="r", attempt=1,
                reason="superseded: its worker went silent"))
            time.sleep(0.3)  # the fault itself: the process stands still (not a wait)
        return await super().send(topic, value, key, partition)


def test_a_worker_that_stood_still_as_it_sent_a_final_chunk_sends_no_end_the_router_gave(
        monkeypatch):
    """Before, the end went out after the stall whatever the slot said: the request the router
    had completed on the worker's behalf (its stream whole) was completed twice by one attempt,
    an audit violation (``demo --fault pause:1:8@6``: 1 of 106 requests)."""
    monkeypatch.setattr(service, "STALL_S", 0.1)
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r", prompt_tokens=16,
                               max_tokens=8)
    records = [Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0)]
    worker, partition = _served(records, fetches=FOREVER, producer=_StallingOnTheFinalChunk,
                                until=_done_with_both(), max_tick_s=0.005)
    sent = [decode(worker.catalog.spec(topic), value) for topic, value in worker.producer.sent]
    assert partition.read == 2  # the supersede was read
    assert [m.type for m in sent if m.type in ("completed", "failed", "requeued")] == []
    assert partition.commits and partition.commits[-1] == 2  # the dispatch is done with
