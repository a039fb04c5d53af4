"""Tests of controllers.retry_budget.RetryBudget: a share of recent requests, with a floor."""

from __future__ import annotations

import pytest

from controllers.retry_budget import RetryBudget


def _budget(requests: int, at_s: float = 0.0, **kwargs: float) -> RetryBudget:
    budget = RetryBudget(**kwargs)
    for _ in range(requests):
        budget.request(at_s)
    return budget


@pytest.mark.parametrize(
    ("ratio", "min_per_s", "window_s", "requests", "allowance"),
    [
        (0.1, 1.0, 10.0, 0, 10.0),  # quiet: the floor, 1/s over 10 s
        (0.1, 1.0, 10.0, 50, 10.0),  # 5 < 10: still the floor
        (0.1, 1.0, 10.0, 200, 20.0),  # the ratio beats the floor
        (0.5, 0.0, 10.0, 7, 3.5),
        (0.0, 0.0, 10.0, 1_000, 0.0),  # no retries at all
        (0.2, 2.0, 5.0, 30, 10.0),  # max(6, 10)
    ],
)
def test_allowance_is_the_ratio_or_the_floor(ratio: float, min_per_s: float, window_s: float,
                                             requests: int, allowance: float) -> None:
    budget = _budget(requests, ratio=ratio, min_per_s=min_per_s, window_s=window_s)
    assert budget.allowance(0.0) == pytest.approx(allowance)


@pytest.mark.parametrize(("requests", "granted"), [(0, 10), (200, 20), (305, 30)])
def test_retries_are_granted_up_to_the_allowance(requests: int, granted: int) -> None:
    budget = _budget(requests)  # ratio 0.1, floor 1/s, window 10 s
    results = [budget.try_retry(0.0) for _ in range(granted + 5)]
    assert results == [True] * granted + [False] * 5


def test_the_window_slides() -> None:
    budget = _budget(200, at_s=0.0)
    assert sum(budget.try_retry(0.0) for _ in range(25)) == 20
    assert not budget.try_retry(10.0)  # t - 10 s = 0: the window still holds t = 0
    assert budget.allowance(10.0) == pytest.approx(20.0)
    assert budget.allowance(10.001) == pytest.approx(10.0)  # the requests have left
    # the old retries left with them: the floor's 10 are available again
    assert sum(budget.try_retry(10.5) for _ in range(15)) == 10


def test_requests_inside_the_window_keep_counting() -> None:
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, window_s=10.0)
    for t in range(20):  # one request a second for 20 s
        budget.request(float(t))
    assert budget.allowance(19.0) == pytest.approx(0.5 * 11)  # t = 9 .. 19


def test_configure_changes_ratio_and_floor() -> None:
    budget = _budget(100)
    budget.configure(0.0, 0.0)
    assert not budget.try_retry(0.0)
    budget.configure(1.0, 0.0)
    assert budget.allowance(0.0) == pytest.approx(100.0)
    assert budget.try_retry(0.0)


def test_requests_seen_are_kept_to_the_window_when_nothing_retries() -> None:
    budget = RetryBudget(window_s=10.0)
    for i in range(100_000):  # 100 requests a second for 1,000 s, no retry asked for
        budget.request(i / 100)
    assert len(budget._requests) <= 10 * 100 + 1


@pytest.mark.parametrize("min_per_s", [0.05, 0.01])
def test_a_floor_under_one_retry_a_window_still_allows_its_rate(min_per_s: float) -> None:
    # retry_budget_min_per_s takes 0-1,000,000 retries a second: 0.05 is one every 20 s (before
    # 7 Dec it made 0.5 a window of 10 s, and a quiet fleet could retry never, as at 0)
    budget = RetryBudget(ratio=0.1, min_per_s=min_per_s, window_s=10.0)
    every_s = 1 / min_per_s
    granted = [t for t in range(0, int(5 * every_s)) if budget.try_retry(float(t))]
    assert granted == [int(k * every_s) for k in range(5)]


def test_no_floor_allows_no_retry_on_a_quiet_fleet() -> None:
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, window_s=10.0)
    assert not any(budget.try_retry(float(t)) for t in range(0, 1_000, 7))
