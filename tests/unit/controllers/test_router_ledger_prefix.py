"""Tests of controllers.router.ledger.PendingLedger and controllers.router.prefix.PrefixIndex."""

from __future__ import annotations

import pytest

from controllers.router.ledger import PendingLedger
from controllers.router.prefix import PrefixIndex

# --- the pending ledger --------------------------------------------------------------------------

# Steps: ("d", request, worker, tokens) dispatched; ("r", request) reported; ("f", worker)
# forgotten.
# Expected: {worker: (pending requests, pending prompt tokens)} after all steps.
LEDGER_CASES = [
    ("one dispatch", [("d", "r1", "w0", 100)], {"w0": (1, 100), "w1": (0, 0)}),
    ("two on one worker", [("d", "r1", "w0", 100), ("d", "r2", "w0", 50)],
     {"w0": (2, 150)}),
    ("reported", [("d", "r1", "w0", 100), ("d", "r2", "w0", 50), ("r", "r1")], {"w0": (1, 50)}),
    ("reported twice", [("d", "r1", "w0", 100), ("r", "r1"), ("r", "r1")], {"w0": (0, 0)}),
    ("unknown report", [("r", "ghost")], {"w0": (0, 0)}),
    ("re-dispatch moves", [("d", "r1", "w0", 100), ("d", "r1", "w1", 100)],
     {"w0": (0, 0), "w1": (1, 100)}),
    ("same dispatch twice", [("d", "r1", "w0", 100), ("d", "r1", "w0", 100)], {"w0": (1, 100)}),
    ("forget worker", [("d", "r1", "w0", 100), ("d", "r2", "w1", 7), ("d", "r3", "w0", 3),
                       ("f", "w0")], {"w0": (0, 0), "w1": (1, 7)}),
    ("forget then report", [("d", "r1", "w0", 100), ("f", "w0"), ("r", "r1")], {"w0": (0, 0)}),
]


@pytest.mark.parametrize(("steps", "expected"), [c[1:] for c in LEDGER_CASES],
                         ids=[c[0] for c in LEDGER_CASES])
def test_pending_ledger(steps: list[tuple], expected: dict[str, tuple[int, int]]) -> None:
    ledger = PendingLedger()
    for step in steps:
        match step:
            case ("d", rid, wid, tokens):
                ledger.dispatched(rid, wid, tokens)
            case ("r", rid):
                ledger.reported(rid)
            case ("f", wid):
                ledger.forget_worker(wid)
    for wid, (requests, tokens) in expected.items():
        assert (ledger.requests(wid), ledger.prompt_tokens(wid)) == (requests, tokens), wid


def test_a_moved_request_is_reported_once() -> None:
    ledger = PendingLedger()
    ledger.dispatched("r1", "w0", 10)
    ledger.dispatched("r1", "w1", 10)
    ledger.reported("r1")
    assert [ledger.requests(w) for w in ("w0", "w1")] == [0, 0]


# --- the prefix index ----------------------------------------------------------------------------

def test_exact_index_from_stored_evicted_and_cleared() -> None:
    index = PrefixIndex()
    index.stored("w0", [1, 2, 3, 4])
    assert index.is_exact("w0")
    assert index.overlap("w0", [1, 2, 3, 4, 5]) == 4
    index.evicted("w0", [3])
    assert index.overlap("w0", [1, 2, 3, 4]) == 2
    index.stored("w0", [3])
    assert index.overlap("w0", [1, 2, 3, 4]) == 4
    index.cleared("w0")
    assert index.overlap("w0", [1, 2, 3, 4]) == 0
    assert index.is_exact("w0")


@pytest.mark.parametrize(
    ("held", "hashes", "overlap"),
    [
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4, 5], 3),
        ([2, 3], [1, 2, 3], 0),  # leading blocks only: a miss on the first ends it
        ([1, 3, 4], [1, 2, 3, 4], 1),  # a hole ends the run
        ([1, 2], [], 0),
        ([], [1], 0),
    ],
)
def test_overlap_counts_leading_blocks_only(held: list[int], hashes: list[int],
                                            overlap: int) -> None:
    exact, estimated = PrefixIndex(), PrefixIndex()
    exact.stored("w", held)
    estimated.routed("w", held)
    assert exact.overlap("w", hashes) == overlap
    assert estimated.overlap("w", hashes) == overlap


def test_unknown_worker_has_no_overlap() -> None:
    index = PrefixIndex()
    assert index.overlap("nobody", [1, 2]) == 0
    assert not index.is_exact("nobody")


def test_estimated_from_routing_history() -> None:
    index = PrefixIndex()
    index.routed("w0", [10, 11, 12])
    index.routed("w1", [10, 20])
    assert not index.is_exact("w0")
    assert index.overlap("w0", [10, 11, 12, 13]) == 3
    assert index.overlap("w1", [10, 11]) == 1
    assert index.overlap("w1", [10, 20]) == 2


def test_estimates_are_bounded_least_recently_routed_first_out() -> None:
    index = PrefixIndex(estimated_blocks_per_worker=4)
    index.routed("w0", [1, 2, 3])
    index.routed("w0", [4, 5])  # 5 blocks into 4: block 1 goes
    assert index.overlap("w0", [2, 3]) == 2
    assert index.overlap("w0", [1]) == 0
    index.routed("w0", [2])  # 2 is now the most recent
    index.routed("w0", [6])  # evicts 3, the least recently routed
    assert index.overlap("w0", [2]) == 1
    assert index.overlap("w0", [3]) == 0
    assert [index.overlap("w0", [h]) for h in (4, 5, 6)] == [1, 1, 1]


def test_exact_worker_ignores_routing_estimates() -> None:
    index = PrefixIndex()
    index.stored("w0", [1])
    index.routed("w0", [1, 2, 3])
    assert index.overlap("w0", [1, 2, 3]) == 1


def test_kv_events_supersede_earlier_estimates() -> None:
    index = PrefixIndex()
    index.routed("w0", [1, 2, 3])
    index.stored("w0", [7])
    assert index.overlap("w0", [1, 2, 3]) == 0
    assert index.overlap("w0", [7]) == 1


def test_an_eviction_supersedes_earlier_estimates_too() -> None:
    """The first KV event heard of w0 is an eviction (a router started after its blocks were
    stored): w0 is known exactly from then on, and its estimates leave the holders index too.
    Before 7 Dec they stayed there: w0 stood alone as the deepest holder of [1, 2, 3], its
    overlap 0, and w1, which holds block 1, was left off the shortlist."""
    index = PrefixIndex()
    index.routed("w0", [1, 2, 3])
    index.stored("w1", [1])
    index.evicted("w0", [9])
    assert index.is_exact("w0") and index.overlap("w0", [1, 2, 3]) == 0
    assert index.deepest_holders([1, 2, 3]) == {"w1"}


def test_cleared_drops_estimates_too() -> None:
    index = PrefixIndex()
    index.routed("w0", [1, 2])
    index.cleared("w0")
    assert index.overlap("w0", [1, 2]) == 0


def test_routing_without_hashes_records_nothing() -> None:
    index = PrefixIndex()
    index.routed("w0", [])
    assert not index.is_exact("w0")
    assert index.overlap("w0", [1]) == 0
