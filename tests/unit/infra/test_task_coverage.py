"""``infra.sim.outcomes.TaskCoverage``: the tasks a run's rows hold only some steps of, and how
many steps they lack (what ``sim``, ``replay`` and ``demo`` warn of, and ``demo`` reports)."""

import pytest

from infra.sim.outcomes import TaskCoverage
from infra.traces import TraceRequest


def _step(task: str | None, step: int = 1, steps: int = 1, tenant: str = "default") -> TraceRequest:
    return TraceRequest(0.0, 10, 2, task_id=task, step=step, steps_total=steps, tenant=tenant)


@pytest.mark.parametrize(("rows", "cut"), [
    ([], (0, 0)),
    ([_step(None), _step(None)], (0, 0)),  # requests without a task: whole tasks of one
    ([_step("a", 1, 2), _step("a", 2, 2)], (0, 0)),
    ([_step("a", 1, 3)], (1, 2)),
    ([_step("a", 1, 3), _step("a", 1, 3)], (1, 2)),  # a step held twice counts once
    ([_step("a", 1, 2, "x"), _step("a", 2, 2, "y")], (2, 2)),  # a task id is its tenant's
    ([_step("a", 2, 4), _step("b", 1, 2), _step("b", 2, 2)], (1, 3)),  # a first step cut too
])
def test_the_tasks_the_rows_hold_only_some_steps_of(rows, cut) -> None:
    assert TaskCoverage(rows).cut() == cut
