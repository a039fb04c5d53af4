"""``benchmarks.analytics_queries`` generates a store every report has rows in: tasks whose
steps all succeed among them, so the cost report's successful tasks are timed too (before 7 Dec
each step of a task had a tenant of its own, and no task succeeded)."""

from analytics.query import StoreSource
from analytics.reports import run_report
from benchmarks.analytics_queries import generate


def test_the_benchmark_store_has_successful_tasks(store):
    generate(store, 3_000)  # 600 requests, 200 three-step tasks
    rows = run_report(StoreSource(store), "cost").dicts()
    tenants_of_tasks = store.query(
        "SELECT count() FROM (SELECT task_id FROM request_events WHERE task_id != '' "
        "GROUP BY task_id HAVING uniqExact(tenant) > 1)").rows
    assert tenants_of_tasks == [[0]]
    assert sum(r["successful_tasks"] for r in rows) > 100
