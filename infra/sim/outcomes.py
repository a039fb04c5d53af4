"""What became of every simulated request: one terminal state each, and when.

The simulator records a request's first token, and exactly one terminal state: completed,
rejected (with a reason) or failed (with a reason). A second terminal state for the same request
(two attempts both finishing, say) keeps the first and is counted in ``duplicates``, which a
correct run leaves at 0; ``strict=True`` raises ``ConservationError`` instead.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.errors import GovernorError

COMPLETED, REJECTED, FAILED = "completed", "rejected", "failed"


class ConservationError(GovernorError):
    """A request reached a second terminal state."""


@dataclass(slots=True)
class RequestSpec:
    """What the simulator knows of one request before it runs (times in virtual seconds)."""

    arrival_s: float  # the earliest; a task's later step: when it was sent (infra.sim.arrivals)
    prompt_tokens: int
    output_tokens: int
    ttft_slo_s: float
    deadline_s: float  # relative to the arrival
    task: tuple[str, str]  # (tenant, task id): a task id is its tenant's
    steps_total: int = 1  # of its task
    step: int = 1


class Outcomes:
    def __init__(self, specs: list[RequestSpec], strict: bool = False) -> None:
        self.specs = specs
        self.strict = strict
        self.duplicates: list[tuple[int, str, str | None]] = []  # (request, state, reason)
        n = len(specs)
        self.first_token_s: list[float | None] = [None] * n
        self.end_s: list[float | None] = [None] * n
        self.state: list[str | None] = [None] * n
        self.reason: list[str | None] = [None] * n
        self.worker: list[str | None] = [None] * n
        self.attempts = [0] * n

    def __len__(self) -> int:
        return len(self.specs)

    def first_token(self, i: int, t: float) -> None:
        if self.first_token_s[i] is None:
            self.first_token_s[i] = t

    def finish(self, i: int, state: str, t: float, reason: str | None = None,
               worker: str | None = None) -> bool:
        """Record request ``i``'s terminal state; False (or a raise, if strict) when it has one."""
        if self.state[i] is not None:
            if self.strict:
                raise ConservationError(f"request r{i} reached {state} at {t:.3f}s after "
                                        f"{self.state[i]} ({self.reason[i] or 'no reason'})")
            self.duplicates.append((i, state, reason))
            return False
        self.state[i], self.end_s[i], self.reason[i] = state, t, reason
        if worker is not None:
            self.worker[i] = worker
        return True

    def is_done(self, i: int) -> bool:
        return self.state[i] is not None

    def succeeded(self, i: int) -> bool:
        """Completed within its deadline."""
        end = self.end_s[i]
        spec = self.specs[i]
        return self.state[i] == COMPLETED and end - spec.arrival_s <= spec.deadline_s + 1e-9

    def met_slo(self, i: int) -> bool:
        first = self.first_token_s[i]
        spec = self.specs[i]
        return (self.succeeded(i) and first is not None
                and first - spec.arrival_s <= spec.ttft_slo_s + 1e-9)

    def counts(self) -> Counter:
        return Counter(self.state)

    def reasons(self, state: str) -> dict[str, int]:
        return dict(sorted(Counter(r for s, r in zip(self.state, self.reason) if s == state).items()))

    def unfinished(self) -> list[int]:
        return [i for i, s in enumerate(self.state) if s is None]

    def ttfts(self) -> list[float]:
        """TTFT of every request that produced a token."""
        return [f - s.arrival_s for f, s in zip(self.first_token_s, self.specs) if f is not None]

    def e2es(self) -> list[float]:
        return [e - s.arrival_s for e, s, st in zip(self.end_s, self.specs, self.state)
                if st == COMPLETED]

    def tasks(self) -> tuple[int, int]:
        """(tasks, tasks whose every step is in the trace and succeeded)."""
        ok: dict[str, bool] = {}
        for i, spec in enumerate(self.specs):
            ok[spec.task] = ok.get(spec.task, True) and self.succeeded(i)
        cut = self.cut_short()
        return len(ok), sum(good and task not in cut for task, good in ok.items())

    def cut_short(self) -> set[tuple[str, str]]:
        """Tasks some of whose steps are not in the trace (cut off by a window or a limit):
        they cannot succeed (``TaskCoverage``)."""
        coverage = TaskCoverage()
        for spec in self.specs:
            coverage.note_step(spec.task, spec.step, spec.steps_total)
        return coverage.cut_tasks()


class TaskCoverage:
    """The steps of each task among a run's rows (noted one at a time: a trace streamed from
    its file is not held), to tell the tasks the run holds only some of the ``steps_total``
    steps of: cut off by ``--duration``, ``--limit`` or the file. Such a task cannot succeed.
    A task id is its tenant's; a step the rows hold twice counts once."""

    def __init__(self, items: Iterable = ()) -> None:
        self._steps: dict[tuple[str, str], set[int]] = {}
        self._totals: dict[tuple[str, str], int] = {}
        for item in items:
            self.note(item)

    def note(self, item):
        """Note a trace row (``TraceRequest``) of a task; returns it."""
        if item.task_id:
            self.note_step((item.tenant, item.task_id), item.step, item.steps_total)
        return item

    def note_step(self, task: tuple[str, str], step: int, steps_total: int) -> None:
        self._steps.setdefault(task, set()).add(step)
        self._totals[task] = max(self._totals.get(task, 0), steps_total)

    def cut_tasks(self) -> set[tuple[str, str]]:
        """The tasks some of whose steps the rows lack."""
        return {task for task, steps in self._steps.items() if len(steps) < self._totals[task]}

    def cut(self) -> tuple[int, int]:
        """(tasks some of whose steps the rows lack, how many steps they lack in all)."""
        lacking = [self._totals[task] - len(self._steps[task]) for task in self.cut_tasks()]
        return len(lacking), sum(lacking)
