"""Input partitions without a committed offset are read again from their start after a rebalance.

Faust positions each newly assigned partition at the group's committed offset. During a
rebalance its consumer fetches records that it then drops: records of partitions paused before
they were delivered, batches abandoned when the generation changes, queues emptied when flow
control resumes. The seek to the committed offset brings those back. Where the group has no
committed offset (a worker killed within its first commit interval, a partition that had no
records yet), aiokafka does not seek, the fetch position stays past them, and they were lost:
a restarted worker in ``tests/integration/test_streams_cost.py`` missed the first events
produced after the restart (once in six fresh-clone CI runs).

The most frequent of those drops is gone at its source: the consumer keeps each fetch to the
partitions active when it began (``RewindingConsumer._getmany``). For the others, at the end of
every rebalance the app seeks each input partition without a committed offset to its first offset
(``rewind_uncommitted``). What the worker counted before comes back as a replay, which the
stages count once (observations carry their source identity, ``streams.stages``). A partition
without a committed offset holds little: Faust commits every second what the agents finished.

Two parts of Faust's consumer must let the replay through (``RewindingConsumer``):

* its read offsets (``ReadOffsets``): it drops a record below the offset of the last one it
  delivered from that partition, as delivered already. A record fetched before the seek and
  delivered after it would set that offset past the replay, so a partition being rewound has no
  read offset until the record at its start is delivered again;
* its commits: with no committed offset it commits past the highest run of acknowledged
  records, so such a record, acknowledged before the replay's, would commit past the replay and
  a second crash would lose it for good. A partition being rewound commits nothing until the
  record at its start is acknowledged.

If the log start moved past a rewind's start before the replay was fetched (retention deleting
a segment in that second), the record at the start never comes: the rewind then ends at the
first record delivered below one delivered before it, or else (and the partition's commits
wait) until the next rebalance.
"""

from collections.abc import Hashable

from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer


class ReadOffsets(dict):
    """Faust's consumer's read offsets by partition (its ``_read_offset``), with rewinds.

    ``rewinding``: partition -> start, until the record at the start is delivered again;
    ``unacked``: partition -> start, until it is acknowledged (commits wait for that).
    """

    def __init__(self) -> None:
        super().__init__()
        self.rewinding: dict[Hashable, int] = {}
        self.unacked: dict[Hashable, int] = {}
        self._highest: dict[Hashable, int] = {}  # delivered during the rewind

    def rewind(self, tp: Hashable, start: int) -> None:
        """``tp`` was sought back to ``start``: deliver everything until ``start`` comes again."""
        self.rewinding[tp] = self.unacked[tp] = start
        self._highest.pop(tp, None)
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
            if offset is None:
                return
            highest = self._highest.get(tp)
            if offset > start and (highest is None or offset >= highest):
                self._highest[tp] = offset  # fetched before the seek, or the replay goes on
                return
            if offset > start:  # below a record delivered before: the replay starts here
                self.unacked[tp] = offset
            del self.rewinding[tp]
            self._highest.pop(tp, None)
        super().__setitem__(tp, offset)

    def pop(self, tp: Hashable, *default):
        """Faust forgets a revoked partition's offset: its rewind goes with it."""
        self.rewinding.pop(tp, None)
        self.unacked.pop(tp, None)
        self._highest.pop(tp, None)
        return super().pop(tp, *default)


class RewindingConsumer(AIOKafkaConsumer):
    """Faust's aiokafka consumer, with ``ReadOffsets``, commits that wait for a replay, and
    fetches that take only the partitions active when they began."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = ReadOffsets()

    async def _getmany(self, active_partitions, timeout):
        """Faust hands its consumer thread its live set of active partitions, and aiokafka reads
        an empty set as every partition. When the tables' recovery paused the changelog
        partitions while a fetch was waiting, the set was empty for a moment, the fetch took
        the records aiokafka had buffered for the still inactive stream partitions, and Faust
        dropped them as inactive, past the fetch position (the restart loss of
        ``tests/integration/test_streams_cost.py``: 4 of 6 runs lost everything once the
        rewind's seek landed in that moment). A copy keeps the fetch to what was active."""
        if active_partitions is not None:
            active_partitions = set(active_partitions)
        return await super()._getmany(active_partitions, timeout)

    def _new_offset(self, tp):
        start = self._read_offset.unacked.get(tp)
        if start is not None:
            acked = self._acked[tp]
            if not acked or min(acked) > start:
                return None  # the replay has not reached its start: commit nothing yet
            del self._read_offset.unacked[tp]
        return super()._new_offset(tp)


async def rewind_uncommitted(consumer, inputs: set[str]) -> list:
    """Seek every assigned partition of ``inputs`` that has no committed offset to its first
    offset (``consumer``: a ``RewindingConsumer``); returns the partitions rewound.

    Nothing is done if a new rebalance began meanwhile: that one rewinds in its turn."""
    assigned = [tp for tp in consumer.assignment() if tp.topic in inputs]
    if not assigned:
        return []  # aiokafka refuses to look up committed offsets with nothing assigned
    rebalance = consumer.app.rebalancing_count
    committed = await consumer.seek_to_committed()
    uncommitted = [tp for tp in assigned if not committed.get(tp)]
    if not uncommitted:
        return []
    starts = await consumer.earliest_offsets(*uncommitted)
    if consumer.app.rebalancing_count != rebalance:
        return []
    await consumer.seek_wait(starts)  # in the consumer's own thread, as Faust's recovery seeks
    if consumer.app.rebalancing_count != rebalance:  # (its revocation cleared what it takes
        return []  # back: kept, a rewind of a partition given back later held its commits)
    for tp, start in starts.items():
        consumer._read_offset.rewind(tp, start)
    return list(starts)
