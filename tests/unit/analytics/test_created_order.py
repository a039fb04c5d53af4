"""Schema version 4: ``request_outcomes`` keyed by ``(created, request_key)``.

A request's rows must merge into one under ``FINAL`` whichever flush (and so part) each came
from, across the upgrade to version 4 too, and an interrupted migration must finish when run
again.
"""

import datetime as dt

import pytest

import analytics.migrations as migrations
from analytics.batch import Batch
from analytics.migrations import m004_created_order
from analytics.rows import message_row
from analytics.store import Store
from schemas import events
from schemas.requests import InferenceRequest

T0 = int((dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).timestamp() * 1000)
OUTCOMES_SQL = """
SELECT request_id, toUnixTimestamp64Milli(created), events, worker_id, step, steps_total
FROM request_outcomes FINAL ORDER BY request_id"""


def ms(seconds: float) -> int:
    return T0 + int(seconds * 1000)


def _sent_and_queued(rid: str, created_s: float) -> list[tuple[str, object]]:
    common = dict(request_id=rid, tenant="acme", model="m", task_id=f"task-{rid}")
    request = InferenceRequest(event_time_ms=ms(created_s), created_ms=ms(created_s),
                               prompt_tokens=10, max_tokens=10, step=2, steps_total=3, **common)
    queued = events.Queued(event_time_ms=ms(created_s + 0.1), prompt_tokens=10, max_tokens=10,
                           step=2, steps_total=3, created_ms=ms(created_s), **common)
    return [("requests", request), ("telemetry", queued)]


def _served(rid: str, created_s: float, stamped: bool = True) -> list[tuple[str, object]]:
    """Started and Completed on ``w-1``; as producers before version 4 wrote them unless
    ``stamped``."""
    common = dict(request_id=rid, tenant="acme", model="m", task_id=f"task-{rid}",
                  created_ms=ms(created_s) if stamped else None)
    return [("telemetry", events.Started(event_time_ms=ms(created_s + 1), worker_id="w-1",
                                         **common)),
            ("telemetry", events.Completed(event_time_ms=ms(created_s + 2), worker_id="w-1",
                                           prompt_tokens=10, output_tokens=10, e2e_s=2.0,
                                           **common))]


def _write(store: Store, flush_id: int, history: list[tuple[str, object]]) -> None:
    batch = Batch()
    for offset, (suffix, message) in enumerate(history, start=flush_id * 1000):
        table, columns = message_row(message, suffix)
        batch.add(table, (f"t.{suffix}", 0, offset, message.event_time_ms, *columns))
    for insert in batch.inserts(flush_id):  # the data only: stores of earlier versions too
        store.insert(insert.table, insert.data, token=insert.token)


def _outcomes(store: Store) -> list[list]:
    return store.query(OUTCOMES_SQL).rows


BITS = 1 | 2 | 4  # sent, queued, completed


def test_a_request_written_in_two_flushes_is_one_row_keyed_by_its_creation(store):
    _write(store, 1, _sent_and_queued("r-a", 0) + _sent_and_queued("r-b", 5))
    _write(store, 2, _served("r-a", 0) + _served("r-b", 5))
    assert store.query("SELECT count() FROM request_outcomes").rows == [[4]]  # two parts
    assert _outcomes(store) == [["r-a", ms(0), BITS, "w-1", 2, 3],
                                ["r-b", ms(5), BITS, "w-1", 2, 3]]


def test_events_without_created_ms_key_on_zero_and_still_merge_among_themselves(store):
    """What producers before version 4 wrote: a request none of whose events carry it stays one
    row; one with events of both kinds is two rows (the migration's doc says when)."""
    legacy = [(suffix, m.model_copy(update={"created_ms": None}))
              for suffix, m in _sent_and_queued("r-old", 0)[1:]]
    _write(store, 1, legacy + _served("r-old", 0, stamped=False))
    _write(store, 2, _sent_and_queued("r-mixed", 1) + _served("r-mixed", 1, stamped=False))
    assert _outcomes(store) == [["r-mixed", 0, 4, "w-1", 0, 0],
                                ["r-mixed", ms(1), 1 | 2, "", 2, 3],
                                ["r-old", 0, 2 | 4, "w-1", 2, 3]]


def _store_at_version_3_with_history(location, monkeypatch) -> None:
    """A store as version 3 left it: ``r-done`` finished, ``r-flying`` queued and not served."""
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
        old = Store.open(location)
        _write(old, 1, _sent_and_queued("r-done", 0) + _served("r-done", 0, stamped=False)
               + _sent_and_queued("r-flying", 3))
        old.close()


@pytest.mark.parametrize("interrupted_after", [None, 3, 4, 5])
def test_version_4_keys_old_rows_by_their_creation_and_finishes_when_interrupted(
        location, monkeypatch, interrupted_after):
    _store_at_version_3_with_history(location, monkeypatch)
    if interrupted_after is not None:  # the first statements ran, then the sink crashed
        with monkeypatch.context() as patched:
            patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
            half = Store.open(location)
            for statement in m004_created_order.STATEMENTS[:interrupted_after]:
                if isinstance(statement, tuple):
                    statement = statement[1]
                half.command(statement)
            half.close()
    store = Store.open(location)  # the sink's start: version 4 is applied (again)
    try:
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [
            [migrations.LATEST_VERSION]]
        assert "request_outcomes_v4" not in {
            row[0] for row in store.query("SHOW TABLES").rows}
        _write(store, 2, _served("r-flying", 3))  # served after the upgrade, stamped
        assert _outcomes(store) == [["r-done", ms(0), BITS, "w-1", 2, 3],
                                    ["r-flying", ms(3), BITS, "w-1", 2, 3]]
    finally:
        store.close()
