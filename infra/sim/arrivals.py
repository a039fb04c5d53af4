"""When each simulated request arrives: closed loop within a task, open loop across tasks.

A request without a task id, and the first of a task's requests, arrives at its earliest
arrival (``infra.sim.requests.earliest_arrivals``: the trace's time over ``rate_scale``). A
later step of a task is released when the previous step of its task ends, in whatever terminal
state (completed, failed, rejected), and arrives then or at its own earliest arrival, whichever
is later: a conversation's next turn re-sends the last answer, so it cannot go before it. Every
step is sent, also after a failed one, so every policy gets the same requests. The simulator
learns of a completion when it next advances the worker's engine (at an arrival, a delivery,
the worker's heartbeat or a tick), so a step may arrive a little after the previous one's end
(at most a heartbeat period, 0.5 s), never before. A released step's ``arrival_s`` becomes the
time it arrives: its TTFT and deadline count from there.

``governor replay --closed-loop`` sends a live replay's requests by the same rule
(``infra.replay``): its specs are anything with an ``arrival_s``, its ends the terminal events
read on the telemetry topic.
"""

import heapq
from collections.abc import Sequence

from infra.sim.outcomes import RequestSpec


class Arrivals:
    def __init__(self, specs: Sequence[RequestSpec], previous: Sequence[int | None]) -> None:
        self.specs = specs
        self.free: list[int] = []  # requests waiting for none, in trace order: arrival times rise
        self.next_free = 0
        self.released: list[tuple[float, int]] = []  # (arrival, request): the others due
        self.waiting: dict[int, list[int]] = {}  # request -> the steps waiting for its end
        latest = float("-inf")
        for i, p in enumerate(previous):
            if p is not None:
                self.waiting.setdefault(p, []).append(i)
            elif specs[i].arrival_s >= latest:
                self.free.append(i)
                latest = specs[i].arrival_s
            else:  # a task's second step 1, its offset unscaled, arrives after later rows
                heapq.heappush(self.released, (specs[i].arrival_s, i))
        self.arrived = 0
        self.last_s = 0.0  # the latest arrival so far

    def next(self) -> tuple[float, int] | None:
        """(time, request) of the next arrival known now; at equal times the earlier row."""
        due = self.released[0] if self.released else None
        if self.next_free < len(self.free):
            i = self.free[self.next_free]
            free = (self.specs[i].arrival_s, i)
            if due is None or free < due:
                return free
        return due

    def pop(self) -> int:
        """The next arrival's request (``next`` must have given one)."""
        t, i = self.next()
        if self.released and self.released[0] == (t, i):
            heapq.heappop(self.released)
            self.specs[i].arrival_s = t
        else:
            self.next_free += 1
        self.arrived += 1
        self.last_s = max(self.last_s, t)
        return i

    def ended(self, i: int, now_s: float) -> None:
        """Request ``i`` reached a terminal state, which the simulator learnt of at ``now_s``:
        release the steps waiting for it."""
        for j in self.waiting.pop(i, ()):
            heapq.heappush(self.released, (max(self.specs[j].arrival_s, now_s), j))

    def pending(self) -> bool:
        """Arrivals still due (steps waiting for a step that never ended are not)."""
        return self.next_free < len(self.free) or bool(self.released)
