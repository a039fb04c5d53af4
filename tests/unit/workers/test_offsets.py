"""Tests of workers.offsets.OffsetTracker: commit only past records that are finished."""

from __future__ import annotations

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
