"""Which entries of a table a sweep has to look at: its keys by the time they next fall due. Pure.

The request and task books forget finished entries minutes after they end (so that a late
duplicate still finds them) and time out idle ones. A sweep that read every entry of a partition
cost more the more the table held: at 5,000 events/s the requests table holds some 400,000
entries after five minutes, and reading them all every 30 s of event time stalled the worker for
a second and more (the signal lag's p99 rose with each sweep). Here each entry is filed under its
deadline, the event time after which the book's sweep acts on it, as the entry is written; a
sweep reads only the entries whose deadline has passed.

``deadline(value)`` must say exactly when the book's sweep would act (``None``: never, until the
entry changes). The index is kept in memory only: after a restart or a rebalance it is rebuilt
from the table, one partition at a time, by ``index_partition``.
"""

from collections.abc import Callable, Hashable, Iterable
from typing import Any


class ExpiryIndex:
    def __init__(self, deadline: Callable[[Any], int | None]) -> None:
        self.deadline = deadline
        self._filed: dict[Hashable, tuple[int | None, int]] = {}  # key -> (partition, second)
        self._seconds: dict[int | None, dict[int, dict[Hashable, int]]] = {}  # -> key: deadline
        self.indexed: set[int | None] = set()  # the partitions rebuilt from the table

    def note(self, key: Hashable, partition: int | None, value: Any) -> None:
        """``key`` was written with ``value`` (in ``partition``)."""
        due = self.deadline(value)
        if due is None:
            self.forget(key)
            return
        second = due // 1000
        filed = self._filed.get(key)
        if filed is not None and filed != (partition, second):
            self._unfile(key, filed)
        self._filed[key] = (partition, second)
        self._seconds.setdefault(partition, {}).setdefault(second, {})[key] = due

    def forget(self, key: Hashable) -> None:
        filed = self._filed.pop(key, None)
        if filed is not None:
            self._unfile(key, filed)

    def index_partition(self, partition: int | None, entries: Iterable[tuple[Hashable, Any]]) -> None:
        """File every ``(key, value)`` of a partition (after a restart or a rebalance)."""
        for key, value in entries:
            self.note(key, partition, value)
        self.indexed.add(partition)

    def reset(self) -> None:
        """Forget everything: the partitions must be indexed again (the assignment changed)."""
        self._filed.clear()
        self._seconds.clear()
        self.indexed.clear()

    def due(self, partition: int | None, now_ms: int) -> list[Hashable]:
        """Take out the keys of ``partition`` whose deadline is before ``now_ms``, earliest second
        first; the caller files again (``note``) those it keeps."""
        seconds = self._seconds.get(partition)
        if not seconds:
            return []
        last = now_ms // 1000
        out: list[Hashable] = []
        for second in sorted(s for s in seconds if s <= last):
            keys = seconds[second]
            if second < last:
                taken = list(keys)
                del seconds[second]
            else:  # the current second: only what is due before ``now_ms``
                taken = [key for key, due in keys.items() if due < now_ms]
                for key in taken:
                    del keys[key]
                if not keys:
                    del seconds[second]
            for key in taken:
                del self._filed[key]
            out += taken
        return out

    def __len__(self) -> int:
        return len(self._filed)

    def _unfile(self, key: Hashable, filed: tuple[int | None, int]) -> None:
        partition, second = filed
        keys = self._seconds[partition][second]
        del keys[key]
        if not keys:
            del self._seconds[partition][second]
