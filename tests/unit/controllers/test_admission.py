"""Tests of controllers.router.admission.admit."""

from __future__ import annotations

import pytest

from controllers.router.admission import Denial, admit
from schemas.requests import InferenceRequest

T0 = 1_700_000_000_000


def request(deadline_ms: int | None) -> InferenceRequest:
    return InferenceRequest(event_time_ms=T0, created_ms=T0, request_id="r", prompt_tokens=1,
                            max_tokens=1, deadline_ms=deadline_ms)


@pytest.mark.parametrize(
    ("deadline_ms", "now_ms", "late_s"),
    [(T0, T0, "0.000"), (T0 + 1_000, T0 + 1_000, "0.000"), (T0 + 1_000, T0 + 3_500, "2.500"),
     (T0, T0 + 1, "0.001")],
)
def test_deadline_passed_is_denied(deadline_ms: int, now_ms: int, late_s: str) -> None:
    denial = admit(request(deadline_ms), now_ms)
    assert isinstance(denial, Denial)
    assert denial.reason == "deadline_unreachable"
    assert f"deadline passed {late_s}s before admission" == denial.detail
    assert denial.retry_after_s is None


@pytest.mark.parametrize(
    ("deadline_ms", "now_ms"),
    [(None, T0), (None, T0 + 10**9), (T0 + 1, T0), (T0 + 60_000, T0 + 59_999)],
)
def test_admitted_otherwise(deadline_ms: int | None, now_ms: int) -> None:
    assert admit(request(deadline_ms), now_ms) is None
