"""A worker taking a slot over reads the partition's backlog whole before it starts any of it, even
when the first read is cut short (no broker: the worker's serving loop over a partition given as a
list of records, read one record a fetch)."""

import asyncio
from types import SimpleNamespace

import workers.service as service
from infra.bus import Decoded, Outbox
from schemas.codec import decode
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from tests.unit.workers.fake_producer import AckingProducer as _Producer
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService

T = 1_800_000_000_000
ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


class _Partition:
    """The slot's partition: ``records`` from offset 0, one a fetch; commits are kept."""

    def __init__(self, records: list) -> None:
        self.records, self.read, self.commits = records, 0, []

    async def end_offsets(self, partitions):
        return {p: len(self.records) for p in partitions}

    async def position(self, partition) -> int:
        return self.read

    async def commit(self, offsets) -> None:
        self.commits += offsets.values()


class _Typed:
    def __init__(self, partition: _Partition, stop: asyncio.Event, fetches: int,
                 until=lambda: False) -> None:
        self.partition, self.stop, self.left, self.until = partition, stop, fetches, until

    async def fetch(self, timeout_ms: int = 200, dead_letter: bool = True) -> list:
        self.left -= 1
        if self.left <= 0 or self.until():
            self.stop.set()
        p = self.partition
        if p.read >= len(p.records):
            await asyncio.sleep(timeout_ms / 1000)  # nothing to read: it waits, as a consumer does
            return []
        p.read += 1
        return [Decoded(SimpleNamespace(offset=p.read - 1), p.records[p.read - 1])]

    def take_dead_lettered(self) -> list:
        return []


def _no_commands(timeout_ms: int = 0):
    return asyncio.sleep(0, result=[])


def _served(records: list, fetches: int, partition=_Partition, commands=_no_commands,
            producer=lambda partition: _Producer(), until=lambda partition: False,
            **options) -> tuple[WorkerService, "_Partition"]:
    """A worker on a partition holding ``records`` (made by ``partition``), served until its
    ``fetches``-th fetch, or a fetch at which ``until(partition)`` holds;
    ``commands(partition)``, if given, is the fetch of its control topic, and
    ``producer(partition)`` its producer."""
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=1_000), **options)
    partition = partition(records)
    worker.dispatch, worker.partition = partition, 0
    worker.producer = producer(partition)
    worker.outbox = Outbox(worker.producer)

    async def serve() -> None:
        stop = asyncio.Event()
        fetch = commands if commands is _no_commands else commands(partition)
        control = SimpleNamespace(fetch=fetch, take_dead_lettered=lambda: [],
                                  consumer=SimpleNamespace(assignment=set))  # (none added)
        await worker._serve(_Typed(partition, stop, fetches, lambda: until(partition)),
                            control, stop)

    asyncio.run(serve())
    return worker, partition


def test_a_dispatch_superseded_past_a_cut_short_backlog_read_is_never_started(monkeypatch):
    """The backlog read stops after ``BACKLOG_READ_S`` (here at once): the worker served what it
    had read, so a dispatch whose supersede lay further on ran a second time (and ended twice)."""
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="done-before",
                               prompt_tokens=16, max_tokens=8)
    records = [Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0),
               CancelRequest(event_time_ms=T, request_id="done-before", attempt=1,
                             reason="superseded: finished on worker-0")]
    monkeypatch.setattr(service, "BACKLOG_READ_S", 0.0)
    worker, partition = _served(records, fetches=4)
    messages = [decode(worker.catalog.spec(topic), value) for topic, value in worker.producer.sent]
    sent = [m.type for m in messages]
    assert partition.read == 2  # the whole backlog was read
    assert "started" not in sent and "requeued" not in sent  # never started, nothing to hand back
    # heart-beating while it read on, as "starting": no router places work on it meanwhile
    assert [m.state for m in messages if m.type == "worker_status"][0] == "starting"
    assert partition.commits and partition.commits[-1] == 2  # and passed


def test_a_stop_during_the_backlog_read_stops_it_heart_beating_meanwhile(monkeypatch):
    """SIGTERM was not heeded while the backlog was read (for up to ``BACKLOG_READ_S``), and no
    heartbeat went out meanwhile: the worker read on to the end, silent, before it stopped."""
    records = [Dispatch(event_time_ms=T, worker_id="worker-0", slot=0, request=InferenceRequest(
        event_time_ms=T, created_ms=T, request_id=f"r{i}", prompt_tokens=16, max_tokens=8))
        for i in range(200)]
    worker, partition = _served(records, fetches=3, status_interval_s=0.0)  # stop at the 3rd
    messages = [decode(worker.catalog.spec(topic), value) for topic, value in worker.producer.sent]
    assert partition.read == 3  # stopped there, not read on to the end
    assert [m.type for m in messages if m.type != "worker_status"] == []  # nothing started
    assert {m.state for m in messages if m.type == "worker_status"} == {"starting"}
    assert partition.commits == []  # none of it passed: the next worker reads it all
