"""A flush written again after a restart lands once on a host east or west of UTC.

Each case runs in a child process whose time zone is America/New_York (the engine takes its
default zone as it starts, once per process). A sink writes a flush of events sent at 02:00 UTC
(the day before, in New York) and dies before its marks; the restarted sink writes it again with
the same dedup tokens. Before schema version 9 the store computed the partition of the first
insert in UTC and that of the second in the host's zone: the second was another day's block, not
dropped, and every row and rollup counted twice. And the reopened store read its time columns
without a zone of their own in the host's zone: the request was on New York's day.
"""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import analytics.migrations as migrations
from analytics.batch import Batch
from analytics.journal import Flush, Journal
from analytics.rows import message_row
from analytics.store import Store, StoreLocation
from schemas.events import Queued
from schemas.examples import examples

REPO = Path(__file__).resolve().parents[3]
N = 10


def _at_two_utc() -> int:
    day = dt.datetime.now(dt.timezone.utc).replace(hour=2, minute=0, second=0, microsecond=0)
    return int(day.timestamp() * 1000)


def _batch(sent: int) -> Batch:
    batch = Batch()
    for i in range(N):
        message = examples()[Queued].model_copy(
            update={"event_time_ms": sent + i, "request_id": f"r-{i}"})
        table, columns = message_row(message, "telemetry")
        batch.add(table, ("ns.telemetry", 0, i, message.event_time_ms, *columns))
    return batch


def _as_an_older_journal_wrote(store: Store, flush: Flush, batch: Batch, finished: bool) -> None:
    """A flush as the journal wrote it before version 18 (its row had no tables written)."""
    columns = ["flush_id", "run", "ranges", "finished"]
    ranges = json.dumps([r.as_list() for r in flush.ranges])
    store.insert_rows("sink_flushes", [[flush.flush_id, flush.run, ranges, 0]], columns)
    for insert in batch.inserts(flush.token):
        store.insert(insert.table, insert.data, token=insert.token)
    if finished:
        Journal(store, flush.run).mark(flush)
        store.insert_rows("sink_flushes", [[flush.flush_id, flush.run, ranges, 1]], columns)


def written_again_after_a_restart(data_dir: str, crashed_at_version: int, sent: int) -> None:
    """The child's scenario: print what the store holds as JSON. ``sent`` is read by the parent:
    a child that read the clock again before midnight wrote the day before the one asserted."""
    location = StoreLocation("t_utc", data_dir=Path(data_dir))
    batch = _batch(sent)
    flush = Flush("run-1", 1, tuple(batch.ranges()))
    latest = migrations.MIGRATIONS
    migrations.MIGRATIONS = latest[:crashed_at_version]  # the Governor that crashed
    store = Store.open(location)
    if crashed_at_version < 18:
        _as_an_older_journal_wrote(store, flush, batch, finished=False)  # then the crash
    else:
        journal = Journal(store, flush.run)
        journal.begin(flush)
        journal.write(flush, batch)  # then the crash, before the marks
    store.close()
    migrations.MIGRATIONS = latest
    store = Store.open(location)  # the restart (which migrates the store)
    Journal(store, "run-2").commit(flush.flush_id, batch, list(flush.ranges), run=flush.run)
    types = store.query("SELECT DISTINCT type FROM system.columns WHERE database = "
                        "currentDatabase() AND name IN ('time', 'minute') AND table IN "
                        "(SELECT name FROM system.tables WHERE database = currentDatabase() "
                        "AND partition_key != '')").rows  # (every table partitioned by time)
    print(json.dumps({
        "version": store.schema_version(),
        "rows": store.query("SELECT count() FROM request_events").rows[0][0],
        "minute_events": store.query("SELECT sum(events) FROM request_minute").rows[0][0],
        "partitions": store.query("SELECT groupUniqArray(_partition_id) "
                                  "FROM request_events").rows[0][0],
        "time_types": sorted(t for (t,) in types),
        # a column without a zone of its own, read by the reopened store
        "outcome_day": store.query("SELECT toString(toDate(first_seen)) "
                                   "FROM request_outcomes").rows[0][0],
    }))
    store.close()


def _in_new_york(tmp_path: Path, crashed_at_version: int, sent: int) -> dict:
    code = ("from tests.unit.analytics.test_utc_partitions import written_again_after_a_restart as "
            f"scenario; scenario({str(tmp_path / 'chdb')!r}, {crashed_at_version}, {sent})")
    env = {**os.environ, "TZ": "America/New_York",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("crashed_at_version", [migrations.LATEST_VERSION, 8],
                         ids=["this version", "version 8, migrated at the restart"])
def test_a_flush_written_again_after_a_restart_lands_once_in_new_york(tmp_path,
                                                                       crashed_at_version):
    sent = _at_two_utc()
    stored = _in_new_york(tmp_path, crashed_at_version, sent)
    day = dt.datetime.fromtimestamp(sent / 1000, dt.timezone.utc).strftime("%Y%m%d")
    assert stored["version"] == migrations.LATEST_VERSION
    assert (stored["rows"], stored["minute_events"]) == (N, N)  # kept, and not twice
    assert stored["partitions"] == [day]
    assert stored["time_types"] == ["DateTime('UTC')", "DateTime64(3, 'UTC')"]
    assert stored["outcome_day"] == f"{day[:4]}-{day[4:6]}-{day[6:]}"  # not New York's day


def test_version_9_keeps_the_rows_of_a_store_with_history(location, monkeypatch):
    batch = _batch(_at_two_utc())
    with monkeypatch.context() as patched:  # a store as version 8 left it, with history
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:8])
        old = Store.open(location)
        _as_an_older_journal_wrote(old, Flush("run-1", 1, tuple(batch.ranges())), batch,
                                   finished=True)
        old.close()
    store = Store.open(location)  # the sink's start: version 9 is applied
    try:
        assert store.schema_version() == migrations.LATEST_VERSION
        assert store.query("SELECT count(), countDistinct(request_id) FROM request_events FINAL"
                           ).rows == [[N, N]]
        assert store.query("SELECT sum(events) FROM request_minute").rows == [[N]]
        assert store.query("SELECT toTypeName(time) FROM request_events LIMIT 1").rows == [
            ["DateTime64(3, 'UTC')"]]
    finally:
        store.close()
