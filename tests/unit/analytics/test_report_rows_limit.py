"""A report with more rows than a query may return (``READ_SETTINGS``) is an error naming the
report, the limit and the options that make it smaller, on a real store."""

import time

import pytest

from analytics.batch import Batch
from analytics.journal import Journal
from analytics.query import StoreSource
from analytics.reports import run_report, too_many_rows
from analytics.rows import message_row
from analytics.store import READ_SETTINGS, Store
from analytics.window import ReportError
from schemas.events import Rejected


def _rejected(store, tenants: list[str]) -> None:
    """A request of each tenant, rejected a minute ago: a row each in the rejections report."""
    batch, at = Batch(), int(time.time() * 1000) - 60_000
    for offset, tenant in enumerate(tenants):
        message = Rejected(event_time_ms=at, request_id=f"r-{tenant}", tenant=tenant, model="m",
                           created_ms=at, reason="no_capacity")
        table, columns = message_row(message, "telemetry")
        batch.add(table, ("t.telemetry", 0, offset, at, *columns))
    Journal(store).commit(1, batch)


def test_a_report_past_the_rows_a_query_may_return_says_what_makes_it_smaller(store, location):
    """Before 7 Dec the engine's words alone: `Limit for result exceeded, max rows: 500.00,
    current rows: 600.00. (TOO_MANY_ROWS_OR_BYTES)`, naming no option of `governor report`.
    (The limit is above the rows of the guard's parse of the report, 583 since schema version
    17: under it, the guard's parse was cut off instead.)"""
    _rejected(store, [f"tenant-{i}" for i in range(900)])
    assert len(run_report(StoreSource(store), "rejections").rows) == 900
    narrow = Store(location.client(location.database, {**READ_SETTINGS, "max_result_rows": 800}),
                   location)
    try:
        with pytest.raises(ReportError, match=r"^the rejections report over --days 7 has more "
                                              r"rows than a query here may return \(max rows: "
                                              r"800.00, current rows: 900.00\): give fewer "
                                              r"--days$"):
            run_report(StoreSource(narrow), "rejections", days=7)
    finally:
        narrow.close()  # (left open, its engine kept the next test's store from opening)


CUT = ("Code: 396. DB::Exception: Limit for result exceeded, max rows: 1.00 million, current "
       "rows: 1.30 million. (TOO_MANY_ROWS_OR_BYTES) (version 26.9.2.1)")


@pytest.mark.parametrize(("name", "bucket", "error", "said"), [
    ("slo", "minute", CUT, "the slo report over --days 90 has more rows than a query here may "
                           "return (max rows: 1.00 million, current rows: 1.30 million): give "
                           "fewer --days or a coarser --bucket than minute"),
    ("slo", "day", CUT, "the slo report over --days 90 has more rows than a query here may "
                        "return (max rows: 1.00 million, current rows: 1.30 million): give "
                        "fewer --days"),
    ("slo", "hour", "Code: 159. DB::Exception: Timeout exceeded (TIMEOUT_EXCEEDED)", None),
])
def test_what_a_report_cut_off_says(name, bucket, error, said):
    assert too_many_rows(name, 90, bucket, error) == said
