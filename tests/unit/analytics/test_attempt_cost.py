"""A request's GPU time is charged attempt by attempt, each where and while it ran.

Two workers heart-beat every second from 0 to 10 s: ``w-h`` (pool h100@m) and ``w-a`` (a100@m).
Tenant ``acme`` sends the request under test, a one-step task; tenant ``beta`` runs one
request of ``BETA_S`` seconds on each worker, so each pool-day's shares show the seconds
``acme`` was charged there: ``acme``'s share is ``s / (s + BETA_S)``.

Before, a request's time ran from its first ``started`` (any attempt) to its last terminal
event, all of it in the pool of the worker it ended on: a request resumed on another pool took
its first attempt's time and the requeue gap there, and a replaced attempt completing late
stretched its time.
"""

import datetime as dt

import pytest

import analytics.migrations as migrations
from analytics.cost import IN_FLIGHT
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.store import Store
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write, old_store

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
T0 = int((_today - dt.timedelta(days=1) + dt.timedelta(hours=1)).timestamp() * 1000)
H100, A100 = "h100@m", "a100@m"
WORKERS = (("w-h", H100, "h100"), ("w-a", A100, "a100"))
BETA_S = 1


def ms(seconds: float) -> int:
    return T0 + int(round(seconds * 1000))


def _history(acme: list[events.RequestEvent]) -> list[tuple[str, object]]:
    """Heartbeats, ``beta``'s requests (from 8 s) and ``acme``'s events of ``r-acme``."""
    out: list[tuple[str, object]] = [
        ("telemetry", events.WorkerStatus(event_time_ms=ms(at), worker_id=worker, slot=slot,
                                          pool=pool, gpu_type=gpu, state="warm",
                                          started_ms=ms(0)))
        for at in range(11) for slot, (worker, pool, gpu) in enumerate(WORKERS)]
    requests = [("r-acme", "acme", ms(0))] + [
        (f"r-beta-{worker}", "beta", ms(8)) for worker, _, _ in WORKERS]
    for rid, tenant, created in requests:
        out.append(("requests", InferenceRequest(
            event_time_ms=created, created_ms=created, request_id=rid, tenant=tenant,
            model="m", task_id=f"t-{rid}", step=1, steps_total=1, prompt_tokens=10,
            max_tokens=10)))
    for worker, _, _ in WORKERS:
        common = dict(request_id=f"r-beta-{worker}", tenant="beta", model="m", created_ms=ms(8))
        out += [("telemetry", m) for m in (
            events.Queued(event_time_ms=ms(8), prompt_tokens=10, max_tokens=10, **common),
            events.Started(event_time_ms=ms(8), worker_id=worker, **common),
            events.Completed(event_time_ms=ms(8 + BETA_S), worker_id=worker, prompt_tokens=10,
                             output_tokens=10, e2e_s=BETA_S, **common))]
    return out + [("telemetry", m) for m in acme]


ACME = dict(request_id="r-acme", tenant="acme", model="m", created_ms=ms(0))
DONE = dict(prompt_tokens=10, output_tokens=10, e2e_s=6.0, **ACME)
QUEUED = events.Queued(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10, **ACME)


def _acme_rows(store, tenant: str = "acme") -> dict[str, tuple[int, int, float]]:
    """Per pool: ``tenant``'s requests, successful tasks and share of the pool-day."""
    return {r["pool"]: (r["requests"], r["successful_tasks"], r["pool_share"])
            for r in run_report(StoreSource(store), "cost").dicts() if r["tenant"] == tenant}


def _resumed(**common) -> list[events.RequestEvent]:
    """2 s on the H100, handed back, and after 1 s resumed on the A100, done in 1 s."""
    return [
        events.Queued(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10, **common),
        events.Started(event_time_ms=ms(1), worker_id="w-h", attempt=1, **common),
        events.Requeued(event_time_ms=ms(3), worker_id="w-h", attempt=1, tokens_done=4,
                        **common),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **common),
        events.Completed(event_time_ms=ms(5), worker_id="w-a", attempt=2, prompt_tokens=10,
                         output_tokens=10, e2e_s=5.0, **common)]


def share(acme_s: float) -> float:
    return round(acme_s / (acme_s + BETA_S), 4)


def test_a_request_resumed_on_another_pool_is_charged_each_attempt_where_it_ran(store):
    """Attempt 1 runs 2 s on the H100 and is handed back; attempt 2 starts 1 s later on the
    A100 and completes after 1 s: 2 s in h100@m, 1 s in a100@m, nothing for the gap; the
    request and its task count once, where it completed."""
    _write(store, 1, _history(_resumed(**ACME)))
    assert _acme_rows(store) == {H100: (0, 0, share(2)), A100: (1, 1, share(1))}


