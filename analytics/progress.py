"""Is the store caught up with the topics? How many rows does it hold? What did the run cost, by
``governor report cost``? For the demo and tests.

``wait_caught_up`` takes the topics' end offsets once, then waits until the sink's offset marks
(``sink_offsets``: what the store holds) reach them: every record produced before the call is
then queryable. It queries through any ``SqlSource`` (the sink's endpoint, or a store).
"""

import asyncio
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from analytics.audit import run_audit
from analytics.endpoint import ENDPOINT_FILE, announced
from analytics.query import EndpointSource, SqlSource
from analytics.ranges import existing_partitions
from analytics.reports import run_report
from analytics.schema import RECORD_TABLES
from schemas.topics import TopicCatalog

MARKS_SQL = ("SELECT kafka_topic, kafka_partition, max(next_offset) FROM sink_offsets "
             "GROUP BY kafka_topic, kafka_partition")


async def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """The end offset of every partition of ``topics`` (the offset the next record will get)."""
    existing = await existing_partitions(bootstrap, set(topics))
    tps = [TopicPartition(t, p) for t, p in sorted(existing)]
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def wait_caught_up(bootstrap: str, catalog: TopicCatalog, source: SqlSource,
                         timeout_s: float = 60.0) -> dict[tuple[str, int], int]:
    """Wait until the store holds every record the topics had when called; return those ends."""
    target = {tp: end for tp, end in (await end_offsets(bootstrap, list(catalog.topics()))).items()
              if end > 0}
    deadline = time.monotonic() + timeout_s
    while True:
        rows = (await asyncio.to_thread(source.query, MARKS_SQL)).rows
        marks = {(topic, partition): offset for topic, partition, offset in rows}
        behind = sum(end - marks.get(tp, 0) for tp, end in target.items() if marks.get(tp, 0) < end)
        if not behind:
            return target
        if time.monotonic() > deadline:
            raise TimeoutError(f"the analytics sink is still {behind} records behind after "
                               f"{timeout_s:g}s")
        await asyncio.sleep(0.2)  # polling the sink's marks until a deadline


def count_rows(source: SqlSource, final: bool = False) -> dict[str, int]:
    """Rows per base table (one per Kafka record); ``final`` counts each record once regardless."""
    modifier = " FINAL" if final else ""
    sql = " UNION ALL ".join(f"SELECT '{t}', count() FROM {t}{modifier}" for t in RECORD_TABLES)
    return {table: count for table, count in source.query(sql).rows}


def cost_summary(source: SqlSource) -> dict[str, float | None]:
    """``governor report cost`` summed over its rows: the store's account of the figures the live
    ``fleet:all`` running total gives as ``spend_usd``, ``gpu_hours``, ``tasks_succeeded`` and
    ``spend_per_successful_task_usd`` (README, "Live signals": where the two differ by design)."""
    rows = run_report(source, "cost").dicts()
    spend = sum(row["cost_usd"] for row in rows)
    succeeded = sum(row["successful_tasks"] for row in rows)
    return {"analytics_spend_usd": round(spend, 6),
            "analytics_gpu_hours": round(sum(row["gpu_hours"] for row in rows), 4),
            "analytics_tasks_succeeded": int(succeeded),
            "analytics_cost_per_successful_task_usd":
                round(spend / succeeded, 6) if succeeded else None}


async def wait_for_endpoint(data_dir: Path, timeout_s: float, alive=lambda: True,
                            failures: int = 5) -> EndpointSource:
    """The endpoint a sink on ``data_dir`` announces, once it answers and its store is ready.

    Gives up early once the sink has failed ``failures`` times to open its store.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if (sink := announced(data_dir)) is not None:
            source = EndpointSource(sink["url"])
            try:
                health = await asyncio.to_thread(source.health)
            except OSError:
                health = {}  # announced by a sink that is gone, or not listening yet
            if health.get("ready"):
                return source
            if health.get("store_failures", 0) >= failures:
                raise RuntimeError(f"the analytics sink cannot open its store: "
                                   f"{health.get('last_error')}")
        if not alive():
            raise RuntimeError("the analytics sink exited before its SQL endpoint answered")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no analytics SQL endpoint announced in "
                               f"{data_dir / ENDPOINT_FILE} after {timeout_s:g}s")
        await asyncio.sleep(0.2)  # polling for the sink's announcement until a deadline


async def demo_summary(bootstrap: str, catalog: TopicCatalog, data_dir: Path, alive,
                       timeout_s: float = 60.0) -> dict[str, Any]:
    """The demo's analytics figures; never raises: a failure is reported in ``analytics_error``."""
    try:
        source = await wait_for_endpoint(data_dir, timeout_s, alive)
        await wait_caught_up(bootstrap, catalog, source, timeout_s)
        rows = await asyncio.to_thread(count_rows, source)
        audit = await asyncio.to_thread(run_audit, source)
        cost = await asyncio.to_thread(cost_summary, source)
    except Exception as exc:  # noqa: BLE001 - the demo reports it and carries on
        return {"analytics_rows": None, "analytics_error": f"{type(exc).__name__}: {exc}"}
    return {"analytics_rows": sum(rows.values()),
            "analytics_audit": {k: audit[k] for k in ("accepted", "terminal", "violations",
                                                       "unanswered")}, **cost}
