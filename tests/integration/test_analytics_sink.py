"""The analytics sink on the real broker and a real chdb store: each record lands exactly once.

- SIGKILLed twice while records stream in and restarted, the sink loses nothing and duplicates
  nothing: every table's raw row count (no FINAL) equals the records produced for it, and so do
  the rollups fed by materialized views. The CLI then queries the live sink's SQL endpoint.
- A flush a crash left half-written is written again, with the same dedup tokens, once the
  restarted sink is given its partitions.
- Two sinks in one consumer group on one store write every record once, and so do sinks that
  join and leave the group while records stream in (partitions move mid-flush).
- An unfinished flush of a topic deleted since is finished by whichever sink is given
  partitions, without creating the topic again.
- While the store refuses inserts the sink backs off and commits no Kafka offset; when the store
  is back it catches up, again exactly once.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from analytics.journal import Flush, Journal
from analytics.progress import count_rows, end_offsets, wait_caught_up, wait_for_endpoint
from analytics.batch import OffsetRange
from analytics.query import StoreSource
from analytics.ranges import read_ranges
from analytics.schema import RECORD_TABLES
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import Store, StoreError, StoreLocation
from analytics.synthetic import history, produce
from infra.bus import delete_topics

pytestmark = pytest.mark.integration

ROLLUP_SQL = """SELECT
    (SELECT sum(events) FROM request_minute),
    (SELECT sumIf(events, type = 'queued') FROM request_minute),
    (SELECT sumIf(events, type = 'completed') FROM request_minute),
    (SELECT count() FROM request_outcomes FINAL WHERE events = 1 + 2 + 4),
    (SELECT sum(chunks) FROM response_summaries), (SELECT sum(heartbeats) FROM worker_minute),
    (SELECT sum(events) FROM kv_minute)"""


def _now_ms() -> int:
    return int(time.time() * 1000)


def assert_exactly_once(source, expected, n_requests: int) -> None:
    """Raw rows, rows counted once, and every rollup all equal what was produced."""
    want = {table: expected.get(table, 0) for table in RECORD_TABLES}
    assert count_rows(source) == want  # no duplicate rows at all, not only after FINAL
    assert count_rows(source, final=True) == want
    rollups = source.query(ROLLUP_SQL).rows[0]
    assert rollups == [want["request_events"], n_requests, n_requests, n_requests,
                       want["response_chunks"], want["worker_status"], want["kv_events"]]


def _start_sink(bootstrap, catalog, data_dir, log_path):
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "sink", "--bootstrap", bootstrap, "--namespace",
         catalog.namespace, "--data-dir", str(data_dir), "--sql-port", "0",
         "--max-batch-records", "300", "--max-batch-age-s", "0.05"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    return proc


async def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # polling a condition with a deadline


async def _caught_up(bootstrap, catalog, location) -> StoreSource:
    """A read-only source on the store at ``location``, once it holds every record the topics
    have now (closed again if that does not come)."""
    reader = StoreSource(Store.open(location, readonly=True))
    try:
        await wait_caught_up(bootstrap, catalog, reader, timeout_s=90)
    except BaseException:
        reader.close()
        raise
    return reader


async def _kill_restart_scenario(bootstrap, catalog, data_dir, log_path):
    now, produced, n = _now_ms(), {}, 0

    async def wave(count):
        nonlocal n
        records, rows = history(catalog, n, count, now)
        await produce(bootstrap, records)
        n += count
        for table, rows_of in rows.items():
            produced[table] = produced.get(table, 0) + rows_of

    sink = _start_sink(bootstrap, catalog, data_dir, log_path)
    try:
        await wave(200)
        endpoint = await wait_for_endpoint(data_dir, 60, lambda: sink.poll() is None)
        await _until(lambda: endpoint.health()["flushes"] >= 2, 60, "the first flushes")
        await wave(1000)  # the kill lands while these stream in
        sink.send_signal(signal.SIGKILL)
        sink.wait()
        await wave(300)  # produced while no sink runs
        sink = _start_sink(bootstrap, catalog, data_dir, log_path)
        endpoint = await wait_for_endpoint(data_dir, 60, lambda: sink.poll() is None)
        await _until(lambda: endpoint.health()["rows_written"] > 0, 60, "the second run to write")
        sink.send_signal(signal.SIGKILL)  # killed again, mid catch-up
        sink.wait()
        sink = _start_sink(bootstrap, catalog, data_dir, log_path)
        await wave(200)
        endpoint = await wait_for_endpoint(data_dir, 60, lambda: sink.poll() is None)
        await wait_caught_up(bootstrap, catalog, endpoint, timeout_s=90)
        assert_exactly_once(endpoint, produced, n)
        cli = [sys.executable, "-m", "infra.cli"]
        audit = subprocess.run([*cli, "report", "--audit", "--json", "--endpoint", endpoint.url],
                               capture_output=True, text=True, timeout=60)
        rows = subprocess.run([*cli, "sql", "SELECT tenant, count() AS n FROM requests "
                               "GROUP BY tenant ORDER BY tenant", "--format", "json",
                               "--endpoint", endpoint.url], capture_output=True, text=True,
                              timeout=60)
        refused = subprocess.run([*cli, "sql", "DROP TABLE request_events", "--endpoint",
                                  endpoint.url],
                                 capture_output=True, text=True, timeout=60)
        return n, audit, rows, refused
    finally:
        if sink.poll() is None:
            sink.send_signal(signal.SIGTERM)
            sink.wait(timeout=30)


def test_a_sink_killed_and_restarted_mid_run_loses_and_duplicates_nothing(
        kafka_bootstrap, catalog, tmp_path):
    n, audit, rows, refused = asyncio.run(_kill_restart_scenario(
        kafka_bootstrap, catalog, tmp_path / "analytics", tmp_path / "sink.log"))
    assert audit.returncode == 0, audit.stderr[-2000:]
    report = json.loads(audit.stdout)
    assert (report["accepted"], report["terminal"], report["violations"]) == (n, n, 0)
    assert report["unanswered"] == 0 and report["ok"] is True
    assert rows.returncode == 0, rows.stderr[-2000:]
    assert json.loads(rows.stdout) == [{"tenant": f"tenant-{k}", "n": len(range(k, n, 3))}
                                       for k in range(3)]
    assert refused.returncode == 2 and "only reads are allowed" in refused.stderr


async def _crashed_mid_flush(bootstrap, catalog, store, n_requests: int) -> Counter:
    """What a sink that crashed mid-flush leaves: ``n_requests`` requests' records on the
    topics, all in one flush its run began, three of whose tables it inserted. Returns the rows
    each table should get."""
    records, expected = history(catalog, 0, n_requests, _now_ms())
    await produce(bootstrap, records)
    ends = await end_offsets(bootstrap, list(catalog.topics()))
    ranges = [OffsetRange(t, p, 0, end - 1) for (t, p), end in sorted(ends.items()) if end]
    batch, readable = await read_ranges(bootstrap, catalog, ranges)
    assert readable == ranges
    crashed = Flush("crashed-run", 1, tuple(ranges))
    Journal(store, crashed.run).begin(crashed)
    for insert in batch.inserts(crashed.token)[:3]:  # the crash comes after three of the tables
        store.insert(insert.table, insert.data, token=insert.token)
    return expected


async def _pending_scenario(bootstrap, catalog, location):
    store = Store.open(location)
    expected = await _crashed_mid_flush(bootstrap, catalog, store, 300)
    store.close()
    stop = asyncio.Event()
    sink = AnalyticsSink(bootstrap, catalog, location)
    running = asyncio.create_task(sink.run(stop))
    reader = StoreSource(Store.open(location, readonly=True))
    try:
        await wait_caught_up(bootstrap, catalog, reader, timeout_s=60)
        assert_exactly_once(reader, expected, 300)
        return sink.stats
    finally:
        stop.set()
        await running
        reader.close()


def test_a_flush_a_crash_left_half_written_is_completed_once_at_start(
        kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_pending", data_dir=tmp_path / "chdb")
    stats = asyncio.run(_pending_scenario(kafka_bootstrap, catalog, location))
    assert stats.replayed_rows == 3000 + 3 * 4  # every record of the pending flush, handed again


async def _taken_over_scenario(bootstrap, catalog, location):
    """A sink given partitions of a crashed sink's unfinished flush writes that flush first."""
    store = Store.open(location)
    try:
        expected = await _crashed_mid_flush(bootstrap, catalog, store, 300)
        sink = AnalyticsSink(bootstrap, catalog, location)
        sink.journal = Journal(store, "survivor-run")
        await sink._finish_others({TopicPartition(catalog.telemetry, 99)})  # none of its own
        left = sink.journal.state().pending
        await sink._finish_others({TopicPartition(catalog.telemetry, 0)})
        return StoreSource(store), expected, left, sink.journal.state().pending
    except BaseException:
        store.close()
        raise


