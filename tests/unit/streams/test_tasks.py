"""The task book: closing as succeeded, failed or timed out; costs before and after closing."""

import copy

import orjson
import pytest

from schemas.limits import MAX_ID_CHARS, MAX_RECORD_BYTES, MAX_TASK_STEPS
from streams.signals.tasks import CHARGES_KEPT, RUN_HELD_MAX_S, TaskBook

T = 1_700_000_000_000


def _step(rid, step, steps, outcome="ok", t=0):
    return {"k": "step", "rid": rid, "step": step, "steps": steps, "o": outcome, "t": T + t,
            "tn": "acme"}


def _run(rid, step, deadline, t=0):
    return {"k": "run", "rid": rid, "step": step, "t": T + t, "tn": "acme", "dl": T + deadline}


def _cost(rid, usd, attempt=1, t=0):
    return {"k": "cost", "rid": rid, "a": attempt, "usd": usd, "t": T + t, "tn": "acme",
            "w": "w0"}


def _closed(outs):
    return [(o.key, o.payload["o"], o.payload["usd"]) for o in outs if o.payload["k"] == "tc"]


def test_succeeds_when_every_step_completed_in_any_order():
    book = TaskBook({})
    assert book.apply("t", _run("s2", 2, 60_000)) == []  # a step queued opens the task
    charge = book.apply("t", _cost("s2", 0.2))  # attributed spend for the tenant and the fleet
    assert [(o.key, o.payload["k"], o.payload["usd"]) for o in charge] == [
        ("tenant:acme", "ch", 0.2), ("fleet:all", "ch", 0.2)]
    assert book.apply("t", _step("s2", 2, 3)) == []
    assert book.apply("t", _step("s1", 1, 3)) == []
    outs = book.apply("t", _step("s3", 3, 3))
    assert _closed(outs) == [("tenant:acme", "succeeded", 0.2), ("fleet:all", "succeeded", 0.2)]


def test_fails_at_step_3_of_5_and_costs_arriving_after_the_close_still_count():
    book = TaskBook({})
    book.apply("t", _run("s1", 1, 60_000))
    book.apply("t", _cost("s1", 0.1))
    book.apply("t", _step("s1", 1, 5))
    book.apply("t", _step("s2", 2, 5))
    outs = book.apply("t", _step("s3", 3, 5, "failed"))
    assert _closed(outs)[0][1:] == ("failed", 0.1)
    late = book.apply("t", _cost("s3", 0.3))
    assert sorted((o.payload["k"], o.payload["usd"]) for o in late) == [
        ("ch", 0.3), ("ch", 0.3), ("tl", 0.3), ("tl", 0.3)]
    assert book.apply("t", _cost("s3", 0.3)) == []  # the same charge again
    assert book.apply("t", _step("s4", 4, 5)) == []  # closed tasks stay closed


@pytest.mark.parametrize("payload", [_step("s1", 1, 2), _step("s1", 1, 1),
                                     _step("s1", 1, 2, "failed"), _cost("s1", 0.5)])
def test_duplicates_are_dropped(payload):
    table = {}
    book = TaskBook(table)
    book.apply("t", _run("s1", 1, 60_000))
    book.apply("t", payload)
    before = copy.deepcopy(table)
    assert book.apply("t", dict(payload)) == []
    assert table == before


def test_a_long_task_keeps_its_entry_under_the_record_limit():
    """3,000 steps of one task took 30 s of CPU (each step searched lists of every request id
    and charge, and checked every step against the list of those done); its time per step is
    ``python -m benchmarks.streams_long_task``'s business, its bounds this test's."""
    table = {}
    book = TaskBook(table)
    steps, rid = MAX_TASK_STEPS, "r" * MAX_ID_CHARS
    book.apply("t", _run(f"{rid[:-6]}{1:06d}", 1, 60_000))
    for step in range(1, steps + 1):
        for attempt in (1, 2):
            book.apply("t", _cost(f"{rid[:-6]}{step:06d}", 0.001, attempt))
        outs = book.apply("t", _step(f"{rid[:-6]}{step:06d}", step, steps))
    assert _closed(outs)[0][1:] == ("succeeded", pytest.approx(2 * steps * 0.001))
    assert len(table["t"]["charged"]) == CHARGES_KEPT
    assert len(orjson.dumps(table["t"])) < MAX_RECORD_BYTES * 0.6


def test_a_charge_of_a_task_no_step_has_opened_opens_none():
    """A charge alone opened a task, which then timed out: a task that never ran counted as
    timed out. Its cost counts as attributed spend and as task cost, as after a close."""
    table = {}
    book = TaskBook(table, idle_timeout_s=120)
    outs = book.apply("t", _cost("s1", 0.5))
    assert [(o.key, o.payload["k"], o.payload["usd"]) for o in outs] == [
        ("tenant:acme", "ch", 0.5), ("fleet:all", "ch", 0.5),
        ("tenant:acme", "tl", 0.5), ("fleet:all", "tl", 0.5)]
    assert table["t"]["unheld"] and book.expires_ms(table["t"]) == T + 600_000  # its digest
    assert book.sweep(["t"], T + 200_000) == ([], [])
    assert book.sweep(["t"], T + 600_001) == ([], ["t"]) and table == {}


