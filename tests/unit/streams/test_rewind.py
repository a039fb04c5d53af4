"""Input partitions without a committed offset are read again from their start after a
rebalance; Faust's consumer neither drops the replay as delivered already nor commits past it."""

import asyncio
from types import SimpleNamespace

from faust.types import TP

from streams.app import StreamsApp
from streams.rewind import ReadOffsets, rewind_uncommitted
from streams.worker import settings_for

TELEMETRY_0, TELEMETRY_1 = TP("ns.telemetry", 0), TP("ns.telemetry", 1)
REQUESTS_0 = TP("ns.requests", 0)
CHANGELOG_0 = TP("ns.streams-requests-changelog", 0)
INPUTS = {"ns.telemetry", "ns.requests"}


def delivered(offsets: ReadOffsets, tp, records) -> list[int]:
    """What Faust's drain loop lets through of ``records``: a record below its partition's read
    offset is dropped as delivered already; each one let through sets the read offset."""
    through = []
    for offset in records:
        last = offsets[tp]
        if last is None or offset >= last:
            through.append(offset)
            offsets[tp] = offset
    return through


def test_a_missing_partition_has_no_read_offset_and_is_not_added():
    offsets = ReadOffsets()
    assert offsets[TELEMETRY_0] is None and TELEMETRY_0 not in offsets


def test_without_a_rewind_a_record_below_the_read_offset_is_dropped():
    offsets = ReadOffsets()
    assert delivered(offsets, TELEMETRY_0, [7, 3, 4, 8]) == [7, 8]


