"""The request book: identity dedupe, TTFT once, ITL, deadline and SLO, attempts and outcomes."""

import orjson
import pytest

from schemas.events import (
    Completed, Failed, FirstToken, Preempted, Queued, Rejected, Requeued, Started,
)
from schemas.limits import (
    MAX_ATTEMPTS, MAX_ID_CHARS, MAX_NAME_CHARS, MAX_OUTPUT_TOKENS, MAX_RECORD_BYTES,
)
from schemas.requests import InferenceRequest
from streams.signals.requests import PREEMPTIONS_KEPT, RequestBook, identity

T = 1_700_000_000_000


def _by(outs, route):
    return [o for o in outs if o.route == route]


def _queued(rid="r1", deadline=None, **kw):
    return Queued(event_time_ms=T, request_id=rid, prompt_tokens=10, max_tokens=20, created_ms=T,
                  deadline_ms=deadline, **kw)


def test_identity_includes_attempt_and_preemptions_are_distinct():
    started = Started(event_time_ms=T, request_id="r", worker_id="w", attempt=2)
    assert identity(started) == "started:2"
    a = Preempted(event_time_ms=T, request_id="r", worker_id="w", tokens_done=5)
    b = Preempted(event_time_ms=T + 1, request_id="r", worker_id="w", tokens_done=5)
    assert identity(a) != identity(b)


def test_a_redelivered_event_yields_nothing():
    book = RequestBook({})
    assert book.apply(_queued())
    assert book.apply(_queued()) == []


def test_completed_outputs_scopes_worker_relay_attempt_end_and_step():
    book = RequestBook({})
    book.apply(_queued(deadline=T + 5000, tenant="acme", task_id="task", step=2, steps_total=3))
    book.apply(Started(event_time_ms=T + 100, request_id="r1", worker_id="w0", tenant="acme"))
    book.apply(FirstToken(event_time_ms=T + 300, request_id="r1", worker_id="w0", ttft_s=0.3))
    outs = book.apply(Completed(event_time_ms=T + 2300, request_id="r1", worker_id="w0",
                                prompt_tokens=10, output_tokens=21, e2e_s=2.3, tenant="acme"))
    scopes = _by(outs, "scope")
    assert {o.key for o in scopes} == {"model:llama-3-8b", "tenant:acme", "fleet:all"}
    obs = scopes[0].payload
    assert obs["ok"] == 1 and obs["slo"] == 1
    assert obs["itl"] == pytest.approx((2.3 - 0.3) / 20)  # (e2e - ttft) / (tokens - 1)
    end = next(o for o in _by(outs, "worker") if o.payload["k"] == "end")
    assert (end.key, end.payload["s"], end.payload["e"]) == ("w0", T + 100, T + 2300)
    step = _by(outs, "task")[0]
    assert step.key == "acme|task" and step.payload["o"] == "ok" and step.payload["step"] == 2


def test_one_task_id_of_two_tenants_is_two_tasks():
    book = RequestBook({})
    keys = []
    for rid, tenant in (("a1", "acme"), ("b1", "beta")):
        book.apply(_queued(rid, tenant=tenant, task_id="job-1"))
        outs = book.apply(Rejected(event_time_ms=T, request_id=rid, tenant=tenant,
                                   task_id="job-1", reason="load_shed"))
        keys.append(_by(outs, "task")[0].key)
    assert keys == ["acme|job-1", "beta|job-1"]


@pytest.mark.parametrize("requests", [
    [("r1", "org/a", "t1"), ("r2", "org", "a/t1")],  # both were task "org/a/t1"
    [("r1", "org", "t1"), ("org/t1", "default", None)],  # a request of no task is keyed by its id
])
def test_tasks_of_different_tenants_never_share_a_key(requests):
    book = RequestBook({})
    keys = set()
    for rid, tenant, task_id in requests:
        book.apply(_queued(rid, tenant=tenant, task_id=task_id))
        outs = book.apply(Rejected(event_time_ms=T, request_id=rid, tenant=tenant,
                                   task_id=task_id, reason="load_shed"))
        keys.add(_by(outs, "task")[0].key)
    assert len(keys) == 2


