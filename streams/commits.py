"""A streams worker commits no offset once something it wrote has failed to reach the broker.

An agent sends a batch's outputs and waits for them, then writes its state back to the tables'
changelogs without waiting (a round trip per batch saved); Faust acknowledges the batch's events
and commits their offsets every second, after flushing its producer. Two failures slipped
through that:

* a changelog record that failed after the producer's retries: aiokafka's flush waits for every
  batch but raises for none, so the offsets were committed past the events whose state was lost
  (after a restart the table came back older than the offsets, and replays counted twice what
  its dedupe had kept);
* an agent that failed on a batch (a send that timed out): Faust acknowledges the events of a
  batch in ``Stream.take_events``'s ``finally`` even when the agent raised, and restarts the
  agent in the same process, on tables the books had changed and with the batch's writes still
  staged for the next write-back.

``CommitGate`` keeps the futures of the changelog writes. The agents check it before each batch
and the consumer (``GatedConsumer``) after its flush, before each commit; a failed write, or a
failed batch (``close``), closes it for good: the consumer commits nothing more and the app
crashes the worker (``StreamsApp._fail``). The next worker restores the tables from the
changelogs and reads again from the offsets last committed, which its stages count once.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)


class WriteFailed(Exception):
    """Something the streams wrote (an output or a changelog record) did not reach the broker."""


class CommitGate:
    def __init__(self, on_failure: Callable[[BaseException], Awaitable[None]] | None = None) -> None:
        """``on_failure``: what to do once the gate closes (the app crashes the worker)."""
        self.on_failure = on_failure
        #: Why the gate closed (``None``: open).
        self.failure: BaseException | None = None
        self._writes: list[asyncio.Future] = []

    def track(self, futures: Iterable[asyncio.Future]) -> None:
        """Changelog writes sent: each must succeed before the offsets behind it are committed."""
        self._writes.extend(futures)

    def close(self, reason: BaseException) -> None:
        """Commit nothing more (the first reason is kept)."""
        if self.failure is None:
            self.failure = reason

    def check(self) -> None:
        """Raise ``WriteFailed`` if the gate is closed or a write tracked has failed; forget the
        writes that landed (those still in flight stay tracked)."""
        if self.failure is None:
            pending = []
            for write in self._writes:
                if not write.done():
                    pending.append(write)
                elif write.cancelled():
                    self.close(asyncio.CancelledError("a changelog write was cancelled"))
                elif write.exception() is not None:
                    self.close(write.exception())
            self._writes = pending
        if self.failure is not None:
            raise WriteFailed(f"{type(self.failure).__name__}: {self.failure}") from self.failure

    async def settle(self) -> None:
        """Check, and close the gate (calling ``on_failure``) if a write failed."""
        try:
            self.check()
        except WriteFailed as exc:
            if self.on_failure is not None:
                await self.on_failure(exc)
            raise


class GatedConsumer:
    """Mixin for Faust's aiokafka consumer (before it in the bases): each commit, made after
    Faust has flushed the producer, first checks ``gate`` (set on the class: Faust makes the
    consumer) and commits nothing when it is closed."""

    gate: CommitGate
    app: Any

    async def _commit(self, offsets: Mapping[Any, int]) -> bool:
        try:
            await self.gate.settle()
        except WriteFailed as exc:
            logger.error("not committing the offsets of %d partitions: %s", len(offsets), exc)
            return False
        return await super()._commit(offsets)  # type: ignore[misc]