def test_a_record_fetched_before_the_seek_does_not_hide_the_replay():
    offsets = ReadOffsets()
    offsets[TELEMETRY_0] = 2
    offsets.rewind(TELEMETRY_0, 0)
    # 7 was fetched before the seek to 0 and is delivered after it; 0..6 are the replay.
    assert delivered(offsets, TELEMETRY_0, [7, 0, 1, 2, 3, 4, 5, 6, 7, 8]) == [
        7, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert TELEMETRY_0 not in offsets.rewinding  # the start came again: the rewind is over
    assert offsets[TELEMETRY_0] == 8
    assert delivered(offsets, TELEMETRY_0, [5, 9]) == [9]  # filtering as before


def test_a_rewind_ends_at_its_start_and_other_partitions_filter_as_before():
    offsets = ReadOffsets()
    offsets[TELEMETRY_1] = 10
    offsets.rewind(TELEMETRY_0, 40)
    assert delivered(offsets, TELEMETRY_0, [55, 40]) == [55, 40]
    assert offsets[TELEMETRY_0] == 40 and not offsets.rewinding
    assert delivered(offsets, TELEMETRY_1, [9, 11]) == [11]


def test_a_replay_that_starts_past_the_start_ends_the_rewind_where_it_starts():
    # Retention removed offsets 0..19 between the seek and the fetch: the replay begins at 20.
    offsets = ReadOffsets()
    offsets.rewind(TELEMETRY_0, 0)
    assert delivered(offsets, TELEMETRY_0, [31, 32, 20, 21]) == [31, 32, 20, 21]
    assert not offsets.rewinding and offsets.unacked == {TELEMETRY_0: 20}


def test_a_revoked_partition_forgets_its_rewind():
    offsets = ReadOffsets()
    offsets.rewind(TELEMETRY_0, 0)
    offsets.pop(TELEMETRY_0, None)
    assert not offsets.rewinding and not offsets.unacked
    offsets[TELEMETRY_0] = 5
    assert offsets[TELEMETRY_0] == 5


def _acked(consumer, tp, offsets) -> None:
    """What Faust's ``ack`` records of records acknowledged by the streams."""
    consumer._acked[tp].extend(offsets)
    consumer._acked_index[tp].update(offsets)


def test_a_rewound_partition_commits_nothing_until_the_replay_start_is_acknowledged(tmp_path):
    consumer = StreamsApp(settings_for("ns", "127.0.0.1:1"), datadir=tmp_path).app.consumer
    consumer._read_offset.rewind(TELEMETRY_0, 0)
    _acked(consumer, TELEMETRY_0, [7, 8])  # fetched before the seek, acknowledged first
    assert consumer._filter_committable_offsets([TELEMETRY_0]) == {}  # not past 0..6
    _acked(consumer, TELEMETRY_0, [0, 1, 2])
    assert consumer._filter_committable_offsets([TELEMETRY_0]) == {TELEMETRY_0: 3}
    # Without a rewind Faust's own rule applies: the lowest run of acknowledged offsets.
    _acked(consumer, TELEMETRY_1, [7, 8])
    assert consumer._filter_committable_offsets([TELEMETRY_1]) == {TELEMETRY_1: 9}


def test_a_fetch_keeps_to_the_partitions_active_when_it_began(tmp_path):
    consumer = StreamsApp(settings_for("ns", "127.0.0.1:1"), datadir=tmp_path).app.consumer
    active = {CHANGELOG_0}  # Faust's live set, during the recovery of the tables
    fetching = []

    class ConsumerThread:  # the consumer thread's side, as Faust's aiokafka driver calls it
        async def getmany(self, partitions, timeout):
            consumer.pause_partitions(active)  # recovery done: the live set is empty now
            fetching.append(set(partitions))  # what aiokafka filters the buffered records by
            return {}

    consumer._thread = ConsumerThread()
    consumer._active_partitions = active
    asyncio.run(consumer._getmany(active, 1.0))
    assert active == set()  # aiokafka would read that as every partition
    assert fetching == [{CHANGELOG_0}]


class FaustConsumer:
    """The part of Faust's consumer that ``rewind_uncommitted`` uses, over a fixed assignment."""

    def __init__(self, committed: dict, earliest: dict) -> None:
        self.committed, self.earliest = committed, earliest
        self._read_offset = ReadOffsets()
        self.app = SimpleNamespace(rebalancing_count=1)
        self.positions: dict = {}
        self.on_earliest = self.on_seek = lambda: None

    def assignment(self) -> set:
        return set(self.committed)

    async def seek_to_committed(self) -> dict:
        assert self.committed, "No partitions are currently assigned"  # as aiokafka's
        for tp, offset in self.committed.items():
            if offset:
                self.positions[tp] = offset
        return dict(self.committed)

    async def earliest_offsets(self, *tps) -> dict:
        self.on_earliest()
        return {tp: self.earliest[tp] for tp in tps}

    async def seek_wait(self, starts: dict) -> None:  # as Faust's: sets the read offsets too
        self.on_seek()
        for tp, offset in starts.items():
            self.positions[tp] = offset
            self._read_offset[tp] = offset if offset else None


def test_only_input_partitions_without_a_committed_offset_are_rewound():
    consumer = FaustConsumer(
        committed={TELEMETRY_0: 120, TELEMETRY_1: None, REQUESTS_0: 0, CHANGELOG_0: None},
        earliest={TELEMETRY_1: 0, REQUESTS_0: 30, CHANGELOG_0: 0})
    rewound = asyncio.run(rewind_uncommitted(consumer, INPUTS))
    assert set(rewound) == {TELEMETRY_1, REQUESTS_0}
    assert consumer.positions == {TELEMETRY_0: 120, TELEMETRY_1: 0, REQUESTS_0: 30}
    offsets = consumer._read_offset
    assert offsets.rewinding == offsets.unacked == {TELEMETRY_1: 0, REQUESTS_0: 30}
    assert offsets[REQUESTS_0] is None  # nothing is dropped until offset 30 comes again


def test_nothing_is_rewound_when_every_input_partition_has_a_committed_offset():
    consumer = FaustConsumer(committed={TELEMETRY_0: 3, CHANGELOG_0: None}, earliest={})
    assert asyncio.run(rewind_uncommitted(consumer, INPUTS)) == []
    assert not consumer._read_offset.rewinding


def test_a_worker_with_no_partitions_rewinds_nothing_and_does_not_fail():
    consumer = FaustConsumer(committed={}, earliest={})
    assert asyncio.run(rewind_uncommitted(consumer, INPUTS)) == []


def test_nothing_is_rewound_when_a_new_rebalance_began_meanwhile():
    consumer = FaustConsumer(committed={TELEMETRY_1: None}, earliest={TELEMETRY_1: 0})

    def rebalance():
        consumer.app.rebalancing_count += 1

    consumer.on_earliest = rebalance
    assert asyncio.run(rewind_uncommitted(consumer, INPUTS)) == []
    assert consumer.positions == {} and not consumer._read_offset.rewinding


def test_no_rewind_is_kept_when_a_new_rebalance_began_during_the_seek():
    """The revocation cleared the partition's read state: a rewind recorded after it, of a
    partition that came back later with a committed offset, held back its commits until the
    next rebalance (the review of 5 Dec, from the code)."""
    consumer = FaustConsumer(committed={TELEMETRY_1: None}, earliest={TELEMETRY_1: 0})

    def rebalance():
        consumer.app.rebalancing_count += 1

    consumer.on_seek = rebalance
    assert asyncio.run(rewind_uncommitted(consumer, INPUTS)) == []
    assert not consumer._read_offset.rewinding and not consumer._read_offset.unacked
