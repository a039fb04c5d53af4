"""A worker that takes no work (drained, or stopping on SIGTERM) still reads its partition for the
cancellations and recalls of the requests it runs: they arrive there, behind the dispatches it
must not start then. Those dispatches are read again when it wakes, or, stopping, handed back
at once and left uncommitted to the next worker on the slot. A real worker process on a real broker; the test plays the router and
a client."""

import asyncio
import signal

import pytest

from infra.bus import now_ms
from infra.stack import PoolSpec, Stack
from schemas import commands
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from tests.integration.worker_support import Observer, command

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


async def _drained_scenario(bootstrap, catalog) -> tuple[Observer, bool]:
    async with Observer(bootstrap, catalog) as slot:
        await slot.until(lambda: slot.state() == "warm")
        await slot.dispatch(_dispatch("cancelled", LONG), _dispatch("recalled", LONG))
        await slot.until(lambda: "started" in slot.kinds("cancelled")
                         and "started" in slot.kinds("recalled"))
        # no deadline: drained until woken
        await slot.command(command(commands.DrainWorker, reason="test"))
        await slot.until(lambda: slot.state() == "draining")
        # A dispatch that crossed the drain, then a client's cancel and the router's recall.
        await slot.dispatch(_dispatch("held", 8), _cancel("cancelled"), _cancel("recalled", 1))
        await slot.until(lambda: "cancelled" in slot.kinds("cancelled")
                         and "requeued" in slot.kinds("recalled"), timeout_s=30)
        seen = len(slot.statuses)
        await slot.until(lambda: len(slot.statuses) >= seen + 3)  # drained on, three heartbeats
        held_while_drained = slot.kinds("held") != []
        # woken: "held" is read again
        await slot.command(command(commands.SleepWorker, level=0, reason="test"))
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


async def _stopping_scenario(bootstrap, catalog, stack) -> tuple[Observer, tuple, int]:
    async with Observer(bootstrap, catalog) as slot:
        await slot.until(lambda: slot.state() == "warm")
        await slot.dispatch(_dispatch("cancelled", LONG))  # offset 0
        await slot.until(lambda: "started" in slot.kinds("cancelled"))
        worker = stack.processes["worker-0"]
        worker.send_signal(signal.SIGTERM)
        await slot.until(lambda: slot.state() == "draining")
        await slot.dispatch(_dispatch("late", 8), _cancel("cancelled"))  # offsets 1 and 2
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
    # handed back at once, and left uncommitted: with no router here to supersede it, the
    # next worker on the slot serves it again
    assert slot.kinds("late") == ["requeued", "started", "completed"]


async def _crossing_scenario(bootstrap, catalog, stack) -> tuple[Observer, bool]:
    async with Observer(bootstrap, catalog) as slot:
        await slot.until(lambda: slot.state() == "warm")
        await slot.dispatch(_dispatch("long", LONG))
        await slot.until(lambda: "started" in slot.kinds("long"))
        stack.processes["worker-0"].send_signal(signal.SIGTERM)  # scaled in: it drains
        await slot.until(lambda: slot.state() == "draining")
        await slot.dispatch(_dispatch("crossed", 8))  # placed before the router read that
        await slot.until(lambda: "requeued" in slot.kinds("crossed"), timeout_s=20)
        return slot, slot.state() == "draining"


def test_a_stopping_worker_hands_back_at_once_a_dispatch_it_will_not_start(
        kafka_bootstrap, catalog, tmp_path):
    """A dispatch that crossed the worker's SIGTERM (the autoscaler scaling in) was left
    unanswered until the worker had finished draining what it ran (up to its drain timeout):
    the router continued it elsewhere only once the worker said it had stopped (governor up,
    100 requests/s on two workers, cut to one: a request placed 21 ms before the SIGTERM
    started 2.4 s later, after the drain)."""
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  with_router=False, extra_worker_args=("--drain-timeout-s", "60"))
    stack.start()
    try:
        slot, still_draining = asyncio.run(_crossing_scenario(kafka_bootstrap, catalog, stack))
    finally:
        stack.stop()
    assert slot.kinds("crossed") == ["requeued"]
    [back] = [e for e in slot.events if e.type == "requeued"]
    assert back.tokens_done == 0 and back.attempt == 1
    assert still_draining  # answered while the long request still ran, not at the stop