def test_a_sink_given_a_crashed_sinks_partitions_first_finishes_its_flush(
        kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_taken_over", data_dir=tmp_path / "chdb")
    source, expected, left, after = asyncio.run(
        _taken_over_scenario(kafka_bootstrap, catalog, location))
    try:
        assert [f.run for f in left] == ["crashed-run"] and after == ()
        assert_exactly_once(source, expected, 300)
    finally:
        source.close()


async def _committed(bootstrap, group, tps):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        return {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()


async def _outage_scenario(bootstrap, catalog, location):
    now = _now_ms()
    first, expected = history(catalog, 0, 100, now)
    await produce(bootstrap, first)
    stop = asyncio.Event()
    sink = AnalyticsSink(bootstrap, catalog, location, SinkSettings(retry_max_s=0.5))
    running = asyncio.create_task(sink.run(stop))
    admin = None
    try:
        await _until(lambda: sink.ready.is_set(), 60, "the sink to open the store")
        admin = Store.open(location)
        await wait_caught_up(bootstrap, catalog, StoreSource(admin), timeout_s=60)
        telemetry = [TopicPartition(catalog.telemetry, p) for p in range(4)]
        await _until(lambda: not sink.flushing, 30, "the last flush to be committed")
        before = await _committed(bootstrap, sink.group_id, telemetry)
        admin.command("DETACH TABLE request_events")  # the store now refuses those inserts
        second, more = history(catalog, 100, 100, now)
        await produce(bootstrap, second)
        await _until(lambda: sink.stats.store_failures >= 3, 60, "inserts to fail")
        assert not sink.stats.store_ok and "request_events" in sink.stats.last_error
        during = await _committed(bootstrap, sink.group_id, telemetry)
        admin.command("ATTACH TABLE request_events")
        await wait_caught_up(bootstrap, catalog, StoreSource(admin), timeout_s=60)
        await _until(lambda: sink.stats.store_ok, 30, "the sink to see the store back")
        expected.update(more)
        assert_exactly_once(StoreSource(admin), expected, 200)
        await _until(lambda: not sink.flushing, 30, "the last flush to be committed")
        after = await _committed(bootstrap, sink.group_id, telemetry)
        return before, during, after
    finally:
        stop.set()
        await running
        if admin is not None:
            admin.close()


def test_while_the_store_is_down_the_sink_backs_off_commits_nothing_and_loses_nothing(
        kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_outage", data_dir=tmp_path / "chdb")
    before, during, after = asyncio.run(_outage_scenario(kafka_bootstrap, catalog, location))
    assert during == before  # nothing committed while the store refused the batch
    assert all(after[tp] > (before[tp] or 0) for tp in after)


async def _two_sinks_scenario(bootstrap, catalog, location):
    """Two sinks in the sink's consumer group, on one store, each writing its share of the
    partitions in small flushes at once. Both are in the group, with their partitions, before
    the first record: the test is of their flushes, not of a rebalance."""
    stop = asyncio.Event()
    settings = SinkSettings(max_batch_records=300, max_batch_age_s=0.05)
    sinks = [AnalyticsSink(bootstrap, catalog, location, settings) for _ in range(2)]
    running = [asyncio.create_task(sink.run(stop)) for sink in sinks]
    total = sum(catalog.spec(topic).partitions for topic in catalog.topics())
    try:
        async with asyncio.timeout(60):
            # both with a share, and the shares settled: one sink that opened the store late
            # (two migrating it at once, one retries) joins while the other holds them all
            while not (all(sink.stats.partitions for sink in sinks)
                       and sum(sink.stats.partitions for sink in sinks) == total):
                await asyncio.sleep(0.05)  # polls the sinks' assignments
        records, produced = history(catalog, 0, 1_500, _now_ms())
        await produce(bootstrap, records)
        reader = await _caught_up(bootstrap, catalog, location)
        # the shares once every record is in, before they stop: as the first to stop leaves
        # the group, the other is given every partition (51 + its old share was counted)
        shares = [sink.stats.partitions for sink in sinks]
        return reader, produced, [sink.stats for sink in sinks], shares
    finally:
        stop.set()
        await asyncio.gather(*running)


def test_two_sinks_on_one_store_write_every_record_once(kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_two_sinks", data_dir=tmp_path / "chdb")
    reader, produced, stats, shares = asyncio.run(
        _two_sinks_scenario(kafka_bootstrap, catalog, location))
    try:
        assert all(s.flushes >= 2 for s in stats)  # both wrote, in several flushes each
        assert sum(shares) == sum(catalog.spec(topic).partitions for topic in catalog.topics())
        assert_exactly_once(reader, produced, 1_500)
    finally:
        reader.close()


async def _moving_partitions_scenario(bootstrap, catalog, location, chunks: int, per_chunk: int):
    """Records stream in while sinks join the group and one leaves it: every join and leave
    moves partitions between sinks that are writing flushes of them."""
    settings = SinkSettings(max_batch_records=400, max_batch_age_s=0.02)
    stops: list[asyncio.Event] = []
    running: list[asyncio.Task] = []
    sinks: list[AnalyticsSink] = []

    def start_sink() -> None:
        stops.append(asyncio.Event())
        sinks.append(AnalyticsSink(bootstrap, catalog, location, settings))
        running.append(asyncio.create_task(sinks[-1].run(stops[-1])))

    produced: Counter = Counter()
    start_sink()
    try:
        for chunk in range(chunks):
            if chunk in (1, 3):
                start_sink()  # joins: the sinks in the group give up partitions mid-stream
            if chunk == 5:
                stops[0].set()  # leaves: its partitions move to the others
            records, rows = history(catalog, chunk * per_chunk, per_chunk, _now_ms())
            produced += rows
            await produce(bootstrap, records)
            await _until(lambda: sum(s.stats.flushes for s in sinks) > chunk, 60,
                         "a flush of each chunk")
        return await _caught_up(bootstrap, catalog, location), produced, [s.stats for s in sinks]
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*running)


def test_sinks_joining_and_leaving_mid_stream_write_every_record_once(kafka_bootstrap, catalog,
                                                                      tmp_path):
    location = StoreLocation("t_moving", data_dir=tmp_path / "chdb")
    chunks, per_chunk = 8, 400
    reader, produced, stats = asyncio.run(
        _moving_partitions_scenario(kafka_bootstrap, catalog, location, chunks, per_chunk))
    try:
        assert all(s.flushes >= 1 for s in stats)  # each of the three sinks wrote
        assert_exactly_once(reader, produced, chunks * per_chunk)
    finally:
        reader.close()


async def _deleted_topic_scenario(bootstrap, catalog, location):
    """A crashed run's unfinished flush of one topic, deleted since: no sink is ever given its
    partitions, so the sink given any others finishes it, and does not bring the topic back."""
    store = Store.open(location)
    try:
        records, _ = history(catalog, 0, 50, _now_ms())
        await produce(bootstrap, [r for r in records if r.topic == catalog.kv])
        ends = await end_offsets(bootstrap, [catalog.kv])
        ranges = tuple(OffsetRange(t, p, 0, end - 1) for (t, p), end in sorted(ends.items()) if end)
        assert ranges
        Journal(store, "crashed-run").begin(Flush("crashed-run", 1, ranges))
        await delete_topics(bootstrap, [catalog.kv])
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            async with asyncio.timeout(30):
                while catalog.kv in await admin.list_topics():
                    await asyncio.sleep(0.05)  # polls until the broker no longer lists it
        finally:
            await admin.close()
        sink = AnalyticsSink(bootstrap, catalog, location)
        sink.journal = Journal(store, "survivor-run")
        before = sink.journal.state().pending
        await sink._finish_others({TopicPartition(catalog.telemetry, 0)})
        # A topic created by asking about it appears a moment later: one created after the
        # sink asked, once listed, shows the broker has processed what came before it.
        marker = f"{catalog.namespace}.marker"
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(marker, 1, 1)])
            async with asyncio.timeout(30):
                while marker not in (topics := set(await admin.list_topics())):
                    await asyncio.sleep(0.05)  # polls the broker's topic list
        finally:
            await admin.close()
        return before, sink.journal.state().pending, topics
    finally:
        store.close()


def test_an_unfinished_flush_of_a_deleted_topic_is_finished_by_any_sink(kafka_bootstrap, catalog,
                                                                        tmp_path):
    location = StoreLocation("t_deleted", data_dir=tmp_path / "chdb")
    before, after, topics = asyncio.run(_deleted_topic_scenario(kafka_bootstrap, catalog,
                                                                location))
    assert [f.run for f in before] == ["crashed-run"] and after == ()
    assert catalog.kv not in topics  # asking about it did not create it again


async def _frozen_scenario(bootstrap, catalog, location):
    """Two sinks; one (in a thread of its own) freezes, with records it read and has not
    written yet, for longer than the group's session timeout (a GC pause, a stalled VM): the
    group drops it and gives its partitions to the other. When it thaws, it must not write the
    records it held: their new owner writes them."""
    slow = SinkSettings(max_batch_records=100_000, max_batch_age_s=4.0)  # holds what it reads
    frozen_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=frozen_loop.run_forever, daemon=True)
    thread.start()
    frozen_stop = asyncio.Event()
    frozen = AnalyticsSink(bootstrap, catalog, location, slow)
    frozen_run = asyncio.run_coroutine_threadsafe(frozen.run(frozen_stop), frozen_loop)
    stop = asyncio.Event()
    other = AnalyticsSink(bootstrap, catalog, location,
                          SinkSettings(max_batch_records=400, max_batch_age_s=0.05))
    running = asyncio.create_task(other.run(stop))
    total = sum(catalog.spec(topic).partitions for topic in catalog.topics())
    produced: Counter = Counter()
    try:
        await _until(lambda: frozen.stats.partitions and other.stats.partitions, 60,
                     "both sinks in the group")
        read_before = frozen.stats.records
        records, rows = history(catalog, 0, 400, _now_ms())
        produced += rows
        await produce(bootstrap, records)
        await _until(lambda: frozen.stats.records > read_before, 60, "the sink to read its share")
        # Past the 6 s session timeout, with time to spare for the other sink's rebalance.
        frozen_loop.call_soon_threadsafe(time.sleep, 15.0)
        await _until(lambda: other.stats.partitions == total, 60, "the group to drop it")
        records, rows = history(catalog, 400, 400, _now_ms())
        produced += rows
        await produce(bootstrap, records)
        await _until(lambda: frozen.stats.partitions and other.stats.partitions < total, 90,
                     "the thawed sink to rejoin")
        return await _caught_up(bootstrap, catalog, location), produced
    finally:
        frozen_loop.call_soon_threadsafe(frozen_stop.set)
        stop.set()
        await running
        await asyncio.wrap_future(frozen_run)
        frozen_loop.call_soon_threadsafe(frozen_loop.stop)
        thread.join(timeout=30)
        frozen_loop.close()


