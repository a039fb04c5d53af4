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
from workers.service import STALL_S, WorkerIdentity, WorkerService

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



def _started(worker: WorkerService) -> list[str]:
    """The requests ``worker`` has said it started, in order."""
    return [m.request_id for m in (decode(worker.catalog.spec(topic), value)
                                   for topic, value in worker.producer.sent)
            if m.type == "started"]


def _command(cls, **fields) -> SimpleNamespace:
    return SimpleNamespace(message=cls(event_time_ms=T, command_id="c", worker_id="worker-0",
                                       **fields))


def _serve_scripted(first: list, script) -> tuple[WorkerService, _Partition]:
    """A worker (its first token at once, then one a second) serving a partition of ``first``
    until ``script(loop, worker, partition)``, called at each control fetch, returns None; else
    its commands."""
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, FixedRateEngine(
        prefill_tokens_per_s=1e12, decode_tokens_per_s=1))
    partition = _Partition(first)
    worker.dispatch, worker.partition = partition, 0
    worker.producer = _Producer()
    worker.outbox = Outbox(worker.producer)
    stop, loops = asyncio.Event(), 0

    async def control_fetch(timeout_ms: int = 0) -> list:
        nonlocal loops
        loops += 1
        said = script(loops, worker, partition)
        if said is None:
            stop.set()
        return said or []

    control = SimpleNamespace(fetch=control_fetch, take_dead_lettered=lambda: [],
                              consumer=SimpleNamespace(assignment=set))
    asyncio.run(worker._serve(partition, control, stop))
    return worker, partition


def test_what_a_read_after_a_stall_finds_behind_a_drain_waits_for_the_wake():
    """The loop stood still while it obeyed a ``DrainWorker`` (a pause, or a read of the
    declared models for a ``load_model`` beside it): the read of its slot after the stall, just
    past the commands, started a dispatch it found there though the worker was drained now, and
    the wake, reading again from where the drain began, took it for a redelivery of a request
    that had finished and let the commit pass it while it ran (a crash then lost it)."""
    started_while_drained: list[str] = []

    def script(loop: int, worker: WorkerService, partition: _Partition) -> list | None:
        if loop == 1:  # the drain, and a dispatch placed before the router heard of it
            partition.records.append(_dispatch("late", 10_000))
            worker._last_step -= 2 * STALL_S  # read after a stall in obeying the drain
            return [_command(commands.DrainWorker)]
        if loop < 4:
            started_while_drained[:] = _started(worker)
        elif loop == 4:
            return [_command(commands.SleepWorker, level=0)]
        return None if loop == 6 else []

    worker, partition = _serve_scripted([_dispatch("first", 1)], script)  # ("first" ends)
    assert started_while_drained == ["first"]
    assert _started(worker) == ["first", "late"]
    assert max(partition.commits) == 1  # past "first", never past "late", which runs on


def test_what_a_read_after_a_stall_finds_behind_a_wake_is_started():
    """The loop stood still while it obeyed the ``SleepWorker`` that woke it: the read of its
    slot after the stall, from where the drain began, took only the cancellations there, and
    the dispatches it skipped were never started, the commit passing them."""
    def script(loop: int, worker: WorkerService, partition: _Partition) -> list | None:
        if loop == 1:
            return [_command(commands.DrainWorker)]
        if loop == 3:  # a dispatch placed before the router heard of the drain, then the wake
            partition.records.append(_dispatch("late", 10_000))
            worker._last_step -= 2 * STALL_S  # read after a stall in obeying the wake
            return [_command(commands.SleepWorker, level=0)]
        if loop == 4:
            partition.records.append(_dispatch("after", 10_000))
        return None if loop == 7 else []

    worker, partition = _serve_scripted([_dispatch("first", 1)], script)
    assert _started(worker) == ["first", "late", "after"]
    assert max(partition.commits) == 1  # never past "late"
