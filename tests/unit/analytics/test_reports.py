"""The reports on a small hand-built history, against figures computed by hand.

The history goes in the way the sink writes it (messages -> rows -> a journal flush), so the
materialized views fill the rollups as in production. Times are on one day, yesterday from 01:00
UTC, so day and hour buckets are fixed and well within the TTLs.

Two workers: ``w-h`` (pool h100@m) heartbeats every 0.5 s from 0 to 10 s and stops at 10 s:
10 GPU-seconds; ``w-a`` (pool a100@m) at 0, 1, 2, 6 and stops at 7: 1 + 1 + 3 (a 4 s gap is
capped at 3 s) + 1 = 6 GPU-seconds. The h100 price is set to 3.60 $/h on the config topic (an
a100 price of -1 is rejected and ignored): h100 costs 10 * 3.6 / 3600 = 0.01 $, a100
6 * 1.8 / 3600 = 0.003 $.

| request | tenant | task, step | worker: first..last event | outcome                  |
|---------|--------|------------|---------------------------|--------------------------|
| r1      | acme   | t1 1/2     | w-h 0.2..2.2 (2.0 s)      | ok, TTFT 0.4             |
| r2      | acme   | t1 2/2     | w-h 3.1..4.1 (1.0 s)      | ok, TTFT 0.3             |
| r3      | acme   | t2 1/2     | w-a 0.5..2.5 (2.0 s)      | ok, TTFT 1.5 > SLO 1.0   |
| r4      | acme   | t2 2/2     | -                         | rejected (no_capacity)   |
| r5      | beta   | t3 1/1     | w-a 1.0..5.0 (4.0 s)      | late (deadline 4.0)      |
| r6      | beta   | r6 1/1     | w-h 2.0..2.5 (0.5 s)      | failed (engine_error)    |
| r7      | beta   | r7 1/1     | -                         | queued, never finished   |
| r8      | beta   | r8 1/1     | -                         | sent, never answered     |

Cost: h100 busy 3.5 s (acme 3.0, beta 0.5), a100 busy 6.0 s (acme 2.0, beta 4.0); only t1
succeeded, and it counts once, in the row of its final step (r2: acme, h100). A third worker
``w-x`` (pool h200@m) heartbeats at 0, 1 and 2 s and serves nothing: 2 GPU-seconds at 3.70 $/h
that no request is charged with.
"""

import datetime as dt

import pytest

from analytics.audit import run_audit
from analytics.batch import Batch
from analytics.journal import Journal
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.rows import message_row
from analytics.store import Store, StoreLocation
from schemas import events
from schemas.commands import ScalePool, SetBreakerState
from schemas.config import ConfigSet
from schemas.requests import InferenceRequest

_today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
DAY0 = _today - dt.timedelta(days=1)
T0 = int((DAY0 + dt.timedelta(hours=1)).timestamp() * 1000)
DAY = DAY0.date().isoformat()
H100, A100, H200 = "h100@m", "a100@m", "h200@m"


def ms(seconds: float) -> int:
    return T0 + int(round(seconds * 1000))


