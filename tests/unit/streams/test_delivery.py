"""Deliveries of fetched records inline (``streams.delivery``), on the app's real Faust consumer:
the same outcome as Faust's ``wait_first`` in every case, without its tasks when the delivery
does not wait."""

import asyncio
import gc
import warnings

import pytest

from streams.app import StreamsApp
from streams.delivery import InlineDelivery
from streams.worker import settings_for


def _consumer(datadir):
    """The app's consumer, made in the running loop (Faust binds its services to it)."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=datadir)
    assert isinstance(streams.app.consumer, InlineDelivery)
    return streams.app.consumer


def _deliver(queue: asyncio.Queue, record: str):
    """What the consumer's callback does with a record: put it on a stream's queue."""
    async def deliver():
        await queue.put(record)
        return record
    return deliver()


def _counting_tasks(monkeypatch) -> list:
    made: list = []
    real = asyncio.ensure_future

    def counted(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(asyncio, "ensure_future", counted)
    return made


def test_a_delivery_with_room_is_made_inline_without_a_task(tmp_path, monkeypatch):
    async def scenario():
        consumer = _consumer(tmp_path)
        queue = asyncio.Queue(maxsize=4)
        made = _counting_tasks(monkeypatch)
        result = await consumer.wait_first(_deliver(queue, "t[0]@7"),
                                           consumer.suspend_flow.wait())
        return result, queue.get_nowait(), made

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unused suspend_flow.wait() is closed, not left
        (done, results, stopped), record, made = asyncio.run(scenario())
        gc.collect()
    assert (results, stopped, record, made) == (["t[0]@7"], False, "t[0]@7", [])


async def _waiting_delivery(consumer) -> tuple[asyncio.Queue, asyncio.Future]:
    """A delivery of ``t[0]@7`` to a queue that ``t[0]@6`` fills, waiting."""
    queue = asyncio.Queue(maxsize=1)
    queue.put_nowait("t[0]@6")
    waiting = asyncio.ensure_future(consumer.wait_first(
        _deliver(queue, "t[0]@7"), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    return queue, waiting


def test_a_delivery_to_a_full_queue_waits_for_room(tmp_path):
    async def scenario():
        queue, waiting = await _waiting_delivery(_consumer(tmp_path))
        assert queue.get_nowait() == "t[0]@6"  # the stream takes one: room for the next
        done, results, stopped = await asyncio.wait_for(waiting, 5)
        return results, stopped, queue.get_nowait()

    assert asyncio.run(scenario()) == (["t[0]@7"], False, "t[0]@7")


def test_a_waiting_delivery_is_given_up_when_flow_is_suspended(tmp_path):
    """As with Faust's own: a rebalance suspends flow; the delivery stops waiting and is
    cancelled, leaving nothing behind on the queue."""
    async def scenario():
        consumer = _consumer(tmp_path)
        queue, waiting = await _waiting_delivery(consumer)
        consumer.suspend_flow.set()
        done, results, stopped = await asyncio.wait_for(waiting, 5)
        await asyncio.sleep(0)  # the cancelled delivery unwinds
        assert queue.get_nowait() == "t[0]@6"
        return results, stopped, queue.empty(), len(queue._putters)

    assert asyncio.run(scenario()) == ([True], False, True, 0)  # the suspension's wait() won


def test_a_failing_delivery_raises(tmp_path):
    async def failing():
        raise ValueError("bad record")

    async def scenario():
        consumer = _consumer(tmp_path)
        await consumer.wait_first(failing(), consumer.suspend_flow.wait())

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="bad record"):
            asyncio.run(scenario())
        gc.collect()


def test_other_waits_are_faust_s_own(tmp_path, monkeypatch):
    async def scenario():
        consumer = _consumer(tmp_path)
        made = _counting_tasks(monkeypatch)
        other = asyncio.Event()
        done, results, stopped = await asyncio.wait_for(
            consumer.wait_first(asyncio.sleep(0, "slept"), other.wait()), 5)
        return results, stopped, len(made)

    results, stopped, tasks = asyncio.run(scenario())
    assert (results, stopped) == (["slept"], False) and tasks >= 2
