"""The expiry index: entries filed by deadline, taken out once due; the books' deadlines are when
their sweeps act; the app's sweeps read only what is due."""

import asyncio

from benchmarks.streams_hotpath import run_agents
from schemas.codec import encode
from schemas.events import WorkerStatus
from streams.app import StreamsApp
from streams.expiry import ExpiryIndex
from streams.signals.requests import RequestBook
from streams.signals.tasks import TaskBook
from streams.stages import partition_of
from streams.synthetic import synthetic_telemetry
from streams.worker import settings_for


def _index() -> ExpiryIndex:
    return ExpiryIndex(lambda value: value)  # the value is the deadline


def test_due_takes_out_what_is_due_before_now_earliest_first_and_only_in_its_partition():
    index = _index()
    for key, partition, due in [("c", 0, 3_500), ("a", 0, 1_200), ("b", 0, 2_999), ("x", 1, 1_000),
                                ("d", 0, 3_000)]:
        index.note(key, partition, due)
    assert index.due(0, 3_000) == ["a", "b"]  # d is due at 3,000 exactly: not before it
    assert index.due(0, 3_000) == []  # taken out
    assert index.due(0, 3_501) == ["c", "d"]  # the same second: in the order filed
    assert index.due(1, 10_000) == ["x"] and len(index) == 0


def test_a_rewritten_entry_moves_a_forgotten_one_goes_and_none_is_never_due():
    index = _index()
    index.note("k", 0, 1_000)
    index.note("k", 0, 9_000)  # written again with a later deadline
    index.note("gone", 0, 1_000)
    index.forget("gone")
    index.note("open", 0, 1_000)
    index.note("open", 0, None)  # no deadline any more
    assert index.due(0, 5_000) == [] and len(index) == 1
    assert index.due(0, 9_001) == ["k"]


def test_a_reset_index_is_rebuilt_partition_by_partition():
    index = _index()
    index.index_partition(2, [("a", 100), ("b", 200)])
    assert index.indexed == {2}
    index.reset()
    assert index.indexed == set() and len(index) == 0 and index.due(2, 1_000) == []


def test_the_request_books_deadline_is_when_its_sweep_forgets():
    table = {}
    book = RequestBook(table, retention_s=300, idle_retention_s=3600)
    table["done"] = {"end": 10_000, "last": 10_000}
    table["idle"] = {"end": None, "last": 20_000}
    for key in ("done", "idle"):
        due = book.expires_ms(table[key])
        assert book.sweep([key], due) == []
        assert book.sweep([key], due + 1) == [key]
    assert (310_000, 3_620_000) == (book.expires_ms({"end": 10_000, "last": 10_000}),
                                    book.expires_ms({"end": None, "last": 20_000}))


def test_the_task_books_deadline_is_when_its_sweep_times_out_or_forgets():
    table = {}
    book = TaskBook(table, idle_timeout_s=120, retention_s=600)
    table["open"] = {"tn": "acme", "steps": 3, "ok": [1], "rids": ["r1"], "charged": [],
                     "usd": 0.0, "o": None, "closed": None, "last": 50_000}
    due = book.expires_ms(table["open"])
    assert due == 170_000
    assert book.sweep(["open"], due) == ([], [])
    outs, gone = book.sweep(["open"], due + 1)
    assert table["open"]["o"] == "timed_out" and outs and gone == []
    closed_due = book.expires_ms(table["open"])  # closed: now forgotten after the retention
    assert closed_due == 170_000 + 600_000
    assert book.sweep(["open"], closed_due) == ([], [])
    assert book.sweep(["open"], closed_due + 1) == ([], ["open"])


def _swept_tables(tmp_path, indexed: bool) -> tuple[StreamsApp, dict]:
    """The app's tables after two minutes of event time (3,000 requests 40 ms apart) with a
    retention of 20 s, so that sweeps (every second) forget entries; ``indexed=False``: sweeps read
    every entry, as they did before the index."""
    settings = settings_for("unit-ns", "127.0.0.1:1").model_copy(
        update={"request_retention_s": 20.0, "task_retention_s": 20.0})
    messages, counts = synthetic_telemetry(1_800_000_000_000, 3_000, workers=4, spacing_ms=40,
                                           prefix="exp")
    end_ms = messages[-1].event_time_ms  # the streams' clock: no event is ahead of it
    streams = StreamsApp(settings, datadir=tmp_path, clock=lambda: end_ms)
    if not indexed:
        for staged in streams.staged.values():
            staged.expiry = None
    telemetry = []
    for m in messages:
        key = m.worker_id if isinstance(m, WorkerStatus) else m.request_id
        telemetry.append((key.encode(), encode(m), partition_of(key, settings.partitions)))
    asyncio.run(run_agents(streams, telemetry, 50))  # small batches: each agent sweeps often
    return streams, {name: dict(table.data) for name, table in streams.tables.items()}


def test_the_apps_indexed_sweeps_forget_exactly_what_reading_every_entry_forgets(tmp_path):
    streams, tables = _swept_tables(tmp_path / "indexed", indexed=True)
    _, full_scan = _swept_tables(tmp_path / "scan", indexed=False)
    assert tables == full_scan
    assert 0 < len(tables["requests"]) < 3_000  # old requests were forgotten, recent ones kept
    for name in ("requests", "tasks"):
        assert len(streams.staged[name].expiry) == len(tables[name])  # every entry left is filed


def test_after_a_reset_the_index_is_rebuilt_from_what_recovery_wrote(tmp_path):
    """Changelog recovery fills a table's store without the staged writes that file entries; the
    index, reset at the end of a rebalance, is rebuilt from the store at the partition's next
    sweep and gives what is due."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    n = streams.settings.partitions
    store = streams.tables["requests"].data
    ended_ms = {f"r-{i}": 1_000 * i for i in range(40)}
    for key, end in ended_ms.items():  # as recovery writes them
        store[key] = {"end": end, "last": end}
        store._key_partition[key] = partition_of(key, n)
    expiry = streams.staged["requests"].expiry
    expiry.reset()
    partition = partition_of("r-0", n)
    now = streams.stages.request_book.retention_ms + 10_500  # what ended before 10.5 s is due
    due = streams._keys_due("requests", partition, now)
    assert due and sorted(due) == sorted(k for k, end in ended_ms.items()
                                         if end < 10_500 and partition_of(k, n) == partition)
    assert partition in expiry.indexed and len(expiry) == sum(
        1 for k in ended_ms if partition_of(k, n) == partition) - len(due)