def test_a_charge_of_a_task_not_held_counts_once_when_sent_again():
    """A charge of a task the book does not hold, forgotten after its close or not opened yet,
    sent again by a crash's replay: before 7 Dec no entry kept its digest, and it counted twice.
    A step opening the task meanwhile keeps the digest; ``retention_s`` after the charge, with
    no task, it is forgotten."""
    for step_between in (False, True):
        table = {}
        book = TaskBook(table, retention_s=600)
        outs = book.apply("t", _cost("s1", 0.5), T)
        if step_between:
            book.apply("t", _run("s1", 1, 60_000, t=10), T + 10)
        outs += book.apply("t", _cost("s1", 0.5), T + 10)  # the replay's
        assert sorted(o.payload["k"] for o in outs if o.key == "fleet:all") == ["ch", "tl"]
    assert _closed(book.apply("t", _step("s1", 1, 1, t=20))) == [
        ("tenant:acme", "succeeded", 0.0), ("fleet:all", "succeeded", 0.0)]  # counted as "tl"


def test_an_entry_written_before_5_dec_goes_on_as_it_was():
    table = {"t": {"tn": "acme", "steps": 3, "ok": [1, 2], "rids": ["s1", "s2"],
                   "charged": ["s1:1", "s2:1"], "usd": 0.3, "o": None, "closed": None,
                   "last": T}}
    book = TaskBook(table)
    assert book.apply("t", _cost("s2", 0.2)) == []  # charged before
    assert _closed(book.apply("t", _step("s3", 3, 3)))[0][1:] == ("succeeded", 0.3)


def test_a_step_completed_after_its_deadline_times_the_task_out():
    outs = TaskBook({}).apply("t", _step("s1", 1, 2, "late"))
    assert _closed(outs)[0][1] == "timed_out"


def test_idle_open_tasks_time_out_and_closed_ones_are_forgotten():
    table = {}
    book = TaskBook(table, idle_timeout_s=60, retention_s=100)
    book.apply("open", _step("a1", 1, 3, t=0))
    book.apply("done", _step("b1", 1, 1, t=0))
    outs, gone = book.sweep(list(table), T + 30_000)
    assert outs == [] and gone == []
    outs, gone = book.sweep(list(table), T + 61_000)
    assert _closed(outs) == [("tenant:acme", "timed_out", 0.0), ("fleet:all", "timed_out", 0.0)]
    assert outs[0].payload["t"] == T + 60_000
    _outs, gone = book.sweep(list(table), T + 101_000)
    assert gone == ["done"] and "open" in table


def test_a_step_running_within_its_deadline_keeps_its_task_open():
    """A step longer than the idle timeout (200 s of a 600 s deadline) timed its task out at
    ``last + idle_timeout_s`` though it completed in time."""
    table = {}
    book = TaskBook(table, idle_timeout_s=120)
    book.apply("t", _step("s1", 1, 2, t=1_000))
    book.apply("t", _run("s2", 2, deadline=602_000, t=2_000))
    assert book.sweep(list(table), T + 300_000) == ([], [])
    assert book.expires_ms(table["t"]) == T + 602_000 + 120_000
    outs = book.apply("t", _step("s2", 2, 2, t=202_000))
    assert _closed(outs)[0][1] == "succeeded" and "run" not in table["t"]


def test_a_step_whose_end_is_lost_holds_its_task_to_its_deadline_then_the_idle_timeout():
    table = {}
    book = TaskBook(table, idle_timeout_s=120)
    book.apply("t", _step("s1", 1, 2, t=1_000))
    book.apply("t", _run("s2", 2, deadline=600_000, t=2_000))
    assert book.sweep(list(table), T + 720_000) == ([], [])
    outs, _gone = book.sweep(list(table), T + 720_001)
    assert _closed(outs)[0][1] == "timed_out" and outs[0].payload["t"] == T + 720_000


def test_a_deadline_past_a_day_holds_its_task_a_day_and_an_ended_step_holds_nothing():
    table = {}
    book = TaskBook(table, idle_timeout_s=120)
    book.apply("far", _run("f1", 1, deadline=365 * 86_400_000))
    assert book.expires_ms(table["far"]) == T + int(RUN_HELD_MAX_S * 1000) + 120_000
    book.apply("ended", _step("e1", 1, 2))
    book.apply("ended", _run("e1", 1, deadline=600_000))  # re-sent after the step's end
    assert book.expires_ms(table["ended"]) == T + 120_000


def test_a_task_with_every_step_running_keeps_its_entry_under_the_record_limit():
    table = {}
    book = TaskBook(table)
    rid = "r" * MAX_ID_CHARS
    for step in range(1, MAX_TASK_STEPS + 1):
        book.apply("t", _run(f"{rid[:-6]}{step:06d}", step, deadline=10 ** 12))
        for attempt in (1, 2):
            book.apply("t", _cost(f"{rid[:-6]}{step:06d}", 0.001, attempt))
    assert len(table["t"]["run"]) == MAX_TASK_STEPS
    assert len(orjson.dumps(table["t"])) < MAX_RECORD_BYTES * 0.8
