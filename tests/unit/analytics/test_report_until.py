"""A report over a past window: its ``now`` and ``until`` are query parameters (``--until``),
not the engine's clock. Before 7 Dec every report's SQL read ``now64(3)``: a window could only end as it ran, and
a test could not fix the time.

The history: three moments, ``before`` (a day and two hours before ``UNTIL``), ``inside`` (12 h
before it) and ``after`` (2 h after it), each with a worker of its own pool heart-beating for
10 s, a request of its own tenant served there, one rejected, one queued and never ended, and a
scale command. All of it is
days old, at fixed times of fixed days, so it does not depend on when the test runs. The window
of ``--days 1 --until UNTIL`` holds ``inside``'s and nothing of the others.
"""

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analytics.audit import run_audit
from analytics.query import StoreSource
from analytics.reports import REPORTS, run_report
from analytics.store import Store, StoreLocation
from infra.cli import app
from schemas import events
from schemas.commands import ScalePool
from schemas.errors import GovernorError
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

DAY_MS = 86_400_000
_midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
#: The window's end: midnight UTC two days ago.
UNTIL = int((_midnight - dt.timedelta(days=2)).timestamp() * 1000)
MOMENTS = {"before": UNTIL - DAY_MS - 2 * 3_600_000, "inside": UNTIL - 12 * 3_600_000,
           "after": UNTIL + 2 * 3_600_000}
NAMESPACE = "t_until"


def _moment(label: str, t: int) -> list[tuple[str, object]]:
    """A worker of pool ``h100@<label>`` up for 10 s from ``t``, a request of tenant ``label``
    served on it, another rejected, one queued 5 s after ``t`` and never ended, and a scale
    command whose reason is ``label``."""
    out: list[tuple[str, object]] = [("telemetry", events.WorkerStatus(
        event_time_ms=t + i * 1000, worker_id=f"w-{label}", slot=0, pool=f"h100@{label}",
        gpu_type="h100", state="stopped" if i == 10 else "warm", prefix_cache_queries=i,
        started_ms=t - 1000)) for i in range(11)]
    for rid in (f"{label}-ok", f"{label}-no", f"{label}-open"):
        common = {"request_id": rid, "tenant": label, "model": label, "created_ms": t}
        out.append(("requests", InferenceRequest(event_time_ms=t, prompt_tokens=100,
                                                 max_tokens=10, **common)))
    common = {"request_id": f"{label}-ok", "tenant": label, "model": label, "created_ms": t}
    out += [("telemetry", m) for m in (
        events.Queued(event_time_ms=t, prompt_tokens=100, max_tokens=10, **common),
        events.Started(event_time_ms=t + 1000, worker_id=f"w-{label}", **common),
        events.FirstToken(event_time_ms=t + 1500, worker_id=f"w-{label}", ttft_s=1.5, **common),
        events.Completed(event_time_ms=t + 3000, worker_id=f"w-{label}", prompt_tokens=100,
                         output_tokens=10, e2e_s=3.0, **common),
        events.Rejected(event_time_ms=t + 2000, request_id=f"{label}-no", tenant=label,
                        model=label, created_ms=t, reason="no_capacity"),
        events.Queued(event_time_ms=t + 5000, request_id=f"{label}-open", tenant=label,
                      model=label, created_ms=t, prompt_tokens=100, max_tokens=10))]
    out.append(("control", ScalePool(event_time_ms=t + 1000, command_id=f"c-{label}",
                                     issued_by="autoscaler", reason=label, pool=f"h100@{label}",
                                     gpu_type="h100", model=label, replicas=2)))
    return out


def _history() -> list[tuple[str, object]]:
    return [each for label, t in MOMENTS.items() for each in _moment(label, t)]


#: What each report shows of the moments: the labels found in its rows.
LABELS = {
    "cost": lambda rows: {r["pool"].split("@")[1] for r in rows},
    "slo": lambda rows: {r["tenant"] for r in rows},
    "cache": lambda rows: {r["pool"].split("@")[1] for r in rows},
    "actions": lambda rows: {r["reason"] for r in rows},
    "rejections": lambda rows: {r["tenant"] for r in rows},
}


