"""Event-to-signal lag and the headline figures, from what a reader of the topics sees. Pure.

``SignalWatch`` is fed the lifecycle events it sees on the telemetry topic (their event times)
and the snapshots it sees on the signals topic, with the time each was seen. An event's lag is
the time from its event time until the first ``fleet:all`` snapshot whose ``last_event_ms`` (the
newest lifecycle event the snapshot includes) is at or after it. The benchmark and
``governor demo`` report its p50 and p99.
"""

import heapq

import numpy as np

from schemas.base import Message
from schemas.events import SignalSnapshot, WorkerStatus

_FLEET = ("fleet", "all")


class SignalWatch:
    def __init__(self, windows_s: tuple[float, ...] = (10.0, 60.0)) -> None:
        self.windows_s = windows_s
        self._pending: list[int] = []
        self.lags_s: list[float] = []
        self.fleet_total: dict[str, float] = {}
        self.events_noted = 0

    def note_event(self, message: Message) -> None:
        """A telemetry record seen; lifecycle events (not heartbeats) are timed."""
        if isinstance(message, WorkerStatus) or message.type == "inference_request":
            return
        heapq.heappush(self._pending, message.event_time_ms)
        self.events_noted += 1

    def note_snapshot(self, snapshot: SignalSnapshot, seen_ms: int) -> None:
        if (snapshot.scope, snapshot.key) != _FLEET:
            return
        if snapshot.window_s not in self.windows_s:
            self.fleet_total = dict(snapshot.values)
        newest = snapshot.values.get("last_event_ms")
        if newest is None:
            return
        while self._pending and self._pending[0] <= newest:
            self.lags_s.append(max(0, seen_ms - heapq.heappop(self._pending)) / 1000)

    def lag_quantile_s(self, q: float) -> float | None:
        return round(float(np.quantile(self.lags_s, q)), 4) if self.lags_s else None

    @property
    def unmatched(self) -> int:
        """Events no snapshot has included yet."""
        return len(self._pending)

    def report(self) -> dict[str, float | int | None]:
        total = self.fleet_total
        pick = lambda name: round(total[name], 6) if name in total else None  # noqa: E731
        # DESIGN.md's cost per successful task: all the fleet's spend (idle and warming GPUs,
        # failed and retried work) over the tasks that succeeded, as `governor sim` reports it;
        # and the cost of the tasks' own attempts alone (the signal's per-tenant meaning).
        return {
            "cost_per_successful_task_usd": pick("spend_per_successful_task_usd"),
            "attributed_cost_per_successful_task_usd": pick("cost_per_successful_task_usd"),
            "tasks_succeeded": int(total["tasks_succeeded"]) if "tasks_succeeded" in total else None,
            # what `report cost` sums over the store (analytics_spend_usd, analytics_gpu_hours)
            "spend_usd": pick("spend_usd"),
            "gpu_hours": round(total["gpu_hours"], 4) if "gpu_hours" in total else None,
            "signal_lag_p50_s": self.lag_quantile_s(0.50),
            "signal_lag_p99_s": self.lag_quantile_s(0.99),
            "signal_lag_samples": len(self.lags_s),
        }