def _history() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []

    sent: dict[str, InferenceRequest] = {}

    def request(rid, tenant, task, step, total, deadline_s, slo=1.0):
        sent[rid] = InferenceRequest(
            event_time_ms=ms(0), created_ms=ms(0), request_id=rid, task_id=task, step=step,
            steps_total=total, tenant=tenant, model="m", prompt_tokens=100, max_tokens=10,
            ttft_slo_s=slo, deadline_ms=ms(deadline_s))
        out.append(("requests", sent[rid]))

    def event(kind, rid, tenant, at, **fields):
        if kind is events.Queued:  # with the request's task, step and SLO, as the router's
            req = sent[rid]
            fields = dict(task_id=req.task_id, step=req.step, steps_total=req.steps_total,
                          ttft_slo_s=req.ttft_slo_s, **fields)
        out.append(("telemetry", kind(event_time_ms=ms(at), request_id=rid, tenant=tenant,
                                      model="m", created_ms=ms(0), **fields)))

    def served(rid, tenant, worker, queued, start, ttft, end, prompt=100, cached=0,
               deadline_s=10.0):
        event(events.Queued, rid, tenant, queued, prompt_tokens=prompt, max_tokens=10,
              deadline_ms=ms(deadline_s))
        event(events.Started, rid, tenant, start, worker_id=worker)
        event(events.FirstToken, rid, tenant, start + 0.01, worker_id=worker, ttft_s=ttft)
        event(events.Completed, rid, tenant, end, worker_id=worker, prompt_tokens=prompt,
              output_tokens=10, cached_tokens=cached, e2e_s=end)

    request("r1", "acme", "t1", 1, 2, 10)
    request("r2", "acme", "t1", 2, 2, 10)
    request("r3", "acme", "t2", 1, 2, 20)
    request("r4", "acme", "t2", 2, 2, 20)
    request("r5", "beta", "t3", 1, 1, 4)
    request("r6", "beta", None, 1, 1, 10)
    request("r7", "beta", None, 1, 1, 10)
    request("r8", "beta", None, 1, 1, 10)
    served("r1", "acme", "w-h", 0.1, 0.2, 0.4, 2.2, cached=25)
    served("r2", "acme", "w-h", 3.0, 3.1, 0.3, 4.1)
    served("r3", "acme", "w-a", 0.0, 0.5, 1.5, 2.5, prompt=200, cached=100, deadline_s=20)
    event(events.Rejected, "r4", "acme", 3.0, reason="no_capacity")
    served("r5", "beta", "w-a", 1.0, 1.0, 0.2, 5.0, deadline_s=4)
    event(events.Queued, "r6", "beta", 2.0, prompt_tokens=100, max_tokens=10)
    event(events.Started, "r6", "beta", 2.0, worker_id="w-h")
    event(events.Failed, "r6", "beta", 2.5, reason="engine_error", worker_id="w-h")
    event(events.Queued, "r7", "beta", 6.0, prompt_tokens=100, max_tokens=10)

    def heartbeat(worker, pool, gpu, at, queries, hits, state="warm"):
        out.append(("telemetry", events.WorkerStatus(
            event_time_ms=ms(at), worker_id=worker, slot=0, pool=pool, gpu_type=gpu, state=state,
            prefix_cache_queries=queries, prefix_cache_hits=hits, started_ms=ms(-1))))

    for i in range(21):
        heartbeat("w-h", H100, "h100", i * 0.5, i * 5, i * 2, "stopped" if i == 20 else "warm")
    for at, queries in ((0, 0), (1, 10), (2, 20), (6, 40), (7, 50)):
        heartbeat("w-a", A100, "a100", at, queries, 0, "stopped" if at == 7 else "warm")
    for at in (0, 1, 2):  # an H200 that served nothing: its cost is nobody's
        heartbeat("w-x", H200, "h200", at, 0, 0)
    out.append(("config", ConfigSet(event_time_ms=ms(0.5), key="gpu_prices_usd_per_hour.h100",
                                    value=3.6, set_by="ops")))
    out.append(("config", ConfigSet(event_time_ms=ms(0.7), key="gpu_prices_usd_per_hour.a100",
                                    value=-1, set_by="ops")))
    out.append(("control", ScalePool(event_time_ms=ms(1), command_id="c1", issued_by="autoscaler",
                                     reason="queue deep", pool=H100, gpu_type="h100", model="m",
                                     replicas=3)))
    out.append(("control", SetBreakerState(event_time_ms=ms(5), command_id="c2",
                                           issued_by="breakers", reason="slow", worker_id="w-a",
                                           state="open")))
    out.append(("control", ScalePool(event_time_ms=T0 - 40 * 86_400_000, command_id="c0",
                                     issued_by="alice", reason="long ago", pool=H100,
                                     gpu_type="h100", model="m", replicas=1)))
    return out


