"""CommitGate: the consumer commits nothing once a changelog write has failed."""

import asyncio

import pytest

from streams.commits import CommitGate, GatedConsumer, WriteFailed


class _Committing:
    """Stands in for Faust's consumer: what ``_commit`` was given."""

    def __init__(self) -> None:
        self.committed = []

    async def _commit(self, offsets):
        self.committed.append(offsets)
        return True


def test_commits_go_through_until_a_write_fails_then_never():
    async def scenario():
        loop = asyncio.get_running_loop()
        failures = []

        async def on_failure(exc):
            failures.append(exc)

        class Consumer(GatedConsumer, _Committing):
            gate = CommitGate(on_failure)

        consumer = Consumer()
        landed, in_flight, failed = (loop.create_future() for _ in range(3))
        consumer.gate.track([landed, in_flight, failed])
        landed.set_result(None)
        assert await consumer._commit({"tp": 1}) is True  # one still in flight: nothing known
        failed.set_exception(OSError("KafkaTimeoutError"))
        in_flight.set_result(None)
        assert await consumer._commit({"tp": 2}) is False
        assert await consumer._commit({"tp": 3}) is False  # closed for good
        assert consumer.committed == [{"tp": 1}]
        assert [type(f.__cause__) for f in failures] == [OSError, OSError]
        with pytest.raises(WriteFailed, match="OSError: KafkaTimeoutError"):
            consumer.gate.check()

    asyncio.run(scenario())


def test_a_closed_gate_keeps_its_first_reason():
    gate = CommitGate()
    gate.close(TimeoutError("first"))
    gate.close(OSError("second"))
    with pytest.raises(WriteFailed, match="TimeoutError: first"):
        gate.check()
