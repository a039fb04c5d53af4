"""The controllers judge a request's end by the attempt it names (``Failed`` and ``Cancelled``
carry one since 7 Dec; one that names none is from an older writer, and is judged as before),
and the breakers a worker's outcomes by when they happened (the event's own time, no later than
when it is read; before 7 Dec, by when the controllers read them, so failures read late counted
as recent): through ``ControllersService.observe``, the adapter the live process and the
simulator feed."""

import pytest

from controllers.breakers import OUTCOMES_KEPT
from controllers.service import ControllersService
from schemas.config import GovernorConfig
from schemas.events import Cancelled, Completed, Failed, Queued, Requeued, Started, WorkerStatus
from schemas.topics import TopicCatalog

T = 1_800_000_000_000
MODEL = "llama-3-8b"


def _service(**breaker) -> ControllersService:
    config = GovernorConfig.model_validate({"breaker": {"cooldown_s": 10, **breaker}})
    return ControllersService("unused:9092", TopicCatalog("t"), config=config)


def _beat(service: ControllersService, now: int) -> None:
    """Heartbeats of w0 and w1, which report no latency (only outcomes judge them)."""
    for slot, worker in enumerate(("w0", "w1")):
        service.observe(WorkerStatus(
            event_time_ms=now, worker_id=worker, slot=slot, pool=f"h100@{MODEL}",
            gpu_type="h100", models_loaded=[MODEL], started_ms=T - 60_000, state="warm",
            running=1), now)


def _started(rid: str, worker: str, attempt: int, now: int) -> Started:
    return Started(event_time_ms=now, request_id=rid, model=MODEL, worker_id=worker,
                   attempt=attempt)


def _failed(rid: str, worker: str, attempt: int | None, now: int) -> Failed:
    return Failed(event_time_ms=now, request_id=rid, model=MODEL, worker_id=worker,
                  attempt=attempt, reason="engine_error", detail="HTTP 500")


def _completed(rid: str, worker: str, attempt: int, now: int) -> Completed:
    return Completed(event_time_ms=now, request_id=rid, model=MODEL, worker_id=worker,
                     attempt=attempt, prompt_tokens=10, output_tokens=10, e2e_s=1.0)


def _opened(service: ControllersService, now: int) -> list[str]:
    return [c.worker_id for c in service.tick(now, restate=False)
            if c.type == "set_breaker_state" and c.state == "open"]


def test_a_late_failure_of_a_replaced_attempt_counts_against_the_worker_that_ran_it() -> None:
    """Each request's attempt 1 ran on w0 and was continued on w1; w0's engine then fails the
    replaced attempts, late: w0's breaker counts them (the ``Failed`` names w0, which ran that
    attempt), not w1's, whose attempts run on."""
    service = _service(min_outcomes=4)
    _beat(service, T)
    for n in range(4):
        service.observe(_started(f"r{n}", "w0", 1, T), T)
        service.observe(_started(f"r{n}", "w1", 2, T + 10), T + 10)
    for n in range(4):
        service.observe(_failed(f"r{n}", "w0", 1, T + 20), T + 20)
    assert _opened(service, T + 100) == ["w0"]


@pytest.mark.parametrize("case", ["failure", "success"])
def test_an_end_read_twice_is_one_outcome(case: str) -> None:
    """One attempt's end counts once against its worker, however often it is read: a record
    its writer sent again, or a ``Completed`` the router writes for an attempt whose worker it
    lost with the whole answer streamed, and the worker's own. Before 7 Dec each counted: one
    failure read three times opened a breaker that three successes in four kept closed, and one
    success read twice kept closed a breaker that two failures in four open."""
    service = _service(min_outcomes=4, error_rate=0.5)
    _beat(service, T)
    now = T + 10
    if case == "failure":
        for n in range(3):
            service.observe(_completed(f"ok-{n}", "w0", 1, now), now)
        for _ in range(3):
            service.observe(_failed("bad", "w0", 1, now), now)
        assert _opened(service, now + 100) == []  # one failure in four
    else:
        for n in range(2):
            service.observe(_failed(f"bad-{n}", "w0", 1, now), now)
        service.observe(_completed("ok", "w0", 2, now), now)  # the router's
        service.observe(_completed("ok", "w0", 2, now + 5), now + 5)  # and the worker's
        service.observe(_completed("ok-1", "w0", 1, now), now)
        assert _opened(service, now + 100) == ["w0"]  # two failures in four