def test_the_task_key_separator_is_in_no_name_or_id():
    from pydantic import TypeAdapter, ValidationError

    from schemas.limits import Id, Name
    from streams.signals.requests import TASK_KEY_SEPARATOR

    for kind in (Id, Name):
        with pytest.raises(ValidationError):
            TypeAdapter(kind).validate_python(f"a{TASK_KEY_SEPARATOR}b")


@pytest.mark.parametrize("reason,hint,fails", [
    ("rate_limited", 1.0, False), ("no_capacity", 5.0, False),  # for now: a retry may succeed
    ("rate_limited", None, True), ("load_shed", 5.0, True)])
def test_a_refusal_for_now_fails_no_task(reason, hint, fails):
    book = RequestBook({})
    outs = book.apply(Rejected(event_time_ms=T, request_id="r1", task_id="t", reason=reason,
                               retry_after_s=hint))
    assert _by(outs, "scope")[0].payload["k"] == "r"  # still a rejection in the signals
    assert [o.payload["o"] for o in _by(outs, "task")] == (["failed"] if fails else [])


@pytest.mark.parametrize("ttft_s,slo_s,done_ms,ok,slo,told_by", [
    (0.5, None, 1000, 1, 1, None),   # default TTFT SLO 2 s, before the 5 s deadline
    (2.5, None, 3000, 1, 0, None),   # misses the default TTFT SLO
    (0.5, 0.4, 1000, 1, 0, "request"),  # misses the request's own SLO
    (0.5, None, 6000, 0, 0, None),   # completes after its deadline
    # the router copies the request's SLO into Queued: it counts when the InferenceRequest
    # (another topic) has not been read yet, or is read after Queued
    (2.5, 3.0, 3000, 1, 1, "queued"),
    (0.5, 0.4, 1000, 1, 0, "queued"),
    (2.5, 3.0, 3000, 1, 1, "both"),
])
def test_success_and_slo(ttft_s, slo_s, done_ms, ok, slo, told_by):
    book = RequestBook({})
    request = InferenceRequest(event_time_ms=T, request_id="r1", prompt_tokens=10, max_tokens=20,
                               created_ms=T, ttft_slo_s=slo_s)
    if told_by == "request":
        book.apply(request)
    book.apply(_queued(deadline=T + 5000, ttft_slo_s=slo_s if told_by else None))
    if told_by == "both":
        book.apply(request)
    book.apply(FirstToken(event_time_ms=T + 10, request_id="r1", worker_id="w0", ttft_s=ttft_s))
    outs = book.apply(Completed(event_time_ms=T + done_ms, request_id="r1", worker_id="w0",
                                prompt_tokens=10, output_tokens=1, e2e_s=done_ms / 1000))
    obs = _by(outs, "scope")[0].payload
    assert (obs["ok"], obs["slo"]) == (ok, slo)
    assert obs["itl"] is None  # one output token: no inter-token gap
    assert _by(outs, "task")[0].payload["o"] == ("ok" if ok else "late")


def test_ttft_counts_once_and_a_new_attempt_ends_the_previous_one():
    book = RequestBook({})
    book.apply(_queued())
    book.apply(Started(event_time_ms=T + 10, request_id="r1", worker_id="w0"))
    assert book.apply(FirstToken(event_time_ms=T + 20, request_id="r1", worker_id="w0",
                                 ttft_s=0.02))
    outs = book.apply(Started(event_time_ms=T + 500, request_id="r1", worker_id="w1", attempt=2))
    end = [o for o in _by(outs, "worker") if o.payload["k"] == "end"]
    assert [(o.key, o.payload["a"], o.payload["e"]) for o in end] == [("w0", 1, T + 500)]
    assert _by(outs, "scope")[0].payload == {"k": "s", "t": T + 500, "a": 2}
    assert book.apply(FirstToken(event_time_ms=T + 600, request_id="r1", worker_id="w1",
                                 attempt=2, ttft_s=0.6)) == []