def test_a_replaced_attempt_that_completes_late_stretches_nothing(store):
    """Attempt 1 starts on the H100 at 1 s; its worker is slow to heart-beat and the router
    resumes it on the A100 at 4 s, which completes at 5 s; attempt 1 completes too, at 7 s.
    Attempt 1 is charged until it was replaced (3 s), attempt 2 its own 1 s."""
    _write(store, 1, _history([
        QUEUED,
        events.Started(event_time_ms=ms(1), worker_id="w-h", attempt=1, **ACME),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **ACME),
        events.Completed(event_time_ms=ms(5), worker_id="w-a", attempt=2, **DONE),
        events.Completed(event_time_ms=ms(7), worker_id="w-h", attempt=1, **DONE)]))
    assert _acme_rows(store) == {H100: (0, 0, share(3)), A100: (1, 1, share(1))}


def test_an_attempt_that_fails_ends_at_the_failure(store):
    """Failed names no attempt: the attempt it ends is the one running (2 s on the A100 after
    2 s on the H100); the request counts where it ended, and no task succeeded."""
    _write(store, 1, _history([
        QUEUED,
        events.Started(event_time_ms=ms(1), worker_id="w-h", attempt=1, **ACME),
        events.Requeued(event_time_ms=ms(3), worker_id="w-h", attempt=1, tokens_done=4, **ACME),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **ACME),
        events.Failed(event_time_ms=ms(6), worker_id="w-a", reason="engine_error", **ACME)]))
    assert _acme_rows(store) == {H100: (0, 0, share(2)), A100: (1, 0, share(2))}


@pytest.mark.parametrize("end", [
    events.Completed(event_time_ms=ms(4), worker_id="w-h", **DONE),
    events.Failed(event_time_ms=ms(4), reason="engine_error", **ACME),
    events.Cancelled(event_time_ms=ms(4), reason="client went away", **ACME),
], ids=lambda end: end.type)
def test_a_request_with_one_attempt_is_charged_from_its_start_to_its_end(store, end):
    """As before attempts were told apart: 3 s in h100@m, nothing in a100@m."""
    _write(store, 1, _history([
        QUEUED, events.Started(event_time_ms=ms(1), worker_id="w-h", **ACME), end]))
    tasks = 1 if end.type == "completed" else 0
    assert _acme_rows(store) == {H100: (1, tasks, share(3))}


def test_version_10_applies_to_a_store_with_history_and_keeps_its_old_rows(location, monkeypatch):
    """A request written before version 10 has no attempts: charged as before, from its first
    start to its end (4 s), all where it ended; one written after, attempt by attempt."""
    with monkeypatch.context() as patched:  # a store as version 9 left it, with a request in it
        old = old_store(location, 9, patched)
        _write(old, 1, _history(_resumed(**ACME)))
        old.close()
    store = Store.open(location)  # the sink's start: version 10 is applied
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        later = dict(request_id="r-later", tenant="later", model="m", created_ms=ms(0))
        _write(store, 2, [("requests", InferenceRequest(
            event_time_ms=ms(0), task_id="t-later", step=1, steps_total=1, prompt_tokens=10,
            max_tokens=10, **later)), *(("telemetry", m) for m in _resumed(**later))])
        # h100: later 2 s, beta 1 s; a100: acme 4 s, later 1 s, beta 1 s
        assert _acme_rows(store) == {A100: (1, 1, round(4 / 6, 4))}
        assert _acme_rows(store, "later") == {H100: (0, 0, round(2 / 3, 4)),
                                              A100: (1, 1, round(1 / 6, 4))}
    finally:
        store.close()


def test_a_pool_day_whose_only_attempt_took_no_time_shares_its_cost_with_no_nan(store):
    """A third pool (``w-x``, h200@m) where ``acme``'s first attempt started and was handed
    back at once (0 s) and no request ran else: no busy time and no request counted there, so
    its share was 0 / 0, NaN, and so were its cost and cost per task. The pool-day's rows now
    share it equally (here: the one row, all of it)."""
    history = _history([
        QUEUED,
        events.Started(event_time_ms=ms(1), worker_id="w-x", attempt=1, **ACME),
        events.Requeued(event_time_ms=ms(1), worker_id="w-x", attempt=1, tokens_done=0, **ACME),
        events.Started(event_time_ms=ms(2), worker_id="w-a", attempt=2, **ACME),
        events.Completed(event_time_ms=ms(3), worker_id="w-a", attempt=2, **DONE)])
    history += [("telemetry", events.WorkerStatus(
        event_time_ms=ms(at), worker_id="w-x", slot=2, pool="h200@m", gpu_type="h200",
        state="warm", started_ms=ms(0))) for at in range(11)]
    _write(store, 1, history)
    rows = [r for r in run_report(StoreSource(store), "cost").dicts() if r["pool"] == "h200@m"]
    assert [(r["tenant"], r["requests"], r["pool_share"]) for r in rows] == [("acme", 0, 1.0)]
    assert rows[0]["cost_usd"] > 0 and rows[0]["gpu_hours"] == round(10 / 3600, 4)


