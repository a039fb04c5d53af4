"""Input partitions without a committed offset are read again from their start after a rebalance.

Faust positions each newly assigned partition at the group's committed offset. During a
rebalance its consumer fetches records that it then drops: records of partitions paused before
they were delivered, batches abandoned when the generation changes, queues emptied when flow
control resumes. The seek to the committed offset brings those back. Where the group has no
committed offset (a worker killed within its first commit interval, a partition that had no
records yet), aiokafka does not seek, the fetch position stays past them, and they were lost:
a restarted worker in ``tests/integration/test_streams_cost.py`` missed the first events
produced after the restart (once in six fresh-clone CI runs).

So at the end of every rebalance the app seeks each such input partition to its first offset.
What the worker counted before comes back as a replay, which the stages count once
(observations carry their source identity, ``streams.stages``). A partition without a committed
offset holds little: Faust commits every second what the agents finished.

``ReadOffsets`` keeps Faust from dropping the replay. Faust's consumer remembers the offset of
the last record it delivered per partition and drops a record below it as already delivered.
A record fetched before the seek and delivered after it would set that offset past the records
the seek is to bring back, so a partition being rewound has no read offset until the record at
its start is delivered again.
"""

from collections.abc import Hashable


class ReadOffsets(dict):
    """Faust's consumer's read offsets by partition (its ``_read_offset``), with rewinds."""

    def __init__(self) -> None:
        super().__init__()
        self.rewinding: dict[Hashable, int] = {}

    def rewind(self, tp: Hashable, start: int) -> None:
        """``tp`` was sought back to ``start``: deliver everything until ``start`` comes again."""
        self.rewinding[tp] = start
        super().pop(tp, None)

    def __missing__(self, tp: Hashable) -> None:
        return None  # Faust's own is a defaultdict of None

    def __getitem__(self, tp: Hashable) -> int | None:
        if tp in self.rewinding:
            return None
        return super().__getitem__(tp)

    def __setitem__(self, tp: Hashable, offset: int | None) -> None:
        start = self.rewinding.get(tp)
        if start is not None:
            if offset is None or offset > start:
                return  # a record fetched before the seek: the rewind goes on
            del self.rewinding[tp]
        super().__setitem__(tp, offset)

    def pop(self, tp: Hashable, *default):
        """Faust forgets a revoked partition's offset: its rewind goes with it."""
        self.rewinding.pop(tp, None)
        return super().pop(tp, *default)


async def rewind_uncommitted(consumer, inputs: set[str], read_offsets: ReadOffsets) -> list:
    """Seek every assigned partition of ``inputs`` that has no committed offset to its first
    offset (``consumer``: Faust's); returns the partitions rewound."""
    committed = await consumer.seek_to_committed()
    uncommitted = [tp for tp, offset in committed.items() if not offset and tp.topic in inputs]
    if not uncommitted:
        return []
    starts = await consumer.earliest_offsets(*uncommitted)
    for tp, start in starts.items():
        await consumer.seek(tp, start)
        read_offsets.rewind(tp, start)
    return list(starts)
