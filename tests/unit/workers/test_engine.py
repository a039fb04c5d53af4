"""Tests of workers.engine: the deterministic reference token stream and the value types."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.engine import VOCAB_SIZE, EngineRequest, TokenBatch, reference_token


@settings(max_examples=200, deadline=None)
@given(request_id=st.text(max_size=130), index=st.integers(min_value=0, max_value=2**20))
def test_reference_token_is_deterministic_and_in_range(request_id: str, index: int) -> None:
    token = reference_token(request_id, index)
    assert 0 <= token < VOCAB_SIZE
    assert reference_token(request_id, index) == token


@pytest.mark.parametrize(
    ("request_id", "index", "expected"),
    # Pinned: a stream resumed on a worker of another version must still match the reference.
    [("r1", 0, 60116), ("r1", 1, 61088), ("req-0001", 41, 23604), ("", 0, 55038)],
)
def test_reference_token_values_are_stable(request_id: str, index: int, expected: int) -> None:
    assert reference_token(request_id, index) == expected


def test_different_indices_give_a_varied_stream() -> None:
    stream = [reference_token("req-1", i) for i in range(1000)]
    assert len(set(stream)) > 990  # 1000 draws from 128k values: a few collisions at most


@pytest.mark.parametrize(("a", "b"), [("req-1", "req-2"), ("a", "b"), ("run-000001", "run-000010")])
def test_different_requests_give_different_streams(a: str, b: str) -> None:
    sa = [reference_token(a, i) for i in range(200)]
    sb = [reference_token(b, i) for i in range(200)]
    assert sum(x == y for x, y in zip(sa, sb)) <= 2


def test_tokens_cover_the_vocabulary_roughly_uniformly() -> None:
    tokens = [reference_token("u", i) for i in range(20_000)]
    low = sum(t < VOCAB_SIZE // 2 for t in tokens)
    assert 9_400 < low < 10_600


def test_value_types_are_frozen_with_documented_defaults() -> None:
    request = EngineRequest(request_id="r", prompt_tokens=1, max_tokens=2)
    assert (request.resume_from_token, request.prefix_hashes) == (0, ())
    batch = TokenBatch(request_id="r", token_offset=0, tokens=(1,), first=True, finished=False)
    assert batch.finish_reason is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.max_tokens = 3  # type: ignore[misc]