@pytest.mark.parametrize("late", ["failed", "completed"])
def test_a_probe_is_closed_out_by_its_own_attempts_end_not_an_earlier_ones(late: str) -> None:
    """w0's breaker opened on its failures and is half-open: the router's probe is attempt 3 of
    a request whose attempt 1 ran on w0 before it opened. That attempt's end, read late, is not
    the probe's: it neither opens the breaker again (a failure) nor closes it (a completion).
    Before 7 Dec a probe was told by its request alone, and either did. Attempt 3's own end
    closes it."""
    service = _service(min_outcomes=4)
    _beat(service, T)
    service.observe(_started("again", "w0", 1, T), T)
    for n in range(4):
        service.observe(_failed(f"r{n}", "w0", 1, T), T)
    assert _opened(service, T + 100) == ["w0"]
    now = T + 10_100  # the cooldown is over
    _beat(service, now)
    service.tick(now, restate=False)
    assert service.breakers.state("w0") == "half_open"
    service.observe(_started("again", "w0", 3, now + 10), now + 10)  # the probe
    end = _failed("again", "w0", 1, now + 20) if late == "failed" else \
        _completed("again", "w0", 1, now + 20)
    service.observe(end, now + 20)
    service.tick(now + 100, restate=False)
    assert service.breakers.state("w0") == "half_open"
    service.observe(_completed("again", "w0", 3, now + 200), now + 200)
    service.tick(now + 300, restate=False)
    assert service.breakers.state("w0") == "closed"


def _handed_back(rid: str, worker: str, attempt: int, now: int) -> Requeued:
    """A request the worker's engine failed, handed back (counted against the worker)."""
    return Requeued(event_time_ms=now, request_id=rid, model=MODEL, worker_id=worker,
                    attempt=attempt, tokens_done=0, engine_failed=True)


@pytest.mark.parametrize("end", [_failed, _handed_back])
@pytest.mark.parametrize(("age_s", "opens"), [(30, True), (90, False), (600, False)])
def test_failures_read_late_count_only_while_within_the_window(end, age_s: int,
                                                               opens: bool) -> None:
    """w0's engine failed four requests ``age_s`` before the controllers read the failures (a
    consumer lagging behind): 30 s ago they are recent, and open its breaker; 90 s or 10 min
    ago, older than the 60 s the error rate looks back, they do not count at all. Before 7 Dec
    each was placed when read, and opened the breaker of a worker healthy by then."""
    now = T + 600_000
    service = _service()
    _beat(service, now)
    for n in range(4):
        service.observe(end(f"r{n}", "w0", 1, now - age_s * 1000), now)
    assert _opened(service, now + 100) == (["w0"] if opens else [])


def test_a_failure_stamped_ahead_counts_as_read_not_later() -> None:
    """A writer's clock an hour ahead does not keep its failures recent for the hour: each
    counts as happened when read, and is out of the window 60 s on."""
    service = _service()
    _beat(service, T)
    for n in range(4):
        service.observe(_failed(f"r{n}", "w0", 1, T + 3_600_000), T)
    _beat(service, T + 60_500)
    assert _opened(service, T + 60_500) == []
    for n in range(4, 8):
        service.observe(_failed(f"r{n}", "w0", 1, T + 3_600_000), T + 60_600)
    assert _opened(service, T + 60_700) == ["w0"]  # read within the minute: recent


def test_failures_from_before_the_breaker_opened_read_late_do_not_open_it_again() -> None:
    """w0's breaker opened on four failures and is half-open after its cooldown when four more
    failures, of requests that failed before it opened, are read (a lagging writer): they are
    evidence its opening already cleared, and keep it from neither its probe nor closing. Before
    7 Dec they counted as the half-open worker failing again, and opened it for another
    cooldown."""
    service = _service()
    _beat(service, T)
    for n in range(4):
        service.observe(_failed(f"r{n}", "w0", 1, T - 1_000), T)
    assert _opened(service, T + 100) == ["w0"]
    now = T + 10_100  # the cooldown is over
    _beat(service, now)
    service.tick(now, restate=False)
    assert service.breakers.state("w0") == "half_open"
    for n in range(4, 8):
        service.observe(_failed(f"r{n}", "w0", 1, T - 500), now + 50)
    service.tick(now + 100, restate=False)
    assert service.breakers.state("w0") == "half_open"
    service.observe(_started("probe", "w0", 1, now + 200), now + 200)
    service.observe(_completed("probe", "w0", 1, now + 300), now + 300)
    service.tick(now + 400, restate=False)
    assert service.breakers.state("w0") == "closed"


def test_the_outcomes_kept_are_the_latest_that_happened_not_the_latest_read() -> None:
    """A worker keeps its latest ``OUTCOMES_KEPT`` outcomes. w0 completed that many requests,
    then failures it had before them are read (late, within the minute): those happened before
    every success kept, and push none out. Before 7 Dec they were taken for the latest, and
    opened the breaker of a worker whose latest requests all succeeded."""
    now = T + 20_000
    service = _service()
    _beat(service, now)
    for n in range(OUTCOMES_KEPT):
        service.observe(_completed(f"ok-{n}", "w0", 1, T + 10_000 + n), now)
    for n in range(OUTCOMES_KEPT):
        service.observe(_failed(f"bad-{n}", "w0", 1, T + 5_000 + n), now)
    assert _opened(service, now + 100) == []
    assert service.breakers._workers["w0"].last_failure_ms is None


