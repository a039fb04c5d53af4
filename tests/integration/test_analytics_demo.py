"""After a demo run (router, simulated workers and the sink as processes), every request is in
the analytics store with exactly one terminal state, the audit finds no violation, and the store
holds one row per record produced to the run's topics."""

import asyncio
import io

import pytest
from rich.console import Console

from analytics.progress import count_rows, end_offsets
from analytics.store import StoreLocation
from analytics_support import caught_up_sink
from infra.demo import DemoOptions, run_demo
from schemas.topics import TopicCatalog

pytestmark = pytest.mark.integration

TERMINALS_SQL = """
SELECT r.request_id, countIf(e.type IN ('completed', 'failed', 'rejected', 'cancelled'))
FROM (SELECT DISTINCT request_id FROM request_events FINAL WHERE type = 'inference_request') AS r
LEFT JOIN (SELECT request_id, type FROM request_events FINAL) AS e ON r.request_id = e.request_id
GROUP BY r.request_id"""
# Every lifecycle row carries its request's creation, so the rollup has one row per request.
KEYED_SQL = """
SELECT (SELECT countIf(created IS NULL) FROM request_events FINAL WHERE type != 'cancel_request'),
       (SELECT count() FROM request_outcomes FINAL),
       (SELECT uniqExact(request_id) FROM request_outcomes FINAL)"""


async def _catch_up_and_count(bootstrap, catalog, location):
    """Run a sink again on the demo's directory: it resumes from its marks and takes in what was
    produced after the demo stopped it (the workers' last heartbeats)."""
    async with caught_up_sink(bootstrap, catalog, location) as (sink, reader, ends):
        now = await end_offsets(bootstrap, list(catalog.topics()))
        assert ends == {tp: end for tp, end in now.items() if end}  # nothing came since
        return (sum(ends.values()), count_rows(reader), count_rows(reader, final=True),
                reader.query(TERMINALS_SQL).rows, reader.query(KEYED_SQL).rows[0], sink.stats)


def test_after_a_demo_every_request_is_in_the_store_with_exactly_one_terminal_state(
        kafka_bootstrap, tmp_path, namespaces_to_delete):
    options = DemoOptions(bootstrap=kafka_bootstrap, duration_s=8, speedup=2.0,
                          fleet="h100:1,a100:1", log_dir=tmp_path, keep_topics=True)
    report = asyncio.run(run_demo(options, Console(file=io.StringIO())))
    namespaces_to_delete.append(report["run_id"])  # kept for the catch-up below, then deleted
    assert report["requests_sent"] > 0 and report["unfinished"] == 0
    assert "analytics_error" not in report, report.get("analytics_error")
    audit = report["analytics_audit"]
    assert audit == {"accepted": report["accepted"], "terminal": report["accepted"],
                     "violations": 0, "unanswered": 0}
    assert report["analytics_rows"] > 10 * report["requests_sent"]  # lifecycle, chunks, heartbeats
    # The store's account of the cost beside the live one: the same successful tasks; the spend
    # within the heartbeats each side holds that the other does not yet (README, "Live signals")
    assert report["analytics_tasks_succeeded"] == report["tasks_succeeded"] > 0
    assert report["analytics_spend_usd"] == pytest.approx(report["spend_usd"], rel=0.1)

    catalog = TopicCatalog(report["run_id"])
    data_dir = tmp_path / report["run_id"] / "analytics"
    location = StoreLocation.for_namespace(catalog.namespace, data_dir)
    produced, rows, rows_once, terminals, keyed, stats = asyncio.run(
        _catch_up_and_count(kafka_bootstrap, catalog, location))
    assert sum(rows.values()) == produced  # one row per record, none twice
    assert rows == rows_once
    assert len(terminals) == report["requests_sent"]
    assert all(count == 1 for _, count in terminals), [t for t in terminals if t[1] != 1][:5]
    assert report["analytics_rows"] <= produced and stats.replayed_rows == 0
    assert keyed == [0, report["requests_sent"], report["requests_sent"]]
