"""Tests of workers.offsets.OffsetTracker: commit only past records that are finished."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.offsets import OffsetTracker


def tracker(*offsets: int) -> OffsetTracker:
    t = OffsetTracker()
    for offset in offsets:
        t.taken(offset)
    return t


def test_nothing_taken_means_nothing_to_commit() -> None:
    assert OffsetTracker().committable() is None


def test_open_records_hold_the_position() -> None:
    t = tracker(5, 6, 7)
    assert t.committable() == 5


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ([], 0),
        ([1], 0),
        ([1, 2], 0),
        ([0], 1),
        ([2, 0], 1),
        ([0, 1], 2),
        ([3, 1, 0], 2),
        ([3, 2, 1], 0),
        ([0, 1, 2], 3),
        ([2, 1, 0, 3], 4),
    ],
)
def test_out_of_order_finishes(finish: list[int], expected: int) -> None:
    t = tracker(0, 1, 2, 3)
    for offset in finish:
        t.finished(offset)
    assert t.committable() == expected


def test_all_finished_commits_past_the_highest() -> None:
    t = tracker(10, 11, 15)  # gaps (compacted or transactional topics) are fine
    for offset in (15, 10, 11):
        t.finished(offset)
    assert t.committable() == 16


def test_redelivery_of_a_finished_record_is_ignored() -> None:
    t = tracker(0, 1, 2)
    t.finished(0)
    t.finished(1)
    t.taken(0)  # read again after a rebalance
    t.taken(1)
    assert t.committable() == 2
    t.finished(2)
    assert t.committable() == 3


def test_redelivery_of_an_open_record_changes_nothing() -> None:
    t = tracker(0, 1)
    t.taken(0)
    assert t.committable() == 0
    t.finished(0)
    assert t.committable() == 1


def test_finishing_twice_or_an_unknown_offset_is_harmless() -> None:
    t = tracker(0, 1)
    t.finished(0)
    t.finished(0)
    t.finished(99)
    assert t.committable() == 1


def test_new_records_after_everything_finished() -> None:
    t = tracker(0)
    t.finished(0)
    assert t.committable() == 1
    t.taken(1)
    assert t.committable() == 1
    t.taken(2)
    t.finished(2)
    assert t.committable() == 1
    t.finished(1)
    assert t.committable() == 3


@settings(max_examples=200, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 1000), min_size=1, max_size=60, unique=True).map(sorted),
    data=st.data(),
)
def test_committable_never_passes_an_open_record(offsets: list[int], data: st.DataObject) -> None:
    order = data.draw(st.permutations(offsets))
    redeliver = data.draw(st.lists(st.sampled_from(offsets), max_size=10))
    t = tracker(*offsets)
    still_open = set(offsets)
    last = t.committable()
    for i, offset in enumerate(order):
        t.finished(offset)
        still_open.discard(offset)
        if i < len(redeliver) and redeliver[i] not in still_open:
            t.taken(redeliver[i])  # a finished record read again must not reopen
        position = t.committable()
        assert position is not None
        if still_open:
            assert position == min(still_open)
        assert position >= last  # a commit never moves back
        last = position
    assert t.committable() == max(offsets) + 1


def test_a_record_passed_over_does_not_hold_the_commit_back() -> None:
    t = tracker(3)
    t.passed(4)  # a dispatch recalled further on in its fetch
    assert t.committable() == 3  # 3 still runs
    t.finished(3)
    assert t.committable() == 5


def test_passing_an_open_record_leaves_it_open() -> None:
    """A record read again while its dispatch runs (and dropped as a redelivery) needs no work
    of its own, but the first reading still does: the commit waits for it. Before, ``passed``
    finished it, and the commit passed a request still running (lost if the worker died)."""
    t = tracker(5, 6)
    t.passed(5)
    assert t.committable() == 5
    t.finished(5)
    t.finished(6)
    assert t.committable() == 7


def test_a_record_open_for_long_holds_no_more_entries_than_the_records_open() -> None:
    """One stream stuck (its request running for good) while the worker passes and finishes
    100,000 records behind it: before, each of them stayed in the tracker's heap (about one
    entry per record read, for as long as the stream was stuck)."""
    t = tracker(0)
    for offset in range(1, 100_001):
        if offset % 2:
            t.passed(offset)  # a cancellation
        else:
            t.taken(offset)  # a dispatch, run and finished
            t.finished(offset)
    assert t.committable() == 0
    assert len(t._heap) <= 100
    t.finished(0)
    assert t.committable() == 100_001


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["take", "take", "finish", "pass", "again"]),
                              st.integers(0, 7)), min_size=50, max_size=400))
def test_the_position_is_the_lowest_open_record_whatever_is_taken_passed_and_finished(ops) -> None:
    """Against a plain model, records read in order (a few read again, taken or passed) and
    finished out of order; the slack small, so that the heap is rebuilt often."""
    with mock.patch("workers.offsets._SLACK", 2):
        _check_against_a_model(ops)


def _check_against_a_model(ops: list[tuple[str, int]]) -> None:
    t, still_open, read = OffsetTracker(), set(), 0
    for op, back in ops:
        earlier = max(read - 1 - back, 0)
        if op in ("again", "finish") and not read:
            continue
        if op == "take":
            t.taken(read)
            still_open.add(read)
        elif op == "pass":
            t.passed(read)
        elif op == "again":  # read again: as taken, or passed (a redelivery dropped)
            t.taken(earlier) if back % 2 else t.passed(earlier)
        else:
            t.finished(earlier)
            still_open.discard(earlier)
        read += op in ("take", "pass")
        expected = min(still_open) if still_open else (read if read else None)
        assert t.committable() == expected
        assert len(t._heap) <= 2 * len(still_open) + 2