def _queued(rid: str, now: int) -> Queued:
    return Queued(event_time_ms=now, request_id=rid, model=MODEL, prompt_tokens=10,
                  max_tokens=10, created_ms=now)


def _open(service: ControllersService) -> tuple[list[str], int]:
    """The requests the autoscaler counts as accepted and not ended, and their count."""
    return list(service.autoscaler._open), service.autoscaler._open_by_model[MODEL]


@pytest.mark.parametrize("late", ["failed", "cancelled"])
def test_a_replaced_attempts_late_end_does_not_end_its_request_for_the_autoscaler(
        late: str) -> None:
    """Attempt 1 ran on w0, which handed it back (``Requeued``: no end either); attempt 2 runs on
    w1 when attempt 1's end is read late: the request is still open (it keeps its model from
    idling to zero, and wakes a pool at zero while it waits). Before 7 Dec any end closed it.
    Attempt 2's end closes it; so does an end naming no attempt (an older writer), as before."""
    service = _service()
    now = T
    service.observe(_queued("r", now), now)
    service.observe(_started("r", "w0", 1, now + 1), now + 1)
    service.observe(Requeued(event_time_ms=now + 2, request_id="r", model=MODEL, worker_id="w0",
                             attempt=1, tokens_done=3, detail="drain"), now + 2)
    assert _open(service) == (["r"], 1)
    service.observe(_started("r", "w1", 2, now + 3), now + 3)
    end = _failed("r", "w0", 1, now + 4) if late == "failed" else Cancelled(
        event_time_ms=now + 4, request_id="r", model=MODEL, worker_id="w0", attempt=1)
    service.observe(end, now + 4)
    assert _open(service) == (["r"], 1)
    service.observe(_completed("r", "w1", 2, now + 5), now + 5)
    assert _open(service) == ([], 0)
    service.observe(_queued("old", now), now)  # from a writer that names no attempt
    service.observe(_started("old", "w1", 2, now + 1), now + 1)
    service.observe(_failed("old", "w0", None, now + 2), now + 2)
    assert _open(service) == ([], 0)


def test_a_request_continued_after_an_earlier_attempts_end_was_read_is_open_again() -> None:
    """Attempt 1's late failure is read before attempt 2's ``Started`` (the controllers do not
    read the dispatches: the router had continued the request when it read that failure, and so
    did not end it): the request is open again once attempt 2 is seen, until its own end."""
    service = _service()
    service.observe(_queued("r", T), T)
    service.observe(_started("r", "w0", 1, T + 1), T + 1)
    service.observe(_failed("r", "w0", 1, T + 2), T + 2)
    assert _open(service) == ([], 0)
    service.observe(_started("r", "w1", 2, T + 3), T + 3)
    assert _open(service) == (["r"], 1)
    service.observe(_failed("r", "w1", 2, T + 4), T + 4)
    assert _open(service) == ([], 0)
    service.observe(_started("r", "w1", 2, T + 5), T + 5)  # (read again: not a new attempt)
    assert _open(service) == ([], 0)



def test_a_queued_read_again_after_its_request_completed_opens_nothing() -> None:
    """A ``Queued`` its writer sent twice, the second read after the request completed: the
    request stays ended (before 7 Dec it was open again until ``OPEN_FOR_MS``, an hour, and its
    model never idled to zero meanwhile). The requests so remembered are the newest 10,000."""
    from controllers.autoscaler import _ENDED_FIRST_KEPT

    service = _service()
    service.observe(_queued("r", T), T)
    service.observe(_started("r", "w0", 1, T + 1), T + 1)
    service.observe(_completed("r", "w0", 1, T + 2), T + 2)
    service.observe(_queued("r", T), T + 3)
    assert _open(service) == ([], 0)
    a = service.autoscaler
    for n in range(_ENDED_FIRST_KEPT + 1):
        a.accepted(f"q{n}", MODEL, T + 4)
        a.ended(f"q{n}")
    assert len(a._completed) == _ENDED_FIRST_KEPT and "r" not in a._completed


def _open_after_each(read: list) -> list[int]:
    """The requests counted open after each of ``read``'s messages is observed, in order."""
    service = _service()
    counts = []
    for message, _ in read:
        service.observe(message, message.event_time_ms)
        counts.append(_open(service)[1])
    return counts


