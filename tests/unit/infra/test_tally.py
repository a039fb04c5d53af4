"""Tests of infra.tally.RunTally: terminal-state counts and stream verification."""

from __future__ import annotations

from typing import Any

import pytest

from infra.demo import _fault_report
from infra.faults import parse_fault
from infra.tally import RunTally
from schemas import events
from schemas.commands import SetBreakerState
from schemas.requests import ResponseChunk
from workers.engine import reference_token

T0 = 1_700_000_000_000
PREFIX = "run1-"


def chunk(rid: str, offset: int, count: int, final: bool = False,
          tokens: list[int] | None = None, attempt: int = 1) -> ResponseChunk:
    if tokens is None:
        tokens = [reference_token(rid, i) for i in range(offset, offset + count)]
    return ResponseChunk(event_time_ms=T0, request_id=rid, worker_id="w", token_offset=offset,
                         tokens=tokens, final=final, finish_reason="length" if final else None,
                         attempt=attempt)


def end(rid: str, offset: int, finish_reason: str) -> ResponseChunk:
    """The end of a stream that ends other than in an answer (``stream_end``)."""
    return ResponseChunk(event_time_ms=T0, request_id=rid, worker_id="router-0",
                         token_offset=offset, tokens=[], final=True, finish_reason=finish_reason)


def terminal(kind: str, rid: str) -> Any:
    common = dict(event_time_ms=T0, request_id=rid)
    return {
        "completed": lambda: events.Completed(**common, worker_id="w", prompt_tokens=1,
                                              output_tokens=1, e2e_s=1.0),
        "failed": lambda: events.Failed(**common, reason="worker_lost"),
        "rejected": lambda: events.Rejected(**common, reason="load_shed"),
        "cancelled": lambda: events.Cancelled(**common),
    }[kind]()


def tally_of(*messages: Any, sent: tuple[str, ...] = ()) -> RunTally:
    tally = RunTally(PREFIX)
    tally.sent.update(sent)
    for message in messages:
        tally.observe(message)
    return tally


# --- terminal states ------------------------------------------------------------------------------


def test_counts_terminal_states_and_unfinished() -> None:
    ids = [f"{PREFIX}{i}" for i in range(6)]
    tally = tally_of(
        events.Queued(event_time_ms=T0, request_id=ids[0], prompt_tokens=1, max_tokens=1,
                      created_ms=T0),
        terminal("completed", ids[0]),
        terminal("completed", ids[1]),
        terminal("failed", ids[2]),
        terminal("rejected", ids[3]),
        terminal("cancelled", ids[4]),
        sent=tuple(ids),
    )
    summary = tally.summary()
    assert summary["requests_sent"] == 6
    assert summary["accepted"] == 1
    assert (summary["completed"], summary["failed"], summary["rejected"], summary["cancelled"]) == (
        2, 1, 1, 1)
    assert summary["unfinished"] == 1  # ids[5] never reached a terminal state
    assert summary["multiple_terminal_states"] == 0
    assert tally.finished == 5


@pytest.mark.parametrize(
    ("kinds", "multiple"),
    [(["completed"], 0), (["completed", "completed"], 1), (["completed", "failed"], 1),
     (["rejected", "cancelled", "failed"], 1)],
)
def test_detects_more_than_one_terminal_state(kinds: list[str], multiple: int) -> None:
    rid = f"{PREFIX}x"
    tally = tally_of(*(terminal(k, rid) for k in kinds), sent=(rid,))
    summary = tally.summary()
    assert summary["multiple_terminal_states"] == multiple
    assert summary["unfinished"] == 0


def test_one_state_reported_by_two_attempts_is_repeated_not_multiple() -> None:
    rid = f"{PREFIX}x"
    done = dict(event_time_ms=T0, request_id=rid, worker_id="w", prompt_tokens=1,
                output_tokens=1, e2e_s=1.0)
    tally = tally_of(events.Completed(**done, attempt=2), events.Completed(**done, attempt=1),
                     sent=(rid,))
    summary = tally.summary()
    assert (summary["multiple_terminal_states"], summary["repeated_terminal_states"]) == (0, 1)


