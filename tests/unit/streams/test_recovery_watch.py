"""The watch on the tables' recovery (``streams.recovery``): progress, its log level, the stall
bound and what a stall names; what a recovery step that timed out is told from and names;
without a broker."""

import asyncio
import logging
from types import SimpleNamespace

import pytest
from faust.types import TP

from streams.recovery import (SLOW_S, Look, RecoveryStalled, RecoveryWatch, changelogs_left,
                              step_timed_out, step_timed_out_line, watch_recovery)

A, B = ("ns.streams-windows-changelog", 0), ("ns.streams-tasks-changelog", 3)


def test_nothing_to_say_while_no_recovery():
    assert RecoveryWatch().look(10.0, False, {}, False) == Look(0.0, 0)


def test_progress_says_records_read_of_total_and_what_is_left():
    watch = RecoveryWatch(progress_every_s=5, stall_s=60)
    first = watch.look(100.0, True, {A: 1000, B: None}, False)
    assert first.line == ("recovering the tables for 0 s: 0 of 1,000 records read; waiting on "
                          f"{A[0]}[0] 1,000 left, {B[0]}[3] highwater not known yet")
    assert (first.recovering_s, first.remaining, first.level) == (0.0, 1000, logging.INFO)
    between = watch.look(102.0, True, {A: 600, B: 50}, False)
    assert (between.line, between.recovering_s, between.remaining) == (None, 2.0, 650)
    later = watch.look(105.0, True, {A: 0, B: 20}, False)
    assert later.line == ("recovering the tables for 5 s: 1,030 of 1,050 records read; waiting "
                          f"on {B[0]}[3] 20 left")


def test_a_slow_recovery_is_a_warning():
    watch = RecoveryWatch(progress_every_s=5, stall_s=600)
    watch.look(0.0, True, {A: 10_000}, False)
    assert watch.look(SLOW_S - 1, True, {A: 9_000}, False).level == logging.INFO
    assert watch.look(SLOW_S + 5, True, {A: 8_000}, False).level == logging.WARNING


def test_a_recovery_that_reads_on_is_never_stalled_however_long():
    watch = RecoveryWatch(progress_every_s=5, stall_s=60)
    watch.look(0.0, True, {A: 1_000_000}, False)
    for minute in range(1, 100):
        assert watch.look(minute * 59.0, True, {A: 1_000_000 - minute}, False).stalled is None


def test_reading_nothing_for_the_bound_is_a_stall_naming_the_partition():
    watch = RecoveryWatch(progress_every_s=5, stall_s=60)
    watch.look(0.0, True, {A: 2, B: 7}, False)
    watch.look(10.0, True, {A: 1, B: 0}, False)
    assert watch.look(69.0, True, {A: 1, B: 0}, False).stalled is None
    stalled = watch.look(70.0, True, {A: 1, B: 0}, False).stalled
    assert stalled == ("the tables' recovery read nothing for 60 s (the bound, recovery_stall_s, "
                       f"is 60 s): waiting on {A[0]}[0] 1 left")


def test_a_highwater_never_learnt_is_a_stall_too():
    watch = RecoveryWatch(stall_s=90)
    watch.look(0.0, True, {A: None}, False)
    assert "highwater not known yet" in watch.look(90.0, True, {A: None}, False).stalled


def test_the_end_says_how_long_and_how_much_then_a_new_recovery_starts_afresh():
    watch = RecoveryWatch(progress_every_s=5, stall_s=60)
    watch.look(0.0, True, {A: 300, B: 200}, False)
    end = watch.look(12.5, False, {A: 0, B: 0}, finished=True)
    assert end.line == "recovered the tables in 12.5 s: 500 records of 2 changelog partitions"
    assert (end.recovering_s, end.remaining) == (0.0, 0)
    again = watch.look(100.0, True, {A: 40}, False)
    assert again.line.startswith("recovering the tables for 0 s: 0 of 40 records read")
    assert watch.look(159.0, True, {A: 40}, False).stalled is None  # 60 s from its own start


def test_a_recovery_ends_only_once_faust_has_made_the_tables_ready():
    """Faust drops ``in_recovery`` while the highwaters are awaited, and raises it again."""
    watch = RecoveryWatch(progress_every_s=5, stall_s=60)
    assert watch.look(0.0, True, {A: None, B: None}, False).line == (
        "recovering the tables for 0 s: waiting for the changelogs' end offsets (2 changelog "
        "partitions)")
    awaited = watch.look(5.0, False, {A: None, B: None}, False)
    assert (awaited.line, awaited.recovering_s) == (
        "recovering the tables for 5 s: waiting for the changelogs' end offsets (2 changelog "
        "partitions)", 5.0)
    watch.look(12.0, True, {A: 300, B: 200}, False)
    read = watch.look(14.0, False, {A: 0, B: 0}, False)  # the seeks, the standbys to come
    assert (read.line, read.recovering_s) == (None, 14.0)
    assert watch.look(15.0, False, {A: 0, B: 0}, True).line == (
        "recovered the tables in 15.0 s: 500 records of 2 changelog partitions")


def test_partitions_beyond_the_named_are_counted():
    watch = RecoveryWatch()
    line = watch.look(0.0, True, {("t", p): 10 + p for p in range(8)}, False).line
    assert line.endswith("t[7] 17 left, t[6] 16 left, t[5] 15 left, t[4] 14 left, "
                         "t[3] 13 left and 3 more")


@pytest.mark.parametrize("field, value", [("progress_every_s", 0), ("stall_s", -1)])
def test_bad_bounds_are_refused_naming_them(field, value):
    with pytest.raises(ValueError, match=field):
        RecoveryWatch(**{field: value})


