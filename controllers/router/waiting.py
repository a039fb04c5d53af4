"""Requests that wait, out of line, for a worker of their model to take them.

A request no live worker can take yet (its model's pool is at zero or loading, every worker of it
is gone silent) waits here while the router answers the requests read after it; each model's
requests are placed in the order they were read. A partition of the request topic is committed no
further than its first request still waiting: a router that stops, or loses the partition, leaves
it unanswered, and whoever reads the partition next reads it again.
"""

from collections import Counter
from dataclasses import dataclass

from schemas.requests import InferenceRequest


@dataclass(frozen=True, slots=True)
class Waiting:
    request: InferenceRequest
    give_up: float  # when it is refused (``time.monotonic()``)
    partition: int | None = None  # where it was read on the request topic (None: not read
    offset: int | None = None  # from it)


class WaitingRoom:
    def __init__(self) -> None:
        self._waiting: dict[str, Waiting] = {}  # by request id, in the order they came
        self._models: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._waiting

    def add(self, waiting: Waiting) -> None:
        self._waiting[waiting.request.request_id] = waiting
        self._models[waiting.request.model] += 1

    def remove(self, request_id: str) -> Waiting | None:
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            model = waiting.request.model
            self._models[model] -= 1
            if not self._models[model]:
                del self._models[model]
        return waiting

    def get(self, request_id: str) -> Waiting | None:
        return self._waiting.get(request_id)

    def holds(self, model: str) -> bool:
        """Whether a request of ``model`` waits: one read later waits behind it."""
        return model in self._models

    def in_order(self) -> list[Waiting]:
        return list(self._waiting.values())

    def clear(self) -> list[Waiting]:
        """Every request waiting, given up on here (left unanswered)."""
        left = self.in_order()
        self._waiting.clear()
        self._models.clear()
        return left

    def first_offsets(self) -> dict[int, int]:
        """Each partition's first offset still waiting: its commit stops there."""
        first: dict[int, int] = {}
        for w in self._waiting.values():
            if w.partition is not None and w.offset is not None:
                first[w.partition] = min(first.get(w.partition, w.offset), w.offset)
        return first