def test_a_replaced_attempts_late_failure_is_no_second_state() -> None:
    rid = f"{PREFIX}y"
    tally = tally_of(
        events.Started(event_time_ms=T0, request_id=rid, worker_id="w1"),
        events.Started(event_time_ms=T0, request_id=rid, worker_id="w2", attempt=2),
        events.Completed(event_time_ms=T0, request_id=rid, worker_id="w2", attempt=2,
                         prompt_tokens=1, output_tokens=1, e2e_s=1.0),
        events.Failed(event_time_ms=T0, request_id=rid, worker_id="w1", reason="engine_error"),
        sent=(rid,))
    summary = tally.summary()
    assert summary["multiple_terminal_states"] == 0 and summary["completed"] == 1
    assert summary["failed"] == 0


@pytest.mark.parametrize(("failed_attempt", "multiple"), [(1, 0), (3, 1)])
def test_a_late_failure_on_the_newest_attempts_worker_is_told_by_its_attempt(
        failed_attempt: int, multiple: int) -> None:
    """Attempt 1 on w1 replaced, attempt 3 back on w1 completed: w1's late failure of attempt 1
    is no second state (before 7 Dec a failure named no attempt, and w1 was the newest
    attempt's worker); one of attempt 3 is."""
    rid = f"{PREFIX}z"
    tally = tally_of(
        events.Started(event_time_ms=T0, request_id=rid, worker_id="w1"),
        events.Started(event_time_ms=T0, request_id=rid, worker_id="w1", attempt=3),
        events.Completed(event_time_ms=T0, request_id=rid, worker_id="w1", attempt=3,
                         prompt_tokens=1, output_tokens=1, e2e_s=1.0),
        events.Failed(event_time_ms=T0, request_id=rid, worker_id="w1", reason="engine_error",
                      attempt=failed_attempt),
        sent=(rid,))
    assert tally.summary()["multiple_terminal_states"] == multiple


def test_terminal_of_an_id_never_sent_is_not_finished() -> None:
    tally = tally_of(terminal("completed", f"{PREFIX}stray"), sent=(f"{PREFIX}a",))
    assert tally.finished == 0
    assert tally.summary()["unfinished"] == 1


def test_ids_without_the_prefix_are_ignored() -> None:
    other = "run2-0"
    tally = tally_of(
        events.Queued(event_time_ms=T0, request_id=other, prompt_tokens=1, max_tokens=1,
                      created_ms=T0),
        terminal("completed", other),
        events.FirstToken(event_time_ms=T0, request_id=other, worker_id="w", ttft_s=1.0),
        chunk(other, 0, 1, final=True, tokens=[0]),  # would be broken
    )
    summary = tally.summary()
    assert summary["accepted"] == summary["completed"] == 0
    assert summary["ttft_p50_s"] is None
    assert summary["streams_verified"] == summary["streams_broken"] == 0


def test_worker_status_records_live_slots() -> None:
    def ws(slot: int, state: str = "warm") -> events.WorkerStatus:
        return events.WorkerStatus(event_time_ms=T0, worker_id=f"w{slot}", slot=slot, pool="p",
                                   gpu_type="h100", state=state, started_ms=T0)

    tally = tally_of(ws(0), ws(3), ws(5, "stopped"))
    assert tally.workers_seen == {0, 3}


# --- stream verification --------------------------------------------------------------------------

RID = f"{PREFIX}s"

STREAM_CASES = {
    "whole-in-one": ([(0, 5, True)], "verified"),
    "contiguous": ([(0, 1, False), (1, 3, False), (4, 2, True)], "verified"),
    "duplicate-chunk": ([(0, 2, False), (0, 2, False), (2, 2, True)], "verified"),
    "overlapping-resume": ([(0, 3, False), (1, 4, True)], "verified"),
    "duplicate-final": ([(0, 2, False), (2, 1, True), (2, 1, True)], "verified"),
    "gap": ([(0, 2, False), (3, 2, True)], "broken"),
    "starts-late": ([(1, 3, True)], "broken"),
    "gap-then-fill": ([(0, 1, False), (2, 1, False), (1, 1, True)], "broken"),
}


@pytest.mark.parametrize("case", STREAM_CASES)
def test_stream_verification(case: str) -> None:
    chunks, verdict = STREAM_CASES[case]
    tally = tally_of(*(chunk(RID, off, n, final) for off, n, final in chunks))
    summary = tally.summary()
    assert summary["streams_verified"] == (verdict == "verified")
    assert summary["streams_broken"] == (verdict == "broken")


