"""Round-robin placement: each request goes to the next live worker serving its model."""

from controllers.router.fleet import FleetView, WorkerView
from schemas.requests import InferenceRequest


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def place(self, fleet: FleetView, request: InferenceRequest, now_ms: int) -> WorkerView | None:
        """The worker to run ``request`` on, or None when no live worker serves its model."""
        candidates = fleet.live(now_ms, request.model)
        if not candidates:
            return None
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen
