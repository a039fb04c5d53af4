"""Input partitions without a committed offset are read again from their start after a
rebalance, and Faust's consumer does not drop the replay as already delivered."""

import asyncio

from faust.types import TP

from streams.rewind import ReadOffsets, rewind_uncommitted

TELEMETRY_0, TELEMETRY_1 = TP("ns.telemetry", 0), TP("ns.telemetry", 1)
REQUESTS_0 = TP("ns.requests", 0)
CHANGELOG_0 = TP("ns.streams-requests-changelog", 0)


def delivered(offsets: ReadOffsets, tp, records) -> list[int]:
    """What Faust's drain loop lets through of ``records`` and the read offsets it leaves: a
    record below its partition's read offset is dropped as delivered already."""
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


def test_a_revoked_partition_forgets_its_rewind():
    offsets = ReadOffsets()
    offsets.rewind(TELEMETRY_0, 0)
    offsets.pop(TELEMETRY_0, None)
    assert not offsets.rewinding
    offsets[TELEMETRY_0] = 5
    assert offsets[TELEMETRY_0] == 5


class FaustConsumer:
    """The part of Faust's consumer that ``rewind_uncommitted`` uses, over a fixed assignment."""

    def __init__(self, committed: dict, earliest: dict, read_offsets: ReadOffsets) -> None:
        self.committed, self.earliest, self.read_offsets = committed, earliest, read_offsets
        self.positions: dict = {}

    async def seek_to_committed(self) -> dict:
        for tp, offset in self.committed.items():
            if offset:
                self.positions[tp] = offset
        return dict(self.committed)

    async def earliest_offsets(self, *tps) -> dict:
        return {tp: self.earliest[tp] for tp in tps}

    async def seek(self, tp, offset: int) -> None:  # as Faust's: sets the read offset too
        self.positions[tp] = offset
        self.read_offsets[tp] = offset if offset else None


def test_only_input_partitions_without_a_committed_offset_are_rewound():
    offsets = ReadOffsets()
    consumer = FaustConsumer(
        committed={TELEMETRY_0: 120, TELEMETRY_1: None, REQUESTS_0: 0, CHANGELOG_0: None},
        earliest={TELEMETRY_1: 0, REQUESTS_0: 30, CHANGELOG_0: 0}, read_offsets=offsets)
    rewound = asyncio.run(rewind_uncommitted(consumer, {"ns.telemetry", "ns.requests"}, offsets))
    assert set(rewound) == {TELEMETRY_1, REQUESTS_0}
    assert consumer.positions == {TELEMETRY_0: 120, TELEMETRY_1: 0, REQUESTS_0: 30}
    assert offsets.rewinding == {TELEMETRY_1: 0, REQUESTS_0: 30}
    assert offsets[REQUESTS_0] is None  # nothing is dropped until offset 30 comes again


def test_nothing_is_rewound_when_every_input_partition_has_a_committed_offset():
    offsets = ReadOffsets()
    consumer = FaustConsumer(committed={TELEMETRY_0: 3, CHANGELOG_0: None}, earliest={},
                             read_offsets=offsets)
    assert asyncio.run(rewind_uncommitted(consumer, {"ns.telemetry"}, offsets)) == []
    assert not offsets.rewinding