def test_a_sink_the_group_dropped_while_frozen_does_not_write_what_it_held(
        kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_frozen", data_dir=tmp_path / "chdb")
    reader, produced = asyncio.run(_frozen_scenario(kafka_bootstrap, catalog, location))
    try:
        assert_exactly_once(reader, produced, 800)
    finally:
        reader.close()


class _CutOffJournal(Journal):
    """A journal whose store this sink cannot reach while ``cut`` is set (its network to a
    ClickHouse server down, say): a flush fails at its first step."""

    def __init__(self, store, run: str, cut: threading.Event) -> None:
        super().__init__(store, run)
        self.cut = cut

    def begin(self, flush) -> None:
        if self.cut.is_set():
            raise StoreError("insert into sink_flushes failed: Connection refused")
        super().begin(flush)


class _CutOffSink(AnalyticsSink):
    """A sink whose own journal fails while ``cut`` is set, in a group that waits ``8 s`` (not
    60) for a member to give its partitions up."""

    def __init__(self, *args, cut: threading.Event, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cut = cut

    @property
    def journal(self) -> Journal:
        return self._journal

    @journal.setter
    def journal(self, journal: Journal) -> None:
        self._journal = _CutOffJournal(journal.store, journal.run, self.cut)

    def _new_consumer(self):
        consumer = super()._new_consumer()
        consumer._rebalance_timeout_ms = 8_000
        return consumer


async def _cut_off_scenario(bootstrap, catalog, location):
    """Sink A cannot reach the store while it holds a flush; sink C joins the group meanwhile.
    A's revocation waits for that flush, past the rebalance timeout: the group drops A and gives
    its partitions to B and C, which store A's records from the store's marks. When A reaches
    the store again it must not write the flush it held: those records are stored already."""
    settings = SinkSettings(max_batch_records=400, max_batch_age_s=0.05, retry_max_s=0.5)
    cut = threading.Event()
    stops = [asyncio.Event() for _ in range(3)]
    sinks = [_CutOffSink(bootstrap, catalog, location, settings, cut=cut if k == 0 else
                         threading.Event()) for k in range(3)]
    running = [asyncio.create_task(sinks[k].run(stops[k])) for k in range(2)]
    produced: Counter = Counter()
    total = sum(catalog.spec(topic).partitions for topic in catalog.topics())
    try:
        await _until(lambda: sinks[0].stats.partitions and sinks[1].stats.partitions, 60,
                     "two sinks in the group")
        failed_before = sinks[0].stats.store_failures  # (two sinks migrating one store race)
        cut.set()
        records, rows = history(catalog, 0, 400, _now_ms())
        produced += rows
        await produce(bootstrap, records)
        await _until(lambda: sinks[0]._last_flush is not None
                     and sinks[0].stats.store_failures >= failed_before + 2, 60,
                     "A's flush to fail")
        running.append(asyncio.create_task(sinks[2].run(stops[2])))  # C joins
        # The group drops A (its revocation waits for the flush) and B and C position all the
        # partitions (A's held records among them: the store has not got them); or A gives its
        # flush up on learning that it was dropped, and rejoins.
        await _until(lambda: sinks[0]._last_flush.done() or (
            sinks[1].stats.partitions + sinks[2].stats.partitions == total
            and not sinks[1]._assigning and not sinks[2]._assigning), 90, "the group to drop A")
        cut.clear()  # A reaches the store again
        await _until(lambda: sinks[0]._last_flush.done(), 60, "A's flush to end")
        records, rows = history(catalog, 400, 400, _now_ms())
        produced += rows
        await produce(bootstrap, records)
        return await _caught_up(bootstrap, catalog, location), produced
    finally:
        cut.clear()
        for stop in stops:
            stop.set()
        await asyncio.gather(*running)


def test_a_sink_cut_off_from_the_store_past_the_rebalance_timeout_does_not_write_what_it_held(
        kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation("t_cut_off", data_dir=tmp_path / "chdb")
    reader, produced = asyncio.run(_cut_off_scenario(kafka_bootstrap, catalog, location))
    try:
        assert_exactly_once(reader, produced, 800)
    finally:
        reader.close()
