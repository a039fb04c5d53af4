"""A drained worker reads its partition on for the cancellations of what it runs, and nothing it
reads then moves its commit past a dispatch it has not started; woken, it reads again from where
the drain began (no broker: the worker's serving loop over a partition given as a list of
records, read one record a fetch, and a script of commands)."""

import asyncio
from types import SimpleNamespace

from infra.bus import Decoded, Outbox
from schemas import commands
from schemas.codec import decode
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from tests.unit.workers.fake_producer import AckingProducer as _Producer
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService

T = 1_800_000_000_000
ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _dispatch(request_id: str, max_tokens: int) -> Dispatch:
    return Dispatch(event_time_ms=T, worker_id="worker-0", slot=0, request=InferenceRequest(
        event_time_ms=T, created_ms=T, request_id=request_id, prompt_tokens=16,
        max_tokens=max_tokens))


class _Partition:
    """The slot's partition: ``records`` from offset 0, one a fetch; commits and seeks kept."""

    def __init__(self, records: list) -> None:
        self.records, self.read, self.commits, self.seeks = records, 0, [], []
        self.dead_letter: list[bool] = []  # the worker's wish, fetch by fetch
        self.paused = False

    async def end_offsets(self, partitions):
        return {p: len(self.records) for p in partitions}

    async def position(self, partition) -> int:
        return self.read

    def pause(self, partition) -> None:  # (a paused partition is not fetched from)
        self.paused = True

    def resume(self, partition) -> None:
        self.paused = False

    def seek(self, partition, offset: int) -> None:
        self.seeks.append(offset)
        self.read = offset

    async def commit(self, offsets) -> None:
        self.commits += offsets.values()

    async def fetch(self, timeout_ms: int = 200, *, dead_letter: bool = True) -> list:
        self.dead_letter.append(dead_letter)
        if self.paused or self.read >= len(self.records):
            return []
        self.read += 1
        return [Decoded(SimpleNamespace(offset=self.read - 1), self.records[self.read - 1])]

    def take_dead_lettered(self) -> list:
        return []


def test_a_drained_worker_cancels_what_it_runs_and_starts_what_came_only_once_woken():
    """DrainWorker paused the partition, so the cancellation of a request the worker ran went
    unread (it ran to completion); what is read while drained must neither start nor be
    committed past."""
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=1))  # "running" will not end
    partition = _Partition([_dispatch("running", 10_000)])  # the backlog: offset 0
    worker.dispatch, worker.partition = partition, 0
    worker.producer = _Producer()
    worker.outbox = Outbox(worker.producer)
    stop = asyncio.Event()
    loops = 0
    committed_while_drained: list[int] = []

    def command(**kw):
        return SimpleNamespace(message=kw.pop("cls")(
            event_time_ms=T, command_id="c", worker_id="worker-0", **kw))

    async def control_fetch(timeout_ms: int = 0) -> list:
        nonlocal loops
        loops += 1
        if loops == 1:  # "running" started: drained, then a dispatch and the cancel arrive
            partition.records += [_dispatch("held", 4), CancelRequest(
                event_time_ms=T, request_id="running", reason="cancelled by client")]
            return [command(cls=commands.DrainWorker)]
        if loops < 6:
            committed_while_drained.extend(partition.commits)
            return []
        if loops == 6:
            return [command(cls=commands.SleepWorker, level=0)]
        if loops == 9:
            stop.set()
        return []

    control = SimpleNamespace(fetch=control_fetch, take_dead_lettered=lambda: [],
                              consumer=SimpleNamespace(assignment=set))  # (none added)
    asyncio.run(worker._serve(partition, control, stop))
    messages = [decode(worker.catalog.spec(topic), value) for topic, value in worker.producer.sent]
    events = [(m.type, m.request_id) for m in messages if m.type in ("started", "cancelled")]
    assert events == [("started", "running"), ("cancelled", "running"), ("started", "held")]
    assert max(committed_while_drained) == 1  # past "running", cancelled; not past "held"
    assert partition.seeks == [1]  # woken: read again from where the drain began
    assert partition.read == 3
    assert False in partition.dead_letter  # drained, a bad record waits to be read again
