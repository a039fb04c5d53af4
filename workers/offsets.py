"""Which offset of a partition is safe to commit when records finish out of order."""

import heapq

#: Finished offsets the heap may keep behind an open one, beyond as many as are open: past
#: that it is rebuilt from the open ones (a stream stuck for long, a busy worker behind it).
_SLACK = 64


class OffsetTracker:
    """Tracks records taken from one partition; commits only past those that are finished.

    A worker runs many requests at once and they finish in any order. Committing the offset of a
    finished record while an earlier one still runs would lose the earlier one if the worker died,
    so the committable position is the lowest offset still open. The heap holds the open
    offsets, and finished ones until they reach its top: at most twice as many as are open,
    plus ``_SLACK``.
    """

    def __init__(self) -> None:
        self._open: set[int] = set()
        self._heap: list[int] = []
        self._highest = -1

    def taken(self, offset: int) -> None:
        if offset <= self._highest:
            return  # a redelivery of a record already finished, or still open
        self._open.add(offset)
        heapq.heappush(self._heap, offset)
        self._highest = max(self._highest, offset)

    def finished(self, offset: int) -> None:
        self._open.discard(offset)
        while self._heap and self._heap[0] not in self._open:
            heapq.heappop(self._heap)
        if len(self._heap) > 2 * len(self._open) + _SLACK:  # finished ones behind an open one
            self._heap = sorted(self._open)  # (a sorted list is a heap)

    def passed(self, offset: int) -> None:
        """A record that needs no work (a cancellation, a dispatch recalled further on in its
        fetch): finished as soon as it is taken, so never in the heap. One still open (read
        again while its dispatch runs) stays open: its first reading still has work."""
        if offset not in self._open:
            self._highest = max(self._highest, offset)

    def committable(self) -> int | None:
        """The offset to commit (the next record to read after a restart), or None."""
        if self._highest < 0:
            return None
        return self._heap[0] if self._heap else self._highest + 1