@pytest.mark.parametrize("bad_index", [0, 2, 4])
def test_a_wrong_token_breaks_the_stream(bad_index: int) -> None:
    tokens = [reference_token(RID, i) for i in range(5)]
    tokens[bad_index] = (tokens[bad_index] + 1) % 128_256
    tally = tally_of(chunk(RID, 0, 5, final=True, tokens=tokens))
    assert tally.summary()["streams_broken"] == 1
    assert tally.summary()["streams_verified"] == 0


def test_a_wrong_token_in_a_redelivered_chunk_breaks_the_stream() -> None:
    tally = tally_of(chunk(RID, 0, 2), chunk(RID, 0, 2, tokens=[reference_token(RID, 0), 7]),
                     chunk(RID, 2, 1, final=True))
    assert tally.summary()["streams_broken"] == 1


def _other(offset: int, count: int) -> list[int]:
    """Tokens a superseded attempt sampled differently from the reference from ``offset`` on."""
    return [(reference_token(RID, i) + 1) % 128_256 for i in range(offset, offset + count)]


def test_a_superseded_attempt_streaming_late_is_dropped_by_attempt() -> None:
    # Attempt 1's worker went silent at token 3; the router continued from 3 on attempt 2, and
    # attempt 1's worker, back, streamed on (its own sampling) until it read the supersede.
    tally = tally_of(chunk(RID, 0, 3), chunk(RID, 3, 2, attempt=2),
                     chunk(RID, 3, 4, tokens=_other(3, 4)), chunk(RID, 5, 2, True, attempt=2))
    assert tally.summary()["streams_verified"] == 1


def test_a_newer_attempt_replaces_what_the_reader_had_from_its_offset_on() -> None:
    # The reader got attempt 1's tokens 3-6 before the router, which had seen only 0-2,
    # continued from 3: attempt 2's tokens replace them.
    tally = tally_of(chunk(RID, 0, 3), chunk(RID, 3, 4, tokens=_other(3, 4)),
                     chunk(RID, 3, 2, attempt=2), chunk(RID, 5, 2, True, attempt=2))
    assert tally.summary()["streams_verified"] == 1
    # A wrong token before the newer attempt's offset stays wrong.
    bad = [reference_token(RID, 0), 7, reference_token(RID, 2)]
    tally = tally_of(chunk(RID, 0, 3, tokens=bad), chunk(RID, 3, 2, True, attempt=2))
    assert tally.summary()["streams_broken"] == 1


def test_streams_without_a_final_chunk_are_not_counted() -> None:
    tally = tally_of(chunk(RID, 0, 3), chunk(f"{PREFIX}t", 5, 1))
    summary = tally.summary()
    assert summary["streams_verified"] == summary["streams_broken"] == 0


def test_several_streams_are_verified_independently() -> None:
    a, b = f"{PREFIX}a", f"{PREFIX}b"
    tally = tally_of(chunk(a, 0, 2), chunk(b, 0, 1), chunk(b, 2, 1, final=True),
                     chunk(a, 2, 2, final=True))
    summary = tally.summary()
    assert (summary["streams_verified"], summary["streams_broken"]) == (1, 1)


# --- time to first token --------------------------------------------------------------------------


def first_token(rid: str, ttft_s: float) -> events.FirstToken:
    return events.FirstToken(event_time_ms=T0, request_id=rid, worker_id="w", ttft_s=ttft_s)


def test_ttft_percentiles() -> None:
    tally = tally_of(*(first_token(f"{PREFIX}{i}", (i + 1) / 100) for i in range(100)))
    summary = tally.summary()
    assert summary["ttft_p50_s"] == pytest.approx(0.505)
    assert summary["ttft_p99_s"] == pytest.approx(0.9901)


def test_ttft_keeps_the_first_report_of_each_request() -> None:
    rid = f"{PREFIX}r"
    tally = tally_of(first_token(rid, 0.2), first_token(rid, 9.0))  # a retry's later first token
    assert tally.ttft_s == {rid: 0.2}
    assert tally.summary()["ttft_p99_s"] == 0.2


def test_a_continuations_first_token_is_no_ttft_sample_even_read_first() -> None:
    """A continuation's first token (tokens streamed before it) read before the first attempt's,
    or with the first attempt's lost, was the demo's TTFT: seconds after the request was sent,
    on the p99 (the streams and ``report slo`` take no continuation's)."""
    rid, lost = f"{PREFIX}r", f"{PREFIX}lost"
    resumed = events.FirstToken(event_time_ms=T0, request_id=rid, worker_id="w2", ttft_s=6.0,
                                tokens_done=40, attempt=2)
    tally = tally_of(resumed, first_token(rid, 0.3), resumed.model_copy(
        update={"request_id": lost}))
    assert tally.ttft_s == {rid: 0.3}
    assert tally.summary()["ttft_p99_s"] == 0.3
    assert tally.continuation_ttft_s == {rid: 6.0, lost: 6.0}  # (bounds the SLO of ``lost``)