@pytest.fixture(scope="module", params=["writable", "read-only"])
def source(tmp_path_factory, request):
    """The history, read as the sink's store or as `governor report` and the SQL endpoint read
    it: read-only, where no query may change a setting (the reports' own SETTINGS included)."""
    location = StoreLocation("t_reports", data_dir=tmp_path_factory.mktemp("r") / "chdb")
    store = Store.open(location)
    batch = Batch()
    offsets: dict[str, int] = {}
    for suffix, message in _history():
        offset = offsets[suffix] = offsets.get(suffix, -1) + 1
        table, columns = message_row(message, suffix)
        batch.add(table, (f"t.{suffix}", 0, offset, message.event_time_ms, *columns))
    Journal(store).commit(1, batch)
    if request.param == "read-only":
        store.close()
        store = Store.open(location, readonly=True)
    yield StoreSource(store)
    store.close()


def test_cost_per_successful_task(source):
    got = run_report(source, "cost").dicts()
    h100, a100 = 10 * 3.6 / 3600, 6 * 1.8 / 3600
    expected = [  # tenant, pool, requests, successful tasks, cost, cost per successful task
        ("acme", A100, 1, 0, a100 * 2 / 6, None),
        ("acme", H100, 2, 1, h100 * 3 / 3.5, h100 * 3 / 3.5),
        ("beta", A100, 1, 0, a100 * 4 / 6, None),
        ("beta", H100, 1, 0, h100 * 0.5 / 3.5, None),
    ]
    unattributed = got.pop(0)
    assert (unattributed["tenant"], unattributed["pool"], unattributed["requests"]) == (
        "(unattributed)", H200, 0)
    assert unattributed["cost_usd"] == pytest.approx(2 * 3.7 / 3600, abs=1e-6)
    assert [(r["day"], r["model"]) for r in got] == [(DAY, "m")] * 4
    assert [(r["tenant"], r["pool"], r["requests"], r["successful_tasks"]) for r in got] == [
        e[:4] for e in expected]
    for row, (*_, cost, per_task) in zip(got, expected, strict=True):
        assert row["cost_usd"] == pytest.approx(cost, abs=1e-6)
        assert row["cost_per_successful_task_usd"] == (
            None if per_task is None else pytest.approx(per_task, abs=1e-6))
    assert sum(r["gpu_hours"] for r in got) == pytest.approx(16 / 3600, abs=1e-3)
    assert [r["pool_share"] for r in got] == [round(2 / 6, 4), round(3 / 3.5, 4), round(4 / 6, 4),
                                              round(0.5 / 3.5, 4)]


def test_slo_attainment_and_ttft_percentiles(source):
    got = {r["tenant"]: r for r in run_report(source, "slo", bucket="hour").dicts()}
    assert set(got) == {"acme", "beta"}
    assert {r["bucket"] for r in got.values()} == {f"{DAY}T01:00:00"}
    assert (got["acme"]["finished"], got["acme"]["slo_met"], got["acme"]["slo_attainment"]) == (
        4, 2, 0.5)  # r3 missed its TTFT target, r4 was rejected
    assert (got["beta"]["finished"], got["beta"]["slo_met"]) == (2, 0)  # late, failed
    assert got["acme"]["ttft_p50_s"] == pytest.approx(0.4, abs=0.05)
    assert got["acme"]["ttft_p99_s"] == pytest.approx(1.5, abs=0.1)
    assert got["beta"]["ttft_p50_s"] == pytest.approx(0.2, abs=0.01)


def test_latencies_are_rounded_to_the_figures_shown(source):
    """The t-digests answer Float32: rounded as such, a TTFT of 0.4 s read back as
    0.4000000059604645 in --json and --format csv."""
    got = {r["tenant"]: r for r in run_report(source, "slo", bucket="hour").dicts()}
    for row in got.values():
        for column in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p99_s"):
            assert row[column] == round(row[column], 4), (column, row[column])


def test_prefix_cache_hit_rate_by_pool(source):
    got = run_report(source, "cache").dicts()
    assert [(r["day"], r["pool"], r["looked_up_tokens"], r["hit_tokens"], r["hit_rate"])
            for r in got] == [(DAY, A100, 50, 0, 0.0), (DAY, H100, 100, 40, 0.4),
                              (DAY, H200, 0, 0, None)]
    token_rates = {r["pool"]: r["token_hit_rate"] for r in got}
    assert token_rates == {A100: pytest.approx(100 / 300, abs=1e-4), H100: 25 / 200, H200: None}


