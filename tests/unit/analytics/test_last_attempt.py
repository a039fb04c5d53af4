"""Where a request that no worker completed is charged: the worker of its latest attempt.

``r-resumed`` starts on ``w-z`` (pool h100@m, attempt 1) for 2 s, is handed back, is resumed on
``w-a`` (pool a100@m, attempt 2) for 2 s and fails there. It ended on ``w-a``; the greatest of
its workers' ids (what the reports took before schema version 3) is ``w-z``, another pool.
"""

import datetime as dt

import pytest

import analytics.migrations as migrations
from analytics.migrations import m013_worker_gpus
from analytics.batch import Batch
from analytics.outcomes import (DEFAULTS, FINAL_SETTINGS, OUTCOMES_CTE, RAN_ON_POOL,
                                WORKER_INCARNATIONS_CTE)
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.rows import message_row
from analytics.store import Store
from analytics.window import wall_clock_ms, window_parameters
from schemas import events
from schemas.requests import InferenceRequest

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).timestamp() * 1000)
RAN_ON_SQL = f"""
WITH {OUTCOMES_CTE.strip()}, {WORKER_INCARNATIONS_CTE.strip()}
SELECT o.request_id, wi.worker_id
FROM {RAN_ON_POOL}
ORDER BY o.request_id {FINAL_SETTINGS}"""


def ms(seconds: float) -> int:
    return T0 + int(seconds * 1000)


def old_store(location, version: int, patched) -> Store:
    """The store as schema ``version`` left it, but for the heartbeats' ``gpus`` column (version
    13), which today's writer writes: the sink applies every version before it writes."""
    patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:version])
    store = Store.open(location)
    for statement in m013_worker_gpus.STATEMENTS:
        store.command(statement)
    return store


def _resumed_then_failed(rid: str) -> list[tuple[str, object]]:
    common = dict(request_id=rid, tenant="acme", model="m", created_ms=ms(0))
    telemetry = [
        events.Queued(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10, **common),
        events.Started(event_time_ms=ms(1), worker_id="w-z", attempt=1, **common),
        events.Requeued(event_time_ms=ms(3), worker_id="w-z", attempt=1, tokens_done=4, **common),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **common),
        events.Failed(event_time_ms=ms(5), reason="engine_error", **common),
    ]
    heartbeats = [events.WorkerStatus(event_time_ms=ms(at), worker_id=worker, slot=0, pool=pool,
                                      gpu_type=gpu, state="warm", started_ms=ms(0))
                  for at in (0, 1, 2, 3, 4, 5) for worker, pool, gpu in (
                      ("w-z", "h100@m", "h100"), ("w-a", "a100@m", "a100"))]
    return [("requests", InferenceRequest(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10,
                                          **common)),
            *(("telemetry", m) for m in [*telemetry, *heartbeats])]


def _write(store: Store, flush_id: int, history: list[tuple[str, object]]) -> None:
    batch, offsets = Batch(), {}
    for suffix, message in history:
        offset = offsets[suffix] = offsets.get(suffix, flush_id * 1000 - 1) + 1
        table, columns = message_row(message, suffix)
        batch.add(table, (f"t.{suffix}", 0, offset, message.event_time_ms, *columns))
    for insert in batch.inserts(flush_id):  # the data only: stores of earlier versions too
        store.insert(insert.table, insert.data, token=insert.token)


def _ran_on(store: Store) -> dict[str, str]:
    return dict(store.query(RAN_ON_SQL, {**DEFAULTS, **window_parameters(wall_clock_ms())}).rows)


def test_a_request_failed_after_a_resumption_is_charged_where_it_ended(store):
    """It counts where it ended; each attempt's time is charged where it ran (its only
    request on each pool: the whole of each pool's cost is its own, none unattributed)."""
    _write(store, 1, _resumed_then_failed("r-resumed"))
    assert _ran_on(store) == {"r-resumed": "w-a"}
    cost = run_report(StoreSource(store), "cost").dicts()
    assert [(r["tenant"], r["pool"], r["requests"]) for r in cost] == [
        ("acme", "a100@m", 1), ("acme", "h100@m", 0)]
    assert [r["pool_share"] for r in cost] == pytest.approx([1.0, 1.0])


def test_version_3_applies_to_a_store_with_history_and_keeps_its_old_rows(location, monkeypatch):
    with monkeypatch.context() as patched:  # a store as version 2 left it, with a request in it
        old = old_store(location, 2, patched)
        _write(old, 1, _resumed_then_failed("r-before"))
        old.close()
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
        store = Store.open(location)  # the sink's start: version 3 is applied
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [[3]]
        _write(store, 2, _resumed_then_failed("r-after"))
        store.close()
    store = Store.open(location)  # and the later versions, which the reports of today need
    try:
        # Rows written before version 3 have no attempts: the greatest worker id, as before.
        assert _ran_on(store) == {"r-after": "w-a", "r-before": "w-z"}
    finally:
        store.close()
