"""Which tasks succeeded, in the edge cases a live fleet produces: the same task id used by two
tenants, an attempt that was replaced and reports after the one that replaced it, and a final
step sent twice. Histories go in as the sink writes them (messages -> rows -> a journal flush)."""

import datetime as dt

from analytics.batch import Batch
from analytics.journal import Journal
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.rows import message_row
from schemas import events
from schemas.requests import InferenceRequest

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
T0 = int((_today - dt.timedelta(hours=23)).timestamp() * 1000)


def ms(seconds: float) -> int:
    return T0 + int(round(seconds * 1000))


class _History:
    def __init__(self) -> None:
        self.out: list[tuple[str, object]] = []
        for i in range(21):  # one H100 worker heart-beating for 10 s
            self.out.append(("telemetry", events.WorkerStatus(
                event_time_ms=ms(i * 0.5), worker_id="w1", slot=0, pool="h100@m",
                gpu_type="h100", started_ms=ms(-1))))

    def _event(self, kind, rid, tenant, task, at, **fields) -> None:
        self.out.append(("telemetry", kind(event_time_ms=ms(at), request_id=rid, tenant=tenant,
                                           task_id=task, model="m", created_ms=ms(0), **fields)))

    def sent(self, rid, tenant, task, step, total, deadline_s: float | None = 6.0) -> None:
        deadline_ms = None if deadline_s is None else ms(deadline_s)
        self.out.append(("requests", InferenceRequest(
            event_time_ms=ms(0), created_ms=ms(0), request_id=rid, task_id=task, step=step,
            steps_total=total, tenant=tenant, model="m", prompt_tokens=100, max_tokens=10,
            deadline_ms=deadline_ms)))
        self._event(events.Queued, rid, tenant, task, 0.1, prompt_tokens=100, max_tokens=10,
                    step=step, steps_total=total, deadline_ms=deadline_ms)

    def started(self, rid, tenant, task, at, worker="w1", attempt=1) -> None:
        self._event(events.Started, rid, tenant, task, at, worker_id=worker, attempt=attempt)

    def completed(self, rid, tenant, task, at, worker="w1", attempt=1) -> None:
        self._event(events.Completed, rid, tenant, task, at, worker_id=worker, attempt=attempt,
                    prompt_tokens=100, output_tokens=10, e2e_s=at)

    def failed(self, rid, tenant, task, at) -> None:
        self._event(events.Failed, rid, tenant, task, at, reason="engine_error", worker_id="w1")

    def served(self, rid, tenant, task, step, total, ok=True) -> None:
        self.sent(rid, tenant, task, step, total)
        self.started(rid, tenant, task, 0.2 * step)
        if ok:
            self.completed(rid, tenant, task, 0.2 * step + 1)
        else:
            self.failed(rid, tenant, task, 0.2 * step + 1)

    def write(self, store) -> StoreSource:
        batch, offsets = Batch(), {}
        for suffix, message in self.out:
            offset = offsets[suffix] = offsets.get(suffix, -1) + 1
            table, columns = message_row(message, suffix)
            batch.add(table, (f"t.{suffix}", 0, offset, message.event_time_ms, *columns))
        Journal(store).commit(1, batch)
        return StoreSource(store)


def _successful_tasks(source: StoreSource) -> float:
    return sum(row["successful_tasks"] for row in run_report(source, "cost").dicts())


def test_one_task_id_of_two_tenants_is_two_tasks(store):
    history = _History()
    history.served("a1", "acme", "T", 1, 2)
    history.served("a2", "acme", "T", 2, 2, ok=False)
    history.served("b1", "beta", "T", 1, 2, ok=False)
    history.served("b2", "beta", "T", 2, 2)
    source = history.write(store)
    assert _successful_tasks(source) == 0  # together their steps "succeeded"; neither task did
    failures = run_report(source, "task-failures").dicts()
    assert sum(row["tasks"] for row in failures) == 2


def test_a_replaced_attempt_reporting_late_does_not_make_a_completion_late(store):
    history = _History()
    history.sent("r1", "acme", "t1", 1, 1, deadline_s=6.0)
    history.started("r1", "acme", "t1", 1.0, worker="w1", attempt=1)
    history.started("r1", "acme", "t1", 3.0, worker="w1", attempt=2)  # w1 thought lost
    history.completed("r1", "acme", "t1", 5.0, attempt=2)  # in time
    history.completed("r1", "acme", "t1", 8.0, attempt=1)  # the replaced attempt, late
    source = history.write(store)
    assert _successful_tasks(source) == 1
    assert run_report(source, "task-failures").dicts() == []


def test_a_final_step_sent_twice_counts_its_task_once(store):
    history = _History()
    history.served("s1", "acme", "t1", 1, 2)
    history.served("s2", "acme", "t1", 2, 2)
    history.served("s2-again", "acme", "t1", 2, 2)
    assert _successful_tasks(history.write(store)) == 1
