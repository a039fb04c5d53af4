"""``Outbox.flush`` returns only once every message emitted before it is acknowledged, even when
another task's flush took them (a component commits its input offsets after its flush)."""

import asyncio

from infra.bus import Outbox
from schemas.events import Queued

T0 = 1_700_000_000_000


class _HeldAcks:
    """A producer whose acknowledgements arrive when the test releases them."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future] = []
        self.released = False

    async def send(self, topic, value, key=None, partition=None) -> asyncio.Future:
        ack = asyncio.get_running_loop().create_future()
        if self.released:
            ack.set_result(None)
        self.acks.append(ack)
        return ack

    def release(self) -> None:
        """Acknowledge what was sent, and from now on every send at once."""
        self.released = True
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


def _queued(request_id: str) -> Queued:
    return Queued(event_time_ms=T0, request_id=request_id, created_ms=T0, prompt_tokens=1,
                  max_tokens=1)


def test_a_flush_waits_for_messages_another_flush_took() -> None:
    async def scenario() -> tuple[bool, int]:
        producer = _HeldAcks()
        outbox = Outbox(producer)
        outbox.emit("governor.telemetry", _queued("tick"), "tick")
        ticks = asyncio.create_task(outbox.flush())  # a background flush, acks not yet in
        await asyncio.sleep(0)
        outbox.emit("governor.telemetry", _queued("r1"), "r1")  # the request loop's message
        config_reader = asyncio.create_task(outbox.flush())  # another task's flush
        await asyncio.sleep(0)
        own = asyncio.create_task(outbox.flush())  # the request loop's own, then it commits
        for _ in range(5):
            await asyncio.sleep(0)
        returned_early = own.done()
        producer.release()
        await asyncio.wait_for(asyncio.gather(ticks, config_reader, own), timeout=5)
        return returned_early, len(producer.acks)

    returned_early, sent = asyncio.run(scenario())
    assert not returned_early  # it waited for the acknowledgements of "r1"
    assert sent == 2  # each message sent once


def test_a_flush_sends_what_was_emitted_in_order_and_counts_it() -> None:
    async def scenario() -> tuple[int, int]:
        producer = _HeldAcks()
        outbox = Outbox(producer)
        for i in range(3):
            outbox.emit("governor.telemetry", _queued(f"r{i}"), f"r{i}")
        flush = asyncio.create_task(outbox.flush())
        await asyncio.sleep(0)
        producer.release()
        return await flush, len(outbox)

    assert asyncio.run(scenario()) == (3, 0)