@pytest.mark.parametrize("first_read", ["lost", "after"])
def test_a_continuations_first_token_is_no_ttft_but_bounds_its_slo(first_read):
    """Resumed on w1 after 5 tokens streamed on w0: the continuation's first token (at 3.6 s of
    the request's life) is no TTFT sample, as in the store's ``request_minute``; where w0's was
    lost, the request has no TTFT and its SLO is judged by the continuation's, as ``report slo``
    judges it (not by its e2e)."""
    book = RequestBook({})
    book.apply(_queued(deadline=T + 60_000, ttft_slo_s=4.0))
    book.apply(Started(event_time_ms=T + 10, request_id="r1", worker_id="w0"))
    book.apply(Started(event_time_ms=T + 3000, request_id="r1", worker_id="w1", attempt=2))
    first = FirstToken(event_time_ms=T + 200, request_id="r1", worker_id="w0", ttft_s=0.2)
    resumed = FirstToken(event_time_ms=T + 3600, request_id="r1", worker_id="w1", attempt=2,
                         ttft_s=3.6, tokens_done=5)
    assert book.apply(resumed) == []
    samples = [] if first_read == "lost" else [
        o.payload["v"] for o in book.apply(first) if o.key == "fleet:all"]
    assert samples == ([] if first_read == "lost" else [0.2])
    outs = book.apply(Completed(event_time_ms=T + 5000, request_id="r1", worker_id="w1",
                                attempt=2, prompt_tokens=10, output_tokens=11, e2e_s=5.0))
    obs = _by(outs, "scope")[0].payload
    assert (obs["ok"], obs["slo"]) == (1, 1)  # by 0.2 s, or by 3.6 s: within 4 s, unlike 5 s
    assert obs["itl"] == (None if first_read == "lost" else pytest.approx(0.48))


def _ends(outs):
    return [(o.key, o.payload["a"], o.payload["s"], o.payload["e"]) for o in _by(outs, "worker")
            if o.payload["k"] == "end"]


def test_a_started_read_after_its_requests_end_is_closed_at_that_end():
    """Its worker's Started came late (its Completed, by another path, first): the attempt is
    charged from its start to the request's end, and nothing stays open."""
    table = {}
    book = RequestBook(table)
    book.apply(_queued())
    done = book.apply(Completed(event_time_ms=T + 900, request_id="r1", worker_id="w0",
                                prompt_tokens=10, output_tokens=5, e2e_s=0.9))
    assert _ends(done) == []  # no attempt known yet
    outs = book.apply(Started(event_time_ms=T + 100, request_id="r1", worker_id="w0"))
    assert _ends(outs) == [("w0", 1, T + 100, T + 900)]
    assert [a[2] for a in table["r1"]["att"].values()] == [0]  # closed


def test_a_started_read_after_a_newer_attempts_is_closed_at_the_newer_ones_start():
    book = RequestBook({})
    book.apply(_queued())
    book.apply(Started(event_time_ms=T + 500, request_id="r1", worker_id="w1", attempt=2))
    outs = book.apply(Started(event_time_ms=T + 100, request_id="r1", worker_id="w0"))
    assert _ends(outs) == [("w0", 1, T + 100, T + 500)]  # attempt 2 runs on
    done = book.apply(Completed(event_time_ms=T + 900, request_id="r1", worker_id="w1",
                                attempt=2, prompt_tokens=10, output_tokens=5, e2e_s=0.9))
    assert _ends(done) == [("w1", 2, T + 500, T + 900)]


