"""Server mode: the same sink, reports and audit over HTTP to a real ClickHouse server.

Runs where ``CLICKHOUSE_URL`` names one (``http://user:password@host:8123``); each test gets a
database of its own (the catalog's namespace) and drops it afterwards.
"""

import asyncio
import os
import time

import pytest

from analytics.audit import run_audit
from analytics.progress import count_rows
from analytics.reports import REPORTS, run_report
from analytics.schema import RECORD_TABLES
from analytics.store import StoreLocation
from analytics.synthetic import history, produce
from analytics_support import caught_up_sink

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.environ.get("CLICKHOUSE_URL"),
                       reason="server mode needs a ClickHouse server: set CLICKHOUSE_URL"),
]


async def _scenario(bootstrap, catalog, location):
    records, expected = history(catalog, 0, 300, int(time.time() * 1000))
    await produce(bootstrap, records)
    async with caught_up_sink(bootstrap, catalog, location) as (_, reader, _):
        reports = {name: run_report(reader, name) for name in REPORTS}
        return expected, count_rows(reader), run_audit(reader), reports


def test_the_sink_reports_and_audit_work_against_a_clickhouse_server(kafka_bootstrap, catalog,
                                                                       tmp_path):
    location = StoreLocation.for_namespace(catalog.namespace, tmp_path,
                                           os.environ["CLICKHOUSE_URL"])
    try:
        expected, rows, audit, reports = asyncio.run(_scenario(kafka_bootstrap, catalog, location))
    finally:
        admin = location.client(None)
        admin.command(f"DROP DATABASE IF EXISTS `{location.database}`")
        admin.close()
    assert rows == {table: expected.get(table, 0) for table in RECORD_TABLES}
    assert (audit["accepted"], audit["terminal"], audit["violations"]) == (300, 300, 0)
    assert sum(r["requests"] for r in reports["cost"].dicts()) == 300
    assert reports["rejections"].rows == []