def _replaced_then_failing_late(resumed_on: str, ends: list[events.RequestEvent]
                                ) -> list[events.RequestEvent]:
    """Attempt 1 starts on the H100 at 1 s; its worker is slow to heart-beat and the router
    resumes the request on ``resumed_on`` at 4 s; attempt 1's failure comes late, at 5 s (it
    names its attempt); then ``ends``."""
    return [
        QUEUED,
        events.Started(event_time_ms=ms(1), worker_id="w-h", attempt=1, **ACME),
        events.Started(event_time_ms=ms(4), worker_id=resumed_on, attempt=2, **ACME),
        events.Failed(event_time_ms=ms(5), worker_id="w-h", attempt=1, reason="engine_error",
                      **ACME),
        *ends]


@pytest.mark.parametrize("end", [
    events.Cancelled(event_time_ms=ms(8), worker_id="w-a", attempt=2, reason="client went away",
                     **ACME),
    # the router's, for a request whose worker went silent: it names the attempt, not the worker
    events.Cancelled(event_time_ms=ms(8), attempt=2, reason="client went away", **ACME),
    events.Failed(event_time_ms=ms(8), worker_id="w-a", attempt=2, reason="engine_error",
                  **ACME),
], ids=["cancelled", "cancelled_by_the_router", "failed"])
def test_a_replaced_attempts_late_failure_ends_that_attempt_only(store, end):
    """The continuation on the A100 runs from 4 s to its own end at 8 s: 4 s, not 1 s. Before,
    a ``Failed`` or ``Cancelled`` ended whatever attempt was running, so the first of them (the
    replaced attempt's, at 5 s) cut the continuation short. Attempt 1 is charged until it was
    replaced (3 s)."""
    _write(store, 1, _history(_replaced_then_failing_late("w-a", [end])))
    assert _acme_rows(store) == {H100: (0, 0, share(3)), A100: (1, 0, share(4))}


def test_a_late_failure_on_the_worker_its_continuation_went_back_to_ends_it_not(store):
    """Resumed on the same H100 (the only worker that could take it): 3 s of attempt 1 and
    4 s of attempt 2 there, not 3 s and 1 s."""
    _write(store, 1, _history(_replaced_then_failing_late("w-h", [events.Cancelled(
        event_time_ms=ms(8), worker_id="w-h", attempt=2, reason="client went away", **ACME)])))
    assert _acme_rows(store) == {H100: (1, 0, share(7))}


def test_a_continuation_running_past_a_replaced_attempts_late_failure_runs_on(store):
    """No end of the continuation yet: it runs until its worker's last heartbeat (10 s), as an
    attempt in flight does, not until the replaced attempt's failure at 5 s; and the request,
    which that failure does not end (schema version 17), is in flight, counted nowhere."""
    _write(store, 1, _history(_replaced_then_failing_late("w-a", [])))
    assert _acme_rows(store) == {}
    assert _acme_rows(store, IN_FLIGHT) == {H100: (0, 0, share(3)), A100: (0, 0, share(6))}


def test_version_15_applies_to_a_store_with_history_and_keeps_its_old_rows(location, monkeypatch):
    """A request written before version 15 is charged as before: the first failure or
    cancellation ends the attempt running (the continuation's 1 s); one written after, each
    attempt to its own end (4 s)."""
    def history(**common) -> list[events.RequestEvent]:
        return [m.model_copy(update=common) for m in _replaced_then_failing_late("w-a", [
            events.Cancelled(event_time_ms=ms(8), worker_id="w-a", attempt=2,
                             reason="client went away", **ACME)])]

    with monkeypatch.context() as patched:  # a store as version 14 left it, with a request in it
        old = old_store(location, 14, patched)
        _write(old, 1, _history(history()))
        old.close()
    store = Store.open(location)  # the sink's start: version 15 is applied
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        later = dict(request_id="r-later", tenant="later")
        _write(store, 2, [("requests", InferenceRequest(
            event_time_ms=ms(0), created_ms=ms(0), task_id="t-later", model="m", step=1,
            steps_total=1, prompt_tokens=10, max_tokens=10, **later)),
            *(("telemetry", m) for m in history(**later))])
        # h100: acme 3 s, later 3 s, beta 1 s; a100: acme 1 s, later 4 s, beta 1 s
        assert _acme_rows(store) == {H100: (0, 0, round(3 / 7, 4)), A100: (1, 0, round(1 / 6, 4))}
        assert _acme_rows(store, "later") == {H100: (0, 0, round(3 / 7, 4)),
                                              A100: (1, 0, round(4 / 6, 4))}
    finally:
        store.close()