def test_rejections_and_failures_fail_the_step():
    book = RequestBook({})
    outs = book.apply(Rejected(event_time_ms=T, request_id="r1", reason="load_shed"))
    assert _by(outs, "scope")[0].payload["shed"] == 1
    assert _by(outs, "task")[0].payload["o"] == "failed"
    book.apply(_queued("r2"))
    book.apply(Started(event_time_ms=T + 1, request_id="r2", worker_id="w0"))
    outs = book.apply(Failed(event_time_ms=T + 9, request_id="r2", reason="worker_lost"))
    assert [o.payload["k"] for o in _by(outs, "worker")] == ["end"]  # closed on its worker
    assert _by(outs, "task")[0].payload["o"] == "failed"


def test_sweep_forgets_finished_requests_after_retention():
    table = {}
    book = RequestBook(table, retention_s=10)
    book.apply(Rejected(event_time_ms=T, request_id="r1", reason="no_capacity"))
    book.apply(_queued("r2"))
    assert book.sweep(list(table), T + 5_000) == []
    assert book.sweep(list(table), T + 11_000) == ["r1"]
    assert set(table) == {"r2"}


def _replaced_attempt_failed_late() -> RequestBook:
    """Request r1 of task t started on w1, then (attempt 2) on w2; then w1 reports a failure
    late, which counts for nothing: attempt 2 goes on."""
    book = RequestBook({})
    book.apply(_queued(deadline=T + 60_000, task_id="t"))
    book.apply(Started(event_time_ms=T + 1, request_id="r1", worker_id="w1"))
    book.apply(Started(event_time_ms=T + 2, request_id="r1", worker_id="w2", attempt=2))
    assert book.apply(Failed(event_time_ms=T + 3, request_id="r1", worker_id="w1",
                             reason="engine_error")) == []
    return book


def test_a_replaced_attempts_late_failure_or_second_completion_counts_for_nothing():
    book = _replaced_attempt_failed_late()
    done = book.apply(Completed(event_time_ms=T + 9, request_id="r1", worker_id="w2", attempt=2,
                                prompt_tokens=10, output_tokens=5, e2e_s=0.009))
    assert [o.payload["o"] for o in _by(done, "task")] == ["ok"]
    # attempt 1 completing too (it ran on): the request ended already
    assert book.apply(Completed(event_time_ms=T + 10, request_id="r1", worker_id="w1",
                                prompt_tokens=10, output_tokens=5, e2e_s=0.01)) == []


def test_a_replaced_attempts_late_failure_leaves_the_current_attempts_failure_counted():
    book = _replaced_attempt_failed_late()
    outs = book.apply(Failed(event_time_ms=T + 4, request_id="r1", worker_id="w2",
                             reason="engine_error"))
    assert [o.payload["o"] for o in _by(outs, "task")] == ["failed"]
    assert [(o.key, o.payload["a"]) for o in _by(outs, "worker")
            if o.payload["k"] == "end"] == [("w2", 2)]  # attempt 2 is charged
    assert {o.payload["k"] for o in _by(outs, "scope")} == {"x"}
    assert book.apply(Failed(event_time_ms=T + 4, request_id="r1", worker_id="w2",
                             reason="engine_error")) == []  # and once only


@pytest.mark.parametrize("deadline, held_to", [(T + 600_000, T + 600_000), (None, T + 60_000)])
def test_a_queued_step_tells_its_task_it_runs_until_its_deadline(deadline, held_to):
    book = RequestBook({})
    outs = book.apply(_queued(deadline=deadline, tenant="acme", task_id="task", step=2,
                              steps_total=3))
    [run] = _by(outs, "task")
    assert run.key == "acme|task"
    assert (run.payload["k"], run.payload["step"], run.payload["dl"]) == ("run", 2, held_to)