def faust_recovery(in_recovery, ready=False, **offsets):
    """Faust's ``Recovery`` as the watch reads it: ``offsets`` by partition of one changelog,
    (highwater, offset read to), either None while not known; ``ready``: its tables'
    ``actives_ready``."""
    tps = {p: TP("cl", int(p[1:])) for p in offsets}
    return SimpleNamespace(
        in_recovery=in_recovery, active_tps=set(tps.values()),
        active_highwaters={tps[p]: hw for p, (hw, _) in offsets.items() if hw is not None},
        active_offsets={tps[p]: off for p, (_, off) in offsets.items()},
        tables=SimpleNamespace(actives_ready=ready))


def test_records_left_are_the_highwater_less_the_offset_read_to():
    recovery = faust_recovery(True, p0=(9, -1), p1=(5, 5), p2=(None, -1), p3=(4, None))
    assert changelogs_left(recovery) == {("cl", 0): 10, ("cl", 1): 0, ("cl", 2): None,
                                         ("cl", 3): None}


class FakeApp:
    """The Faust app as the watch uses it: its stop, its crash and its sleep."""

    def __init__(self, looks_before_stop: int | None = None) -> None:
        self.crashed: list[BaseException] = []
        self.sleeps = 0
        self.looks_before_stop = looks_before_stop

    @property
    def should_stop(self) -> bool:
        return bool(self.crashed) or self.sleeps == self.looks_before_stop

    async def crash(self, exc: BaseException) -> None:
        self.crashed.append(exc)

    async def sleep(self, _seconds: float) -> None:
        self.sleeps += 1


def test_a_stall_is_logged_as_an_error_and_crashes_the_worker(caplog):
    recovery = faust_recovery(True, p0=(1, 0))
    clock = iter(range(0, 1000, 30))
    seen, app = [], FakeApp()
    caplog.set_level(logging.INFO, logger="streams.recovery")
    asyncio.run(watch_recovery(recovery, RecoveryWatch(stall_s=60), seen.append, app,
                               clock=lambda: float(next(clock))))
    assert [look.recovering_s for look in seen] == [0, 30, 60]
    assert [type(exc) for exc in app.crashed] == [RecoveryStalled]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"the streams worker stops: {app.crashed[0]}"]
    assert "waiting on cl[0] 1 left" in errors[0]


def test_the_watch_ends_when_the_app_stops():
    recovery, seen, app = faust_recovery(False), [], FakeApp(looks_before_stop=3)
    asyncio.run(watch_recovery(recovery, RecoveryWatch(), seen.append, app))
    assert (len(seen), app.crashed) == (3, [])


#: Faust's recovery of cl[0], 100 records, whose highwater the broker answers 12 s into it, by
#: second: (in_recovery, highwater, offset read to, actives_ready). Its changelog reader, waiting
#: 5 s for a record, finds nothing it knows left and drops ``in_recovery`` meanwhile.
SLOW_HIGHWATERS = {0: (True, None, -1, False), 5: (False, None, -1, False),
                   12: (True, 99, -1, False), 14: (False, 99, 99, False),
                   16: (False, 99, 99, True)}


def test_a_slow_highwater_is_waited_for_and_the_end_told_once(caplog):
    recovery = faust_recovery(True, p0=(None, -1))
    tp, seconds, app = TP("cl", 0), iter(range(20)), FakeApp(looks_before_stop=20)

    def clock() -> float:
        second = next(seconds)
        if second in SLOW_HIGHWATERS:
            recovery.in_recovery, highwater, offset, ready = SLOW_HIGHWATERS[second]
            recovery.active_highwaters = {} if highwater is None else {tp: highwater}
            recovery.active_offsets, recovery.tables.actives_ready = {tp: offset}, ready
        return float(second)

    caplog.set_level(logging.INFO, logger="streams.recovery")
    asyncio.run(watch_recovery(recovery, RecoveryWatch(), lambda _: None, app, clock=clock))
    assert [r.getMessage() for r in caplog.records] == [
        "recovering the tables for 0 s: waiting for the changelogs' end offsets (1 changelog "
        "partitions)",
        "recovering the tables for 5 s: waiting for the changelogs' end offsets (1 changelog "
        "partitions)",
        "recovering the tables for 10 s: waiting for the changelogs' end offsets (1 changelog "
        "partitions)",
        "recovering the tables for 15 s: 100 of 100 records read; waiting on Faust to end the "
        "recovery (no records left)",
        "recovered the tables in 16.0 s: 100 records of 1 changelog partitions"]


def test_a_step_waited_on_with_a_timeout_timed_out_unless_the_worker_stops():
    assert step_timed_out(90.0, stopping=False)
    assert not step_timed_out(90.0, stopping=True)  # a stop (or crash) answered the wait
    assert not step_timed_out(None, stopping=False)  # a wait without a bound never times out


def test_a_timed_out_step_names_itself_its_bound_and_the_changelogs_first_five():
    changelogs = [("ns.streams-windows-changelog", p) for p in range(7)] + [B]
    assert step_timed_out_line("_build_highwaters", 90.0, changelogs) == (
        "the tables' recovery step _build_highwaters had no answer in 90 s (the bound, "
        "broker_request_timeout): the changelog partitions ns.streams-tasks-changelog[3], "
        + ", ".join(f"ns.streams-windows-changelog[{p}]" for p in range(4))
        + " and 3 more are not recovered")
    assert step_timed_out_line("flush", 0.5, []).endswith(
        "in 0.5 s (the bound, broker_request_timeout): the changelog partitions (none "
        "assigned) are not recovered")