def sink_dir(folder: Path, namespace: str, history: list[tuple[str, object]]) -> Path:
    """``folder`` as a sink's directory holding ``history`` in ``namespace``'s store, closed
    (``governor report`` opens it again)."""
    store = Store.open(StoreLocation.for_namespace(namespace, folder))
    _write(store, 1, history)
    store.close()
    return folder


def read_only(folder: Path, namespace: str) -> Iterator[StoreSource]:
    """A fixture's body: ``namespace``'s store in ``folder``, open read-only while it runs."""
    store = Store.open(StoreLocation.for_namespace(namespace, folder), readonly=True)
    yield StoreSource(store)
    store.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sink_dir(tmp_path_factory.mktemp("analytics"), NAMESPACE, _history())


@pytest.fixture
def source(data_dir):
    yield from read_only(data_dir, NAMESPACE)


@pytest.mark.parametrize("name", LABELS)
def test_a_window_that_ended_holds_what_is_inside_it_only(source, name):
    rows = run_report(source, name, days=1, until_ms=UNTIL).dicts()
    assert LABELS[name](rows) == {"inside"}
    # (ends now: all three moments; ``before`` is 3 days 2 h before today's midnight, so 4
    # days missed it from 22:00 UTC on, and the test failed for two hours a day)
    everything = run_report(source, name, days=5).dicts()
    assert LABELS[name](everything) == set(MOMENTS)


def test_the_cost_of_a_window_that_ended(source):
    [row] = run_report(source, "cost", days=1, until_ms=UNTIL).dicts()
    assert (row["tenant"], row["requests"]) == ("inside", 1)
    assert row["gpu_hours"] == pytest.approx(10 / 3600, abs=1e-4)


def test_task_failures_of_a_window_that_ended(source):
    """The ``before`` requests are in the day before the window that tasks look back into, and
    count only there; the ``after`` ones are past the window's end."""
    rows = run_report(source, "task-failures", days=1, until_ms=UNTIL).dicts()
    assert [(r["outcome"], r["tasks"]) for r in rows] == [("rejected:no_capacity", 1),
                                                          ("unfinished", 1)]


def test_the_audit_counts_recent_from_the_time_it_is_given(source):
    """Each ``-open`` request was queued 5 s after its moment and never ended: with a grace of
    5 s, ``after-open`` is in flight just after it, and the others miss their terminal state; a
    minute later, all three do."""
    just_after = run_audit(source, grace_s=5, now_ms=MOMENTS["after"] + 6000)
    later = run_audit(source, grace_s=5, now_ms=MOMENTS["after"] + 60_000)
    assert (just_after["in_flight"], just_after["missing_terminal"]) == (1, 2)
    assert (later["in_flight"], later["missing_terminal"]) == (0, 3)


def test_a_window_that_ended_reaches_back_less_far(source):
    """The tables' TTLs count back from the wall clock: 10 days ago, cost (heartbeats kept 30
    days, a day before its window read too) answers at most 19 days back from there."""
    now = UNTIL + 10 * DAY_MS
    run_report(source, "cost", days=19, until_ms=UNTIL, now_ms=now)
    with pytest.raises(GovernorError, match=r"the cost report reads worker_status, kept 30 "
                                            r"days, from 1 day before its window: a window that "
                                            r"ends 10.0 days ago \(--until\) answers at most "
                                            r"--days 19, not 20"):
        run_report(source, "cost", days=20, until_ms=UNTIL, now_ms=now)
    with pytest.raises(GovernorError, match=r"ends 95.0 days ago .* at most --days 0, not 1"):
        run_report(source, "slo", days=1, until_ms=UNTIL, now_ms=UNTIL + 95 * DAY_MS)


NOW = 1_796_529_600_000  # 2026-12-06T04:00:00Z


@pytest.mark.parametrize(("text", "ms"), [
    ("2026-12-06T00:00:00Z", 1_796_515_200_000),
    ("2026-12-06", 1_796_515_200_000),  # a date: its midnight UTC
    ("2026-12-06T01:00:00+01:00", 1_796_515_200_000),
    ("2026-12-06T00:00:00.123Z", 1_796_515_200_123),
    ("2026-12-06T04:00:00Z", NOW),  # not ahead of the clock: fine
])
def test_until_takes_an_iso_time_with_its_zone_or_a_date(text, ms):
    from analytics.window import parse_until

    assert parse_until(text, NOW) == ms