def test_a_requests_entry_stays_under_the_record_limit_whatever_its_events():
    """Every attempt a request may have (1,000), each on a worker of the longest id and with
    every event an attempt can have, and 10,000 preemptions (each a new identity)."""
    table = {}
    book = RequestBook(table)
    rid, worker = "r" * MAX_ID_CHARS, "w" * MAX_ID_CHARS
    names = dict(request_id=rid, tenant="n" * MAX_NAME_CHARS, model="m" * MAX_NAME_CHARS,
                 task_id="t" * MAX_ID_CHARS)
    book.apply(Queued(event_time_ms=T, prompt_tokens=10, max_tokens=20, created_ms=T, **names))
    for a in range(1, MAX_ATTEMPTS + 1):
        at = dict(event_time_ms=T + a, worker_id=worker, attempt=a, **names)
        book.apply(Started(**at))
        book.apply(FirstToken(ttft_s=0.1, **at))
        book.apply(Requeued(tokens_done=1, **at))
    for i in range(10_000):
        book.apply(Preempted(event_time_ms=T + i, worker_id=worker, tokens_done=MAX_OUTPUT_TOKENS,
                             **names))
    assert len(table[rid]["pre"]) == PREEMPTIONS_KEPT
    assert len(orjson.dumps(table[rid])) < MAX_RECORD_BYTES / 2
    assert book.apply(Preempted(event_time_ms=T + 9_999, worker_id=worker,
                                tokens_done=MAX_OUTPUT_TOKENS, **names)) == []


def test_a_completion_before_its_queued_gives_its_step_once_the_queued_is_read():
    """A Completed names no step: read before its Queued and its InferenceRequest, its success
    waits for them (taken as step 1 of 1, it closed its task); a failure fails the task as is."""
    book = RequestBook({})
    done = book.apply(Completed(event_time_ms=T + 900, request_id="r1", worker_id="w0",
                                prompt_tokens=10, output_tokens=5, e2e_s=0.9, tenant="acme",
                                task_id="task"))
    assert _by(done, "task") == [] and _by(done, "scope")
    outs = book.apply(_queued(tenant="acme", task_id="task", step=2, steps_total=3))
    step, run = _by(outs, "task")
    assert step.key == "acme|task" and {k: step.payload[k] for k in ("step", "steps", "o", "t")} \
        == {"step": 2, "steps": 3, "o": "ok", "t": T + 900}
    assert run.payload["k"] == "run"
    assert _by(book.apply(InferenceRequest(
        event_time_ms=T, request_id="r1", prompt_tokens=10, max_tokens=20, created_ms=T,
        tenant="acme", task_id="task", step=2, steps_total=3)), "task") == []  # given once
    failed = book.apply(Failed(event_time_ms=T, request_id="r2", reason="engine_error",
                               task_id="task", tenant="acme"))
    assert [o.payload["o"] for o in _by(failed, "task")] == ["failed"]


def test_a_completion_held_for_its_step_is_judged_by_the_deadline_its_queued_states():
    """Read before its Queued, a completion could be judged only by the default deadline (60 s
    after its creation): 70 s after it, late by that, in time by its own 120 s deadline; and a
    completion 2 s after it, in time by the default, late by its own 1 s."""
    for e2e_s, own_s, outcome in ((70.0, 120.0, "ok"), (2.0, 1.0, "late")):
        book = RequestBook({})
        assert _by(book.apply(Completed(
            event_time_ms=T + int(e2e_s * 1000), request_id="r1", worker_id="w0",
            prompt_tokens=10, output_tokens=5, e2e_s=e2e_s, tenant="acme", task_id="task")),
            "task") == []  # held, late or not
        outs = book.apply(_queued(deadline=T + int(own_s * 1000), tenant="acme",
                                  task_id="task", step=1, steps_total=2))
        step, _run = _by(outs, "task")
        assert (step.payload["step"], step.payload["o"]) == (1, outcome)


