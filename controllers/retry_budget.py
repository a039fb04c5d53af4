"""Retry budget: retries may be at most a share of recent requests. Pure: time is passed in.

Retrying everything that fails turns a partial outage into an overload (every failure doubles
the work); a budget caps retries at ``ratio`` of the requests seen in the last ``window_s``,
with a floor of ``min_per_s`` so a quiet system can still retry (a floor of less than one retry
a window, one every ``1 / min_per_s`` seconds). Beyond it, fail fast.
"""

from collections import deque


class RetryBudget:
    def __init__(self, ratio: float = 0.1, min_per_s: float = 1.0, window_s: float = 10.0) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()
        self._last_retry_s: float | None = None

    def configure(self, ratio: float, min_per_s: float) -> None:
        self.ratio, self.min_per_s = ratio, min_per_s

    def _trim(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        for q in (self._requests, self._retries):
            while q and q[0] < horizon:
                q.popleft()

    def request(self, now_s: float) -> None:
        self._requests.append(now_s)
        horizon = now_s - self.window_s  # kept to the window even when nothing retries
        while self._requests[0] < horizon:
            self._requests.popleft()

    def allowance(self, now_s: float) -> float:
        self._trim(now_s)
        return max(self.ratio * len(self._requests), self.min_per_s * self.window_s)

    def try_retry(self, now_s: float) -> bool:
        """Spend one retry if the budget allows it."""
        if len(self._retries) + 1 > self.allowance(now_s) and not self._floor_due(now_s):
            return False
        self._retries.append(now_s)
        self._last_retry_s = now_s
        return True

    def _floor_due(self, now_s: float) -> bool:
        """Whether a floor of less than one retry a window allows one now: the last was at
        least ``1 / min_per_s`` ago (before 7 Dec, 0.05 a second made half a retry in 10 s,
        and no retry ever)."""
        return 0 < self.min_per_s * self.window_s < 1 and (
            self._last_retry_s is None or now_s - self._last_retry_s >= 1 / self.min_per_s)