@pytest.mark.parametrize("slo_s, met", [(8.0, True), (5.0, False)])
def test_a_request_whose_first_token_was_lost_is_judged_by_its_continuations(slo_s, met):
    rid = f"{PREFIX}lost"
    tally = tally_of(
        events.Queued(event_time_ms=T0, request_id=rid, prompt_tokens=1, max_tokens=1,
                      created_ms=T0, ttft_slo_s=slo_s),
        events.FirstToken(event_time_ms=T0, request_id=rid, worker_id="w2", ttft_s=6.0,
                          tokens_done=40, attempt=2),
        terminal("completed", rid))
    assert tally.met_slo(rid) is met


def test_no_ttft_gives_none() -> None:
    summary = RunTally(PREFIX).summary()
    assert summary["ttft_p50_s"] is None and summary["ttft_p99_s"] is None
    assert summary["requests_sent"] == summary["unfinished"] == 0


def test_a_final_chunk_settles_the_stream_and_a_completed_request_without_one_is_unfinished(
        ) -> None:
    """A continuation the router made before it read the end of a whole answer (its follower
    behind), then cancelled, replaces nothing; a completed request whose stream never ended
    would leave its client waiting."""
    settled = tally_of(chunk(RID, 0, 3), chunk(RID, 3, 2, final=True),
                       chunk(RID, 2, 2, attempt=2), terminal("completed", RID))
    summary = settled.summary()
    assert (summary["streams_verified"], summary["streams_unfinished"]) == (1, 0)
    open_ended = tally_of(chunk(RID, 0, 3), terminal("completed", RID))
    assert open_ended.summary()["streams_unfinished"] == 1
    # any request that ends ends its stream (a refusal, a cancel, a failure: since 5 Dec)
    for kind, reason in (("failed", "error"), ("rejected", "error"), ("cancelled", "abort")):
        unended = tally_of(chunk(RID, 0, 3), terminal(kind, RID))
        assert unended.summary()["streams_unfinished"] == 1
        assert tally_of(terminal(kind, RID)).summary()["streams_unfinished"] == 1  # none read
        ended = tally_of(chunk(RID, 0, 3), end(RID, 3, reason), terminal(kind, RID)).summary()
        assert (ended["streams_unfinished"], ended["streams_verified"],
                ended["streams_broken"]) == (0, 0, 0)  # ended, not an answer to verify
    # the router ends a stream after the tokens it had read, which may be fewer than the
    # client's: the end counts whatever its offset
    behind = tally_of(chunk(RID, 0, 3), end(RID, 2, "error"), terminal("failed", RID)).summary()
    assert (behind["streams_unfinished"], behind["streams_broken"]) == (0, 0)


# --- breakers -------------------------------------------------------------------------------------


def breaker(state: str, at_ms: int, worker_id: str = "worker-0") -> SetBreakerState:
    return SetBreakerState(event_time_ms=at_ms, command_id=f"b-{at_ms}", issued_by="controllers",
                           worker_id=worker_id, state=state)


@pytest.mark.parametrize(("states", "after_s"), [
    # opened once the slowdown (at T0 + 5 s) took hold, restated open every few seconds
    ([("open", 7_000), ("open", 9_000)], 2.0),
    # opened before it (a paused worker's, or under load) and closed since: before 7 Dec the
    # report said -4.0, that first opening's time less the slowdown's
    ([("open", 1_000), ("open", 3_000), ("closed", 4_000), ("open", 7_500)], 2.5),
    # open before it and still open: it did not open after it
    ([("open", 1_000), ("open", 6_000)], None),
    ([("half_open", 6_000), ("closed", 7_000)], None),
])
def test_breaker_opened_after_s_counts_from_the_slowdown(states, after_s) -> None:
    tally = tally_of(*(breaker(state, T0 + at_ms) for state, at_ms in states),
                     breaker("open", T0 + 500, "worker-1"))
    slow = parse_fault("slow:0:5@5")
    report = _fault_report((slow,), {slow: T0 + 5_000}, tally)
    assert report["breaker_opened_after_s"] == after_s