def test_a_failure_of_an_attempt_replaced_meanwhile_is_taken_back():
    """w0's failure is read before the Started of the attempt on w1 that the router had resumed
    the request with: no state of the request (the audit's rule). It is taken back (``xr``, to
    w0's scopes too) and the request's later end counts: here another failure, from w1, which a
    copy of w0's read again does not hide."""
    book = RequestBook({})
    book.apply(_queued(task_id="task", step=1, steps_total=1))
    book.apply(Started(event_time_ms=T + 100, request_id="r1", worker_id="w0"))
    w0_failed = Failed(event_time_ms=T + 500, request_id="r1", reason="engine_error",
                       worker_id="w0", task_id="task")
    assert [o.payload["o"] for o in _by(book.apply(w0_failed), "task")] == ["failed"]
    resumed = book.apply(Started(event_time_ms=T + 600, request_id="r1", worker_id="w1",
                                 attempt=2))
    taken_back = [(o.route, o.key) for o in resumed if o.payload.get("k") == "xr"
                  or o.payload.get("obs", {}).get("k") == "xr"]
    assert taken_back == [("scope", "model:llama-3-8b"), ("scope", "tenant:default"),
                          ("scope", "fleet:all"), ("worker", "w0")]
    assert book.apply(w0_failed) == []  # (a copy: its attempt was replaced)
    w1_failed = book.apply(Failed(event_time_ms=T + 900, request_id="r1", reason="engine_error",
                                  worker_id="w1", task_id="task"))
    assert [o.payload["o"] for o in _by(w1_failed, "task")] == ["failed"]
    again = book.apply(Started(event_time_ms=T + 950, request_id="r1", worker_id="w1",
                               attempt=3))  # (the same worker: its failure stands)
    assert not [o for o in again if o.payload.get("k") == "xr"]


@pytest.mark.parametrize("created_before_s, kind, held", [
    (10, "rq", True),  # created 10 s before: not forgotten, its Queued may come later
    (300, "rqe", False),  # created the retention before: perhaps forgotten
    (None, "rqe", False),  # an older producer's, which says nothing of it
])
def test_a_hand_back_of_a_request_not_held_is_judged_by_its_age(created_before_s, kind, held):
    book = RequestBook({}, retention_s=300.0)
    created = None if created_before_s is None else T - created_before_s * 1000
    outs = book.apply(Requeued(event_time_ms=T, request_id="r1", worker_id="w-a", tokens_done=0,
                               created_ms=created))
    assert {o.payload["k"] for o in _by(outs, "scope")} == {kind}
    assert ("r1" in book.table) is held


@pytest.mark.parametrize("started_first", [True, False])
def test_a_failure_naming_a_replaced_attempt_on_the_newest_attempts_worker_counts_for_nothing(
        started_first):
    """Attempt 1 on w0 replaced, attempt 3 back on w0: w0's failure of attempt 1 is no state
    of the request, read after attempt 3's Started (dropped) or before it (taken back); before
    7 Dec a failure named no attempt, and one from the newest attempt's worker stood. A failure
    of attempt 3 then ends the request."""
    book = RequestBook({})
    book.apply(_queued(task_id="task", step=1, steps_total=1))
    book.apply(Started(event_time_ms=T + 100, request_id="r1", worker_id="w0"))
    old = Failed(event_time_ms=T + 500, request_id="r1", reason="engine_error",
                 worker_id="w0", task_id="task", attempt=1)
    third = Started(event_time_ms=T + 600, request_id="r1", worker_id="w0", attempt=3)
    if started_first:
        book.apply(third)
        assert book.apply(old) == []
    else:
        book.apply(old)
        resumed = book.apply(third)
        assert [o.key for o in resumed if o.payload.get("k") == "xr"
                or o.payload.get("obs", {}).get("k") == "xr"][-1] == "w0"
        assert book.apply(old) == []  # (a copy: its attempt was replaced)
    ended = book.apply(Failed(event_time_ms=T + 900, request_id="r1", reason="engine_error",
                              worker_id="w0", task_id="task", attempt=3))
    assert [o.payload["o"] for o in _by(ended, "task")] == ["failed"]