_ENDS_THEN_QUEUED_AGAIN = {  # what is read, in order, and the requests counted open after each
    "failed for good, queued again": [
        (_queued("r", T), 1), (_started("r", "w0", 1, T + 1), 1), (_failed("r", "w0", 1, T + 2), 0),
        (_queued("r", T), 0)],
    "cancelled, queued again": [
        (_queued("r", T), 1), (_started("r", "w0", 1, T + 1), 1),
        (Cancelled(event_time_ms=T + 2, request_id="r", model=MODEL, worker_id="w0", attempt=1),
         0), (_queued("r", T), 0)],
    "completed before queued, queued again": [
        (_completed("r", "w0", 1, T + 2), 0), (_queued("r", T), 0), (_queued("r", T), 0)],
    "failed before queued, queued again": [
        (_failed("r", "w0", 1, T + 2), 0), (_queued("r", T), 0), (_queued("r", T), 0)],
    "failed before queued, then continued": [
        (_failed("r", "w0", 1, T + 2), 0), (_queued("r", T), 0),
        (_started("r", "w1", 2, T + 3), 1), (_completed("r", "w1", 2, T + 4), 0)],
}


@pytest.mark.parametrize("order", list(_ENDS_THEN_QUEUED_AGAIN))
def test_a_request_seen_ending_is_opened_again_by_a_continuation_only(order: str) -> None:
    """Whatever ended a request (a ``Failed`` or ``Cancelled`` of its attempt, a ``Completed``),
    read before or after its ``Queued``, the ``Queued`` read again opens nothing (before 7 Dec
    it opened the request for an hour, unless a ``Completed`` read after the ``Queued`` had
    ended it); a continuation seen starting after it does (before, one whose replaced
    attempt's end was read before the ``Queued`` was never counted while it ran)."""
    expected = [count for _, count in _ENDS_THEN_QUEUED_AGAIN[order]]
    assert _open_after_each(_ENDS_THEN_QUEUED_AGAIN[order]) == expected


_CONTINUED = _started("r", "w1", 2, T + 2)  # attempt 2, on w1
_REPLACED_END = _failed("r", "w0", 1, T + 3)  # attempt 1's, on w0, read late
_STARTS_FIRST = {  # what is read, in order, and the requests counted open after each
    "started, queued, completed": [
        (_started("r", "w0", 1, T), 0), (_queued("r", T + 1), 1),
        (_completed("r", "w0", 1, T + 5), 0)],
    "continued, queued, replaced's end, completed": [
        (_CONTINUED, 0), (_queued("r", T + 1), 1), (_REPLACED_END, 1),
        (_completed("r", "w1", 2, T + 5), 0)],
    "continued, replaced's end, queued, completed": [
        (_CONTINUED, 0), (_REPLACED_END, 0), (_queued("r", T + 1), 1),
        (_completed("r", "w1", 2, T + 5), 0)],
    "started, its end, continued, queued, completed": [
        (_started("r", "w0", 1, T), 0), (_REPLACED_END, 0), (_CONTINUED, 0),
        (_queued("r", T + 1), 1), (_completed("r", "w1", 2, T + 5), 0)],
    "started, completed, queued": [
        (_started("r", "w0", 1, T), 0), (_completed("r", "w0", 1, T + 5), 0),
        (_queued("r", T + 1), 0)],
}


@pytest.mark.parametrize("order", list(_STARTS_FIRST))
def test_a_start_read_before_its_requests_queued_is_remembered_for_it(order: str) -> None:
    """The router sends a request's ``Queued`` once its ``Dispatch`` is on the broker, so a
    worker's ``Started`` may be read first (or long before: a router that crashed in between
    sends it once restarted). The request counts as accepted and not ended from its ``Queued``
    to its end, at the newest attempt started: a continuation (attempt 2 on w1) that started
    before the ``Queued`` was read is not ended by the replaced attempt's end (attempt 1 on
    w0, read late). Before 7 Dec such a start was forgotten: the ``Queued`` opened the request
    at attempt 1, and attempt 1's end closed it (or, read before the ``Queued``, kept it from
    being opened) while attempt 2 ran. A request that ran and ended before its ``Queued`` was
    read is not opened by it."""
    assert _open_after_each(_STARTS_FIRST[order]) == [count for _, count in _STARTS_FIRST[order]]


def test_the_starts_remembered_for_a_queued_to_come_are_bounded() -> None:
    """Starts of requests whose ``Queued`` never comes (read before this process started) are
    kept the newest 10,000 at most, as the ends read before their ``Queued`` are."""
    from controllers.autoscaler import _ENDED_FIRST_KEPT, Autoscaler

    a = Autoscaler()
    for n in range(_ENDED_FIRST_KEPT + 500):
        a.attempted(f"r{n}", 1, T + n)
    assert len(a._started_first) == _ENDED_FIRST_KEPT
    assert f"r{_ENDED_FIRST_KEPT + 499}" in a._started_first and "r0" not in a._started_first