def test_actions_timeline_latest_first(source):
    got = run_report(source, "actions").dicts()
    assert [(r["kind"], r["action"], r["actor"], r["target"], r["reason"]) for r in got] == [
        ("command", "set_breaker_state", "breakers", "w-a", "slow"),
        ("command", "scale_pool", "autoscaler", H100, "queue deep"),
        ("config", "config_set", "ops", "gpu_prices_usd_per_hour.a100", ""),
        ("config", "config_set", "ops", "gpu_prices_usd_per_hour.h100", ""),
    ]
    assert '"replicas":3' in got[1]["params"]
    assert len(run_report(source, "actions", limit=1).rows) == 1


def test_actions_say_nothing_of_refusals_older_than_the_dead_letters_kept(source):
    """No reader dead-lettered these commands: '' where the dead letters would still be kept
    (30 days), NULL (unknown) for the one of 40 days ago."""
    got = run_report(source, "actions", days=60).dicts()
    assert [(r["reason"], r["refused"]) for r in got if r["kind"] == "command"] == [
        ("slow", ""), ("queue deep", ""), ("long ago", None)]


def test_where_tasks_failed_by_step(source):
    got = run_report(source, "task-failures").dicts()
    assert [(r["step"], r["steps_total"], r["outcome"], r["tasks"], r["earlier_steps_completed"])
            for r in got] == [
        (1, 1, "unfinished", 2, 0),  # r7 queued, r8 never answered
        (1, 1, "failed:engine_error", 1, 0),
        (1, 1, "late", 1, 0),
        (2, 2, "rejected:no_capacity", 1, 1),  # t2: step 1 done, step 2 rejected
    ]


def test_rejected_and_failed_by_reason(source):
    got = run_report(source, "rejections").dicts()
    assert [(r["day"], r["tenant"], r["outcome"], r["reason"], r["requests"]) for r in got] == [
        (DAY, "acme", "rejected", "no_capacity", 1), (DAY, "beta", "failed", "engine_error", 1)]


def test_audit_finds_the_one_unfinished_and_the_one_unanswered_request(source):
    audit = run_audit(source)
    assert {k: audit[k] for k in ("accepted", "terminal", "violations", "requests",
                                  "rejected_at_admission", "missing_terminal", "unanswered")} == {
        "accepted": 6, "terminal": 5, "violations": 1, "requests": 8,
        "rejected_at_admission": 1, "missing_terminal": 1, "unanswered": 1}
    assert audit["violation_ids"] == [{"request_id": "r7", "kind": "missing_terminal"}]
    assert audit["unanswered_ids"] == ["r8"] and audit["ok"] is False
    # Seen as in flight when its last event is recent enough (the data is from yesterday).
    assert run_audit(source, grace_s=3 * 86_400)["in_flight"] == 2


def test_a_report_refuses_more_days_than_its_tables_keep(source):
    """Heartbeats are kept 30 days: asked for more, the cost report stopped at 30 without a
    word (the requests and tasks of older days dropped out, and those days cost nothing)."""
    from analytics.reports import REPORTS
    from schemas.errors import GovernorError

    with pytest.raises(GovernorError, match=r"the cost report reads worker_status, kept 30 days, "
                                            r"from 1 day before its window: it answers at most "
                                            r"--days 29, not 90"):
        run_report(source, "cost", days=90)
    with pytest.raises(GovernorError, match="request_outcomes, kept 90 days: .* not 91"):
        run_report(source, "slo", days=91)
    assert run_report(source, "cost", days=29).rows == run_report(source, "cost").rows
    assert run_report(source, "slo", days=90).rows == run_report(source, "slo").rows
    assert {name: report.max_days for name, report in REPORTS.items()} == {
        "cost": 29, "slo": 90, "cache": 29, "actions": 365, "task-failures": 89,
        "rejections": 90}


def test_the_days_reports_count_on_are_the_tables_ttls(source):
    from analytics.reports import KEPT_DAYS

    ttls = {table: source.query(f"SHOW CREATE TABLE {table}").rows[0][0] for table in KEPT_DAYS}
    assert {table: int(ddl.split("TTL ")[1].split("toIntervalDay(")[1].split(")")[0])
            for table, ddl in ttls.items()} == KEPT_DAYS
