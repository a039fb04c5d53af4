"""A request still running when the report is made (no terminal event yet) takes its share of
its pool's GPU time, up to its worker's last heartbeat, in a row of its own per pool-day, tenant
``(in flight)``: the requests that finished are charged their own time, as the streams charge
an attempt only once it ends.

The history of ``test_attempt_cost``: ``w-h`` (h100@m) and ``w-a`` (a100@m) heart-beat every
second from 0 to 10 s; ``beta`` runs one request of 1 s on each from 8 s, completed. Before
6 Dec a request without an end was left out of the attribution, and the finished requests of
its pool-day shared all of its time: ``beta`` paid for the whole 10 s of the H100 where it ran
1 s of them."""

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from tests.unit.analytics.test_attempt_cost import A100, ACME, BETA_S, H100, QUEUED, _history, ms
from tests.unit.analytics.test_last_attempt import _write
from tests.unit.analytics.test_midnight import DAY1, DAY2
from tests.unit.analytics.test_midnight import _history as midnight_history

IN_FLIGHT = "(in flight)"


def _rows(store) -> dict[tuple[str, str], tuple[int, int, float]]:
    """(tenant, pool): requests, successful tasks and share of the pool-day."""
    return {(r["tenant"], r["pool"]): (r["requests"], r["successful_tasks"], r["pool_share"])
            for r in run_report(StoreSource(store), "cost").dicts()}


def test_a_request_still_running_takes_its_share_in_a_row_of_its_own(store):
    """``acme`` started on the H100 at 1 s and runs on: 9 s to the last heartbeat, beta 1 s."""
    _write(store, 1, _history([
        QUEUED, events.Started(event_time_ms=ms(1), worker_id="w-h", **ACME)]))
    assert _rows(store) == {
        (IN_FLIGHT, H100): (0, 0, round(9 / (9 + BETA_S), 4)),
        ("beta", H100): (1, 1, round(BETA_S / (9 + BETA_S), 4)),
        ("beta", A100): (1, 1, 1.0)}


def test_each_attempt_of_a_request_still_running_is_in_flight_where_it_ran(store):
    """2 s on the H100, handed back, resumed on the A100 at 4 s and running there since (6 s
    to the last heartbeat). Before 6 Dec neither attempt was charged, and beta's request on
    each pool paid for both."""
    _write(store, 1, _history([
        QUEUED,
        events.Started(event_time_ms=ms(1), worker_id="w-h", attempt=1, **ACME),
        events.Requeued(event_time_ms=ms(3), worker_id="w-h", attempt=1, tokens_done=4, **ACME),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **ACME)]))
    assert _rows(store) == {
        (IN_FLIGHT, H100): (0, 0, round(2 / 3, 4)), ("beta", H100): (1, 1, round(1 / 3, 4)),
        (IN_FLIGHT, A100): (0, 0, round(6 / 7, 4)), ("beta", A100): (1, 1, round(1 / 7, 4))}


def test_the_cost_of_the_pool_day_is_all_charged_once(store):
    """The rows of a pool-day share its cost whole: the in-flight row's part is taken from
    nobody twice."""
    _write(store, 1, _history([
        QUEUED, events.Started(event_time_ms=ms(1), worker_id="w-h", **ACME)]))
    rows = [r for r in run_report(StoreSource(store), "cost").dicts() if r["pool"] == H100]
    assert sum(r["pool_share"] for r in rows) == 1.0
    assert sum(r["gpu_hours"] for r in rows) == round(10 / 3600, 4)


def test_a_request_running_past_midnight_is_in_flight_each_day_for_its_time_in_it(store):
    """``test_midnight``'s H100, heart-beating from M-4 s to M+4 s (its last heartbeat says
    ``stopped``): ``r-late`` starts at M-2 s and has no end; ``r-day`` runs M+2.5 to M+3.5 s.
    In flight 2 s on the first day (all of it) and 4 s on the second (4 : 1 with ``r-day``)."""
    _write(store, 1, [(topic, m) for topic, m in midnight_history() if not (
        isinstance(m, events.Completed) and m.request_id == "r-late")])
    got = run_report(StoreSource(store), "cost").dicts()
    assert [(r["day"], r["tenant"], r["requests"], r["pool_share"]) for r in got] == [
        (DAY1, IN_FLIGHT, 0, 1.0), (DAY2, IN_FLIGHT, 0, round(4 / 5, 4)),
        (DAY2, "beta", 1, round(1 / 5, 4))]
