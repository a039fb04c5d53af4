"""Which tasks succeeded, in the edge cases a live fleet produces: the same task id used by two
tenants, an attempt that was replaced and reports after the one that replaced it, and a final
step sent twice. Histories go in as the sink writes them (messages -> rows -> a journal flush)."""

import datetime as dt

import pytest

import analytics.migrations as migrations
from analytics.audit import run_audit
from analytics.batch import Batch
from analytics.journal import Journal
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.rows import message_row
from analytics.store import Store
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write, old_store

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

    def failed(self, rid, tenant, task, at, attempt=None) -> None:
        self._event(events.Failed, rid, tenant, task, at, reason="engine_error", worker_id="w1",
                    attempt=attempt)

    def cancelled(self, rid, tenant, task, at, worker="w1", attempt=1) -> None:
        self._event(events.Cancelled, rid, tenant, task, at, reason="client went away",
                    worker_id=worker, attempt=attempt)

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



def _replaced_and_failing_late(attempt: int | None) -> _History:
    """Each request's first attempt, on w1, is replaced by a second on w2 (w1 thought lost),
    and w1's failure of it comes late (naming ``attempt``); the client then cancels ``r1``,
    and ``r2``'s continuation runs on."""
    history = _History()
    for rid in ("r1", "r2"):
        history.sent(rid, "acme", f"t-{rid}", 1, 1)
        history.started(rid, "acme", f"t-{rid}", 1.0, worker="w1", attempt=1)
        history.started(rid, "acme", f"t-{rid}", 3.0, worker="w2", attempt=2)
        history.failed(rid, "acme", f"t-{rid}", 4.0, attempt=attempt)
    history.cancelled("r1", "acme", "t-r1", 5.0, worker="w2", attempt=2)
    return history


def _task_failures(source: StoreSource) -> list[tuple[str, int]]:
    return [(row["outcome"], row["tasks"]) for row in run_report(source, "task-failures").dicts()]


@pytest.mark.parametrize("attempt", [1, None], ids=["named", "by_its_worker"])
def test_a_replaced_attempts_late_failure_is_no_outcome_of_its_request(store, attempt):
    """A failure of an attempt a newer one replaced is no state of the request, as the router,
    the streams and the audit take it (told by its attempt, or where it names none, from a
    worker older than 7 Dec, by its worker): ``r1`` was cancelled, not failed, and ``r2`` is
    unfinished (schema version 17). Before, any failure failed its request (and its reason,
    ``engine_error``, showed beside the outcome it had)."""
    source = _replaced_and_failing_late(attempt).write(store)
    assert _task_failures(source) == [("cancelled", 1), ("unfinished", 1)]
    assert run_report(source, "rejections").dicts() == []
    assert run_report(source, "slo").dicts() == []  # neither finished: cancelled, or running
    audit = run_audit(source, grace_s=2 * 86_400)  # (r2 runs on: in flight)
    assert (audit["terminal"], audit["in_flight"], audit["violations"]) == (1, 1, 0)


def test_version_17_applies_to_a_store_with_history_and_keeps_its_old_rows(location, monkeypatch):
    """Requests written before version 17 have no failed attempts: any failure fails them, as
    before."""
    with monkeypatch.context() as patched:  # a store as version 16 left it
        old = old_store(location, 16, patched)
        _write(old, 1, _replaced_and_failing_late(1).out)
        old.close()
    store = Store.open(location)
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        assert _task_failures(StoreSource(store)) == [("failed:engine_error", 2)]
    finally:
        store.close()


def _failing_twice(late_reason: str = "engine_error") -> _History:
    """``r``: attempt 1 on w1, attempt 2 on w2 (w1 thought lost), which fails: the request's
    own end; then, with ``late_reason``, w1's replaced attempt fails late."""
    history = _History()
    history.sent("r", "acme", "t-r", 1, 1)
    history.started("r", "acme", "t-r", 1.0, worker="w1", attempt=1)
    history.started("r", "acme", "t-r", 3.0, worker="w2", attempt=2)
    history._event(events.Failed, "r", "acme", "t-r", 4.0, reason="engine_error",
                   worker_id="w2", attempt=2)
    history._event(events.Failed, "r", "acme", "t-r", 5.0, reason=late_reason,
                   worker_id="w1", attempt=1)
    return history


def test_a_failed_requests_reason_is_its_own_failures_not_a_replaced_attempts(store):
    """Before, the greatest reason of all its failures was the request's: the replaced
    attempt's ``invalid_request`` over its own ``engine_error``."""
    assert _task_failures(_failing_twice("invalid_request").write(store)) == [
        ("failed:engine_error", 1)]


def test_a_failure_stored_before_version_17_stays_the_requests_after_a_late_one(
        location, monkeypatch):
    """The request's own failure stored before version 17, a replaced attempt's late failure
    after it: the failures stored are judged as before (any is the request's). Before, the
    late one, alone in ``failed_attempts``, was taken for all of them: a replaced attempt's,
    so the request read ``unfinished`` (and ``report cost`` charged it as in flight)."""
    history = _failing_twice()
    own, late = history.out[:-1], history.out[-1:]
    with monkeypatch.context() as patched:  # a store as version 16 left it
        old = old_store(location, 16, patched)
        _write(old, 1, own)
        old.close()
    store = Store.open(location)  # the upgraded sink's start: version 17 on
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        _write(store, 2, late)
        assert _task_failures(StoreSource(store)) == [("failed:engine_error", 1)]
    finally:
        store.close()
