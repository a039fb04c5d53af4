"""A worker that takes no work (drained, or stopping on SIGTERM) still reads its partition for the
cancellations and recalls of the requests it runs: they arrive there, behind the dispatches it
must not start then. Those dispatches are read again when it wakes, or left uncommitted to the
next worker on the slot. A real worker process on a real broker; the test plays the router and
a client."""

import asyncio
import signal

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from infra.stack import PoolSpec, Stack
from schemas import commands
from schemas.events import RequestEvent, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest

pytestmark = pytest.mark.integration

#: Far longer than the test waits for the cancellations: at one speed-up an H100 decodes
#: these for minutes, so an unread cancellation lets it run on (and end Completed).
LONG = 20_000


def _dispatch(request_id: str, max_tokens: int) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=max_tokens)
    return Dispatch(event_time_ms=t, request=request, worker_id="worker-0", slot=0)


def _cancel(request_id: str, attempt: int | None = None) -> CancelRequest:
    reason = "cancelled by client" if attempt is None else "recalled: overdue"
    return CancelRequest(event_time_ms=now_ms(), request_id=request_id, attempt=attempt,
                         reason=reason)


class _Slot:
    """Sends to worker-0 (its partition, its commands) and reads what it publishes."""

    def __init__(self, bootstrap, catalog) -> None:
        self.bootstrap, self.catalog = bootstrap, catalog
        self.statuses: list[WorkerStatus] = []
        self.events: list[RequestEvent] = []

    async def __aenter__(self):
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        self.outbox = Outbox(self.producer)
        self.consumer = AIOKafkaConsumer(self.catalog.telemetry, bootstrap_servers=self.bootstrap,
                                         auto_offset_reset="earliest")
        await self.consumer.start()
        self.typed = TypedConsumer(self.consumer, self.catalog, self.producer, "drained-test")
        return self

    async def __aexit__(self, *exc):
        await self.consumer.stop()
        await self.producer.stop()

    async def until(self, condition, timeout_s=60) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                for item in await self.typed.fetch(200):
                    m = item.message
                    if isinstance(m, WorkerStatus):
                        self.statuses.append(m)
                    elif isinstance(m, RequestEvent):
                        self.events.append(m)

    async def send(self, *messages) -> None:
        for m in messages:
            key = m.request.request_id if isinstance(m, Dispatch) else m.request_id
            self.outbox.emit(self.catalog.dispatch, m, key, partition=0)
        await self.outbox.flush()

    async def command(self, cls, **kw) -> None:
        self.outbox.emit(self.catalog.control, cls(
            event_time_ms=now_ms(), command_id=f"c-{now_ms()}", worker_id="worker-0",
            reason="test", **kw), "worker-0")
        await self.outbox.flush()

    def state(self) -> str | None:
        return self.statuses[-1].state if self.statuses else None

    def kinds(self, request_id: str) -> list[str]:
        return [e.type for e in self.events
                if e.request_id == request_id and e.type != "first_token"]

    async def committed(self) -> tuple[int | None, int]:
        """The worker's committed offset on the slot, and the partition's end."""
        partition = TopicPartition(self.catalog.dispatch, 0)
        group = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                 group_id=f"{self.catalog.namespace}.worker-0")
        await group.start()
        try:
            return (await group.committed(partition),
                    (await group.end_offsets([partition]))[partition])
        finally:
            await group.stop()


async def _drained_scenario(bootstrap, catalog) -> tuple[_Slot, bool]:
    async with _Slot(bootstrap, catalog) as slot:
        await slot.until(lambda: slot.state() == "warm")
        await slot.send(_dispatch("cancelled", LONG), _dispatch("recalled", LONG))
        await slot.until(lambda: "started" in slot.kinds("cancelled")
                         and "started" in slot.kinds("recalled"))
        await slot.command(commands.DrainWorker)  # no deadline: drained until woken
        await slot.until(lambda: slot.state() == "draining")
        # A dispatch that crossed the drain, then a client's cancel and the router's recall.
        await slot.send(_dispatch("held", 8), _cancel("cancelled"), _cancel("recalled", 1))
        await slot.until(lambda: "cancelled" in slot.kinds("cancelled")
                         and "requeued" in slot.kinds("recalled"), timeout_s=30)
        seen = len(slot.statuses)
        await slot.until(lambda: len(slot.statuses) >= seen + 3)  # drained on, three heartbeats
        held_while_drained = slot.kinds("held") != []
        await slot.command(commands.SleepWorker, level=0)  # woken: "held" is read again
        await slot.until(lambda: "completed" in slot.kinds("held"))
        # Every record passed at last, the cancellations read twice among them.
        async with asyncio.timeout(30):
            while (offsets := await slot.committed())[0] != offsets[1]:
                await asyncio.sleep(0.1)  # polling the broker's committed offset
        return slot, held_while_drained


def test_a_drained_worker_ends_what_is_cancelled_or_recalled_and_starts_nothing_till_woken(
        kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  with_router=False)
    stack.start()
    try:
        slot, held_while_drained = asyncio.run(_drained_scenario(kafka_bootstrap, catalog))
    finally:
        stack.stop()
    assert slot.kinds("cancelled") == ["started", "cancelled"]
    assert slot.kinds("recalled") == ["started", "requeued"]  # answered once, though read twice
    [back] = [e for e in slot.events if e.type == "requeued"]
    assert back.detail == "recalled: overdue" and 0 < back.tokens_done < LONG
    assert not held_while_drained
    assert slot.kinds("held") == ["started", "completed"]


async def _stopping_scenario(bootstrap, catalog, stack) -> tuple[_Slot, tuple, int]:
    async with _Slot(bootstrap, catalog) as slot:
        await slot.until(lambda: slot.state() == "warm")
        await slot.send(_dispatch("cancelled", LONG))  # offset 0
        await slot.until(lambda: "started" in slot.kinds("cancelled"))
        worker = stack.processes["worker-0"]
        worker.send_signal(signal.SIGTERM)
        await slot.until(lambda: slot.state() == "draining")
        await slot.send(_dispatch("late", 8), _cancel("cancelled"))  # offsets 1 and 2
        # Well within its drain (60 s), which the request would otherwise have run out
        await slot.until(lambda: "cancelled" in slot.kinds("cancelled"), timeout_s=30)
        await slot.until(lambda: slot.state() == "stopped")
        exit_code = await asyncio.to_thread(worker.wait, 30)  # nothing left to wait for
        committed = await slot.committed()
        stack.respawn("worker-0")  # the next worker on the slot serves what came meanwhile
        await slot.until(lambda: "completed" in slot.kinds("late"))
        return slot, committed, exit_code


def test_a_stopping_worker_ends_a_cancelled_request_and_leaves_new_work_uncommitted(
        kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  with_router=False, extra_worker_args=("--drain-timeout-s", "60"))
    stack.start()
    try:
        slot, (committed, _end), exit_code = asyncio.run(
            _stopping_scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    assert exit_code == 0
    assert slot.kinds("cancelled") == ["started", "cancelled"]  # not handed back at the end
    assert committed == 1  # past the cancelled request, not past "late", read while stopping
    assert slot.kinds("late") == ["started", "completed"]