@pytest.mark.parametrize(("text", "says"), [
    ("2026-12-06T00:00:00", "no ISO-8601 time with a zone"),  # whose zone? not guessed
    ("yesterday", "no ISO-8601 time with a zone .*2026-12-06T00:00:00Z.* nor a date"),
    ("1796515200000", "no ISO-8601 time with a zone"),
    ("2026-12-06T04:00:00.001Z", r"--until 2026-12-06T04:00:00.001Z is ahead of this clock "
                                 r"\(2026-12-06 04:00:00.000 UTC\)"),
    # (before 7 Dec: `--audit` failed on the engine's `cannot be parsed as DateTime64(3, 'UTC')
    # for query parameter 'now'`, and the time below a Python ValueError, `year 0 is out of range`)
    ("0001-01-01", r"--until 0001-01-01 is before 1970-01-01T00:00:00Z, when event times begin"),
    ("0001-01-01T00:00:00+01:00", r"--until 0001-01-01T00:00:00\+01:00 is before 1970-01-01"),
    ("1969-12-31T23:59:59.999Z", r"--until 1969-12-31T23:59:59.999Z is before 1970-01-01"),
])
def test_until_refuses_what_is_no_time_or_is_ahead(text, says):
    from analytics.window import parse_until

    with pytest.raises(GovernorError, match=says):
        parse_until(text, NOW)


def _governor(data_dir, *args: str):
    result = CliRunner().invoke(app, ["report", "--data-dir", str(data_dir), "--namespace",
                                      NAMESPACE, *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.stdout


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_report_until_ends_the_window_there(data_dir):
    got = json.loads(_governor(data_dir, "slo", "rejections", "--days", "1", "--until",
                               _iso(UNTIL), "--json"))
    assert {name: LABELS[name](rows) for name, rows in got.items()} == {
        "slo": {"inside"}, "rejections": {"inside"}}
    shown = _governor(data_dir, "slo", "--days", "1", "--until", _iso(UNTIL), "--show-sql")
    assert f"--param 'now=\"{_iso(UNTIL)[:10]} 00:00:00.000\"'" in shown.splitlines()[0]


@pytest.mark.parametrize(("args", "says"), [
    (["--until", "yesterday"], "--until 'yesterday' is no ISO-8601 time with a zone"),
    (["--until", "2999-01-01"], "--until 2999-01-01 is ahead of this clock"),
    (["--until", _iso(UNTIL - 40 * DAY_MS), "--days", "1"],
     "the cost report reads worker_status, kept 30 days, from 1 day before its window: a "
     "window that ends 4"),
])
def test_report_until_refuses_clearly(data_dir, args, says):
    with pytest.raises(GovernorError, match=says.replace("(", r"\(").replace(")", r"\)")):
        _governor(data_dir, "cost", *args)


def test_a_window_without_until_has_no_end(store):
    """A command stamped an hour ahead of the clock (its readers refuse it: a ``--until`` of now
    leaves it out) shows in a report that ends now, as it did when the SQL read the engine's
    clock and set no end."""
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    _write(store, 1, [("control", ScalePool(
        event_time_ms=now + 3_600_000, command_id="c-ahead", issued_by="alice", reason="ahead",
        pool="h100@m", gpu_type="h100", model="m", replicas=2))])
    assert LABELS["actions"](run_report(StoreSource(store), "actions", now_ms=now).dicts()) == {
        "ahead"}
    assert run_report(StoreSource(store), "actions", until_ms=now, now_ms=now).dicts() == []


def test_every_report_takes_now(source):
    """Each report's SQL reads its window from ``{now}`` and ``{until}``, none the engine's
    clock."""
    for report in REPORTS.values():
        assert "now64" not in report.sql
        assert "{now:DateTime64(3, 'UTC')}" in report.sql
        assert "{until:DateTime64(3, 'UTC')}" in report.sql
