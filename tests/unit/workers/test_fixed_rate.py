"""Tests of workers.fixed_rate.FixedRateEngine, driven by an explicit clock (no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.engine import EngineRequest, TokenBatch, reference_token
from workers.fixed_rate import FixedRateEngine

PREFILL = 1000.0  # tokens/s
DECODE = 10.0  # tokens/s: one token every 0.1 s


def engine(max_num_seqs: int = 64) -> FixedRateEngine:
    return FixedRateEngine(prefill_tokens_per_s=PREFILL, decode_tokens_per_s=DECODE,
                           max_num_seqs=max_num_seqs)


def req(rid: str = "r1", prompt: int = 500, max_tokens: int = 5, resume: int = 0) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_tokens=prompt, max_tokens=max_tokens,
                         resume_from_token=resume)


def run_to_end(eng: FixedRateEngine, limit: int = 10_000) -> list[tuple[float, TokenBatch]]:
    """Advance to each next_event_s until idle; the batches with the time they came out."""
    out = []
    for _ in range(limit):
        at = eng.next_event_s()
        if at is None:
            return out
        out += [(at, b) for b in eng.advance(at)]
    raise AssertionError("engine never went idle")


def tokens_of(batches: list[TokenBatch], rid: str) -> list[int]:
    return [t for b in batches if b.request_id == rid for t in b.tokens]


# --- one request on its own -----------------------------------------------------------------------


def test_isolated_request_timing_and_tokens() -> None:
    eng = engine()
    eng.add(req(prompt=500, max_tokens=5), now_s=10.0)
    first_at = 10.0 + 500 / PREFILL
    assert eng.next_event_s() == pytest.approx(first_at)
    assert eng.advance(first_at - 1e-6) == []
    timeline = run_to_end(eng)
    assert [at for at, _ in timeline] == pytest.approx([first_at + i / DECODE for i in range(5)])
    batches = [b for _, b in timeline]
    assert [b.token_offset for b in batches] == [0, 1, 2, 3, 4]
    assert [len(b.tokens) for b in batches] == [1] * 5
    assert tokens_of(batches, "r1") == [reference_token("r1", i) for i in range(5)]
    assert [b.first for b in batches] == [True, False, False, False, False]
    assert [b.finished for b in batches] == [False, False, False, False, True]
    assert [b.finish_reason for b in batches] == [None, None, None, None, "length"]
    assert eng.next_event_s() is None
    assert eng.stats().running == eng.stats().waiting == 0


def test_a_late_advance_returns_every_due_token_in_one_batch() -> None:
    eng = engine()
    eng.add(req(prompt=100, max_tokens=50), now_s=0.0)
    first_at = 0.1
    [batch] = eng.advance(first_at + 2.05)  # the first token plus 20 decode steps
    assert batch.token_offset == 0
    assert batch.tokens == tuple(reference_token("r1", i) for i in range(21))
    assert batch.first and not batch.finished
    assert eng.next_event_s() == pytest.approx(first_at + 21 / DECODE)
    [rest] = eng.advance(1000.0)
    assert rest.token_offset == 21
    assert len(rest.tokens) == 29
    assert rest.finished and rest.finish_reason == "length" and not rest.first
    assert eng.advance(2000.0) == []


def test_no_token_before_prefill_and_advance_is_idempotent_in_time() -> None:
    eng = engine()
    eng.add(req(prompt=1000, max_tokens=3), now_s=0.0)
    assert eng.advance(0.5) == []
    assert len(eng.advance(1.0)) == 1
    assert eng.advance(1.0) == []  # nothing new at the same instant
    assert eng.advance(1.05) == []


def test_single_token_request_finishes_on_its_first_batch() -> None:
    eng = engine()
    eng.add(req(max_tokens=1, prompt=0), now_s=3.0)
    assert eng.next_event_s() == 3.0  # an empty prompt needs no prefill
    [batch] = eng.advance(3.0)
    assert (batch.first, batch.finished, batch.finish_reason) == (True, True, "length")
    assert batch.tokens == (reference_token("r1", 0),)


@pytest.mark.parametrize("resume", [1, 3, 9])
def test_resume_emits_only_the_remaining_tokens(resume: int) -> None:
    eng = engine()
    eng.add(req(prompt=500, max_tokens=10, resume=resume), now_s=0.0)
    # A continuation re-reads the prompt and the tokens already sent.
    assert eng.next_event_s() == pytest.approx((500 + resume) / PREFILL)
    batches = [b for _, b in run_to_end(eng)]
    assert batches[0].token_offset == resume
    assert batches[0].first is True
    assert [b.first for b in batches[1:]] == [False] * (len(batches) - 1)
    assert tokens_of(batches, "r1") == [reference_token("r1", i) for i in range(resume, 10)]
    assert batches[-1].finished and batches[-1].token_offset + len(batches[-1].tokens) == 10


def test_resume_with_nothing_left_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing left"):
        engine().add(req(max_tokens=5, resume=5), now_s=0.0)


# --- several requests -----------------------------------------------------------------------------


def test_concurrent_requests_decode_independently() -> None:
    eng = engine()
    eng.add(req("a", prompt=100, max_tokens=4), now_s=0.0)
    eng.add(req("b", prompt=300, max_tokens=2), now_s=0.0)
    timeline = run_to_end(eng)
    batches = [b for _, b in timeline]
    assert tokens_of(batches, "a") == [reference_token("a", i) for i in range(4)]
    assert tokens_of(batches, "b") == [reference_token("b", i) for i in range(2)]
    firsts = {b.request_id: at for at, b in timeline if b.first}
    assert firsts == pytest.approx({"a": 0.1, "b": 0.3})
    assert eng.stats().running == 0


def test_max_num_seqs_queues_in_fifo_order() -> None:
    eng = engine(max_num_seqs=2)
    for rid in ["a", "b", "c", "d"]:
        eng.add(req(rid, prompt=100, max_tokens=2), now_s=0.0)
    assert (eng.stats().running, eng.stats().waiting) == (2, 2)
    # a and b: first token at 0.1, last at 0.2; then c and d are admitted.
    out = eng.advance(0.1)
    assert {b.request_id for b in out} == {"a", "b"}
    assert (eng.stats().running, eng.stats().waiting) == (2, 2)
    done = eng.advance(0.2)
    assert {b.request_id for b in done if b.finished} == {"a", "b"}
    assert (eng.stats().running, eng.stats().waiting) == (2, 0)
    assert eng.next_event_s() == pytest.approx(0.3)  # admitted at 0.2, prefill 0.1 s
    rest = [b for _, b in run_to_end(eng)]
    assert {b.request_id for b in rest} == {"c", "d"}
    assert tokens_of(rest, "c") == [reference_token("c", i) for i in range(2)]


def test_waiting_requests_are_admitted_one_at_a_time_in_arrival_order() -> None:
    eng = engine(max_num_seqs=1)
    for i, rid in enumerate(["x", "y", "z"]):
        eng.add(req(rid, prompt=0, max_tokens=1), now_s=float(i) / 1000)
    order = [b.request_id for _, b in run_to_end(eng)]
    assert order == ["x", "y", "z"]


# --- abort ----------------------------------------------------------------------------------------


def test_abort_a_running_request() -> None:
    eng = engine()
    eng.add(req("a", max_tokens=10), now_s=0.0)
    eng.advance(0.6)
    assert eng.abort("a") is True
    assert eng.stats().running == 0
    assert eng.advance(100.0) == []
    assert eng.next_event_s() is None
    assert eng.abort("a") is False


def test_abort_a_waiting_request() -> None:
    eng = engine(max_num_seqs=1)
    eng.add(req("a", max_tokens=1), now_s=0.0)
    eng.add(req("b", max_tokens=1), now_s=0.0)
    eng.add(req("c", max_tokens=1), now_s=0.0)
    assert eng.abort("b") is True
    assert eng.stats().waiting == 1
    order = [b.request_id for _, b in run_to_end(eng)]
    assert order == ["a", "c"]


def test_aborting_a_running_request_frees_its_slot_for_the_next() -> None:
    eng = engine(max_num_seqs=1)
    eng.add(req("a", max_tokens=100), now_s=0.0)
    eng.add(req("b", prompt=100, max_tokens=1), now_s=0.0)
    assert eng.abort("a")
    eng.advance(1.0)  # the worker's next tick admits b at 1.0
    assert (eng.stats().running, eng.stats().waiting) == (1, 0)
    [batch] = eng.advance(1.1)
    assert batch.request_id == "b" and batch.finished


def test_abort_unknown_returns_false() -> None:
    eng = engine()
    assert eng.abort("ghost") is False
    eng.add(req("a"), now_s=0.0)
    assert eng.abort("ghost") is False
    assert eng.stats().running == 1


# --- construction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"prefill_tokens_per_s": 0}, {"prefill_tokens_per_s": -1.0}, {"decode_tokens_per_s": 0},
     {"decode_tokens_per_s": -5}, {"max_num_seqs": 0}, {"max_num_seqs": -1}],
)
def test_bad_constructor_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FixedRateEngine(**kwargs)


def test_defaults() -> None:
    eng = FixedRateEngine()
    assert (eng.prefill_tokens_per_s, eng.decode_tokens_per_s, eng.max_num_seqs) == (
        10_000.0, 100.0, 64)
    assert eng.next_event_s() is None
    assert eng.advance(5.0) == []


@pytest.mark.parametrize("clock_base", [0.0, 1e5 + 0.3, 1e6 + 0.7, 1e7 + 0.1])
@pytest.mark.parametrize("decode", [33.3, 100.0, 1000.0])
def test_advancing_to_next_event_always_yields_a_token_on_a_large_clock(
    clock_base: float, decode: float
) -> None:
    """A worker's engine clock grows for as long as it runs (times the speed-up); an event-driven
    loop that wakes at next_event_s() must get a token at every wake-up, or it spins."""
    eng = FixedRateEngine(decode_tokens_per_s=decode)
    eng.add(req(prompt=123, max_tokens=500), now_s=clock_base)
    emitted = 0
    for _ in range(500):
        at = eng.next_event_s()
        assert at is not None
        [batch] = eng.advance(at)
        assert batch.token_offset == emitted and len(batch.tokens) == 1
        emitted += 1
    assert eng.next_event_s() is None


# --- properties -----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(0, 5000), st.integers(1, 40), st.integers(0, 39),
                  st.floats(0, 5, allow_nan=False)),
        min_size=1, max_size=8,
    ),
    max_num_seqs=st.integers(1, 4),
    decode=st.sampled_from([7.0, 10.0, 33.3, 100.0, 1000.0]),
    prefill=st.sampled_from([999.0, 10_000.0]),
    clock_base=st.sampled_from([0.0, 12_345.678, 1e6 + 0.1]),
)
def test_every_stream_is_complete_contiguous_and_wakeups_are_productive(
    specs: list, max_num_seqs: int, decode: float, prefill: float, clock_base: float
) -> None:
    """Driven only at next_event_s (as an event loop would be), every request emits exactly its
    reference tokens from its resume offset on, contiguously, and every wake-up yields tokens."""
    eng = FixedRateEngine(prefill_tokens_per_s=prefill, decode_tokens_per_s=decode,
                          max_num_seqs=max_num_seqs)
    arrivals = sorted(
        ((clock_base + at, f"r{i}", prompt, max_tokens, min(resume, max_tokens - 1))
         for i, (prompt, max_tokens, resume, at) in enumerate(specs)),
    )
    expected = {rid: (resume, max_tokens) for _, rid, _, max_tokens, resume in arrivals}
    seen: dict[str, list[TokenBatch]] = {rid: [] for rid in expected}
    pending = list(arrivals)
    now = clock_base
    for _ in range(100_000):
        wake = eng.next_event_s()
        if pending and (wake is None or pending[0][0] <= wake):
            at, rid, prompt, max_tokens, resume = pending.pop(0)
            now = max(now, at)
            eng.add(EngineRequest(rid, prompt, max_tokens, resume), now)
            continue
        if wake is None:
            break
        assert wake >= now - 1e-9, "next_event_s went back in time"
        now = max(now, wake)
        batches = eng.advance(now)
        assert batches, f"woke at {now} for nothing"
        for b in batches:
            seen[b.request_id].append(b)
    else:
        raise AssertionError("did not finish")
    for rid, (resume, max_tokens) in expected.items():
        batches = seen[rid]
        offsets = [b.token_offset for b in batches]
        assert offsets[0] == resume
        for prev, cur in zip(batches, batches[1:]):
            assert cur.token_offset == prev.token_offset + len(prev.tokens)
        assert [b.first for b in batches] == [True] + [False] * (len(batches) - 1)
        assert [b.finished for b in batches] == [False] * (len(batches) - 1) + [True]
        reference = [reference_token(rid, i) for i in range(resume, max_tokens)]
        assert tokens_of(batches, rid) == reference
    assert eng.stats().running == eng.stats().waiting == 0
