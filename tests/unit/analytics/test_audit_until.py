"""``governor report --audit --until TIME`` audits the requests sent before TIME, each judged by
all of its events, as the reports judge a window's requests. Before 7 Dec ``--until`` with the
audit alone was refused, and with a report named the audit ignored it.

The history, at fixed times two days ago: four requests sent before ``UNTIL`` (one done before
it, one running across it that completed after it, one that ended twice after it, one never
ended) and two sent after it (one never ended, one that ended twice)."""

import datetime as dt
import json

import pytest
from typer.testing import CliRunner

from analytics.audit import run_audit
from infra.cli import app
from schemas import events
from tests.unit.analytics.test_report_until import _iso, read_only, sink_dir

_midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
UNTIL = int((_midnight - dt.timedelta(days=2)).timestamp() * 1000)
NAMESPACE = "t_audit_until"
#: request id -> (when it was queued, when each of its ends came: "completed" or "failed"),
#: in seconds from UNTIL
REQUESTS = {
    "done-before": (-60, [(-50, "completed")]),
    "across": (-10, [(20, "completed")]),
    "twice-after": (-10, [(20, "completed"), (30, "failed")]),
    "open-before": (-30, []),
    "open-after": (10, []),
    "twice-later": (40, [(50, "completed"), (55, "failed")]),
}


def _history() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for rid, (queued_s, ends) in REQUESTS.items():
        common = {"request_id": rid, "tenant": "acme", "model": "m",
                  "created_ms": UNTIL + queued_s * 1000}
        out.append(("telemetry", events.Queued(event_time_ms=UNTIL + queued_s * 1000,
                                               prompt_tokens=1, max_tokens=1, **common)))
        for at_s, end in ends:
            at = UNTIL + at_s * 1000
            out.append(("telemetry", events.Completed(
                event_time_ms=at, worker_id="w", prompt_tokens=1, output_tokens=1, e2e_s=1.0,
                **common) if end == "completed" else events.Failed(
                event_time_ms=at, worker_id="w", reason="engine_error", **common)))
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sink_dir(tmp_path_factory.mktemp("analytics"), NAMESPACE, _history())


@pytest.fixture
def source(data_dir):
    yield from read_only(data_dir, NAMESPACE)


def _counts(audit: dict) -> dict[str, int]:
    return {k: audit[k] for k in ("requests", "accepted", "terminal", "multiple_terminal",
                                  "missing_terminal")}


def test_the_audit_until_a_time_judges_the_requests_sent_before_it_by_all_their_events(source):
    """``across`` completed after ``UNTIL``: fine (an audit as of ``UNTIL`` would have found it
    missing its end); ``twice-after`` ended twice after it: a violation."""
    audit = run_audit(source, until_ms=UNTIL)
    assert _counts(audit) == {"requests": 4, "accepted": 4, "terminal": 2,
                              "multiple_terminal": 1, "missing_terminal": 1}
    assert sorted(v["request_id"] for v in audit["violation_ids"]) == ["open-before",
                                                                      "twice-after"]


def test_the_audit_without_until_judges_every_request(source):
    assert _counts(run_audit(source)) == {"requests": 6, "accepted": 6, "terminal": 2,
                                          "multiple_terminal": 2, "missing_terminal": 2}


def _governor(data_dir, *args: str) -> str:
    """``governor report ARGS`` on the history (the audit exits 1: it finds violations)."""
    result = CliRunner().invoke(app, ["report", "--data-dir", str(data_dir), "--namespace",
                                      NAMESPACE, *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.stdout


@pytest.mark.parametrize("reports", [[], ["rejections"]])
def test_report_audit_until(data_dir, reports):
    """Alone or beside a report (whose window ends there too)."""
    got = json.loads(_governor(data_dir, "--audit", *reports, "--until", _iso(UNTIL), "--json"))
    audit = got if not reports else got["audit"]
    assert (audit["requests"], audit["violations"]) == (4, 2)
    shown = _governor(data_dir, "--audit", "--until", _iso(UNTIL), "--show-sql")
    assert f"--param 'until=\"{_iso(UNTIL)[:10]} 00:00:00.000\"'" in shown.splitlines()[0]


def test_the_grace_until_a_time_counts_back_from_it(data_dir, source):
    """``--grace-s`` leaves the requests active that recently before the window's end in
    flight: ``--until``'s, as the window's days count back from it. Before, it counted back
    from the wall clock, two days on: a grace of a minute at ``UNTIL`` left nothing in flight."""
    audit = run_audit(source, grace_s=60, until_ms=UNTIL)
    # open-before's one event, 30 s before UNTIL: in flight; twice-after: a violation still
    assert (audit["in_flight"], audit["missing_terminal"], audit["multiple_terminal"]) == (
        1, 0, 1)
    assert [v["request_id"] for v in audit["violation_ids"]] == ["twice-after"]
    got = json.loads(_governor(data_dir, "--audit", "--until", _iso(UNTIL), "--grace-s", "60",
                               "--json"))
    assert (got["in_flight"], got["missing_terminal"]) == (1, 0)
    shown = _governor(data_dir, "--audit", "--until", _iso(UNTIL), "--grace-s", "60",
                      "--show-sql")
    assert f"--param 'now=\"{_iso(UNTIL)[:10]} 00:00:00.000\"'" in shown.splitlines()[0]
    # with no end, the grace counts back from the clock: nothing of two days ago is recent
    assert run_audit(source, grace_s=60)["in_flight"] == 0
