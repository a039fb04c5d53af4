"""The Faust app's topology, without a broker: agents, co-partitioned topics, tables, records."""

import asyncio
from types import SimpleNamespace

import orjson

from schemas.codec import decode, encode
from schemas.events import Queued
from schemas.topics import TopicCatalog
from streams.app import StreamsApp, _chunks, all_streams_topics, internal_topics
from streams.delivery import InlineDelivery
from streams.recovery import GuardedRecovery
from streams.rewind import ReadOffsets, RewindingConsumer
from streams.signals.book import TOTAL
from streams.stages import Send
from streams.worker import settings_for


def test_topology_is_co_partitioned_with_telemetry(tmp_path):
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    assert streams.app.conf.datadir == tmp_path  # not Faust's default in the current directory
    assert set(streams.app.agents) == {"ingest", "tasks", "windows"}
    ingest = streams.app.agents["ingest"].channel
    assert set(ingest.topics) == {"unit-ns.telemetry", "unit-ns.requests",
                                  "unit-ns.streams.by-worker"}
    assert {t.partitions for t in streams.tables.values()} == {4}  # the telemetry topic's count
    assert streams.app.conf.table_standby_replicas == 1
    assert streams.app.conf.broker_session_timeout == 6.0
    assert internal_topics("ns")["scope"] == "ns.streams.by-scope"
    assert "ns.streams-windows-changelog" in all_streams_topics("ns")


def test_the_tables_recover_with_a_recovery_that_a_timed_out_step_ends(tmp_path):
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    assert isinstance(streams.app.tables.recovery, GuardedRecovery)  # streams.recovery


def test_the_end_of_a_rebalance_holds_deliveries_and_rewinds_uncommitted_inputs(tmp_path):
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    assert isinstance(streams.app.consumer, RewindingConsumer)
    assert isinstance(streams.app.consumer, InlineDelivery)
    assert isinstance(streams.app.consumer._read_offset, ReadOffsets)
    receivers = streams.app.on_rebalance_complete.iter_receivers(streams.app)
    assert [r.__func__ for r in receivers] == [StreamsApp._on_rebalance_complete]


def test_repartition_records_are_split_under_the_size_limit_in_order():
    pairs = [[f"key-{i}", {"payload": "x" * 100}] for i in range(100)]
    chunks = _chunks(pairs, limit=2_000)
    assert all(len(c) <= 2_000 for c in chunks) and len(chunks) > 1
    assert [p for c in chunks for p in orjson.loads(c)] == pairs


def test_deliveries_wait_from_the_end_of_recovery_until_faust_resumes_flow(tmp_path):
    """Between Faust's rebalance-complete signal and its resume of flow control (which empties
    the streams' queues), a record the consumer delivers must wait, not be queued and dropped."""

    async def scenario():
        streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
        flow = streams.app.flow_control
        queue = streams.app.FlowControlQueue(maxsize=16, clear_on_resume=True)  # a stream's queue
        flow.resume()  # as during the recovery of the tables
        streams._hold_deliveries()  # the first thing the rebalance-complete receiver does
        assert not flow.is_active()

        async def deliver(record):  # what the consumer's callback does
            await flow.acquire()
            queue.put_nowait(record)

        delivery = asyncio.ensure_future(deliver("telemetry[2]@25"))
        await asyncio.sleep(0)  # let it run up to the wait
        assert not delivery.done() and queue.empty()
        flow.resume()  # Faust, once the partitions are sought: clears the queues
        await asyncio.wait_for(delivery, 5)
        assert queue.get_nowait() == "telemetry[2]@25"

    asyncio.run(scenario())


class _Producer:
    """Acknowledges every send at once and keeps ``(topic, value)``."""

    def __init__(self) -> None:
        self.sent = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, value))
        acked = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked


def _ingest_one(streams: StreamsApp, message, now: int, partition: int = 2, offset: int = 17):
    """Run the ingest of one telemetry record holding ``message``; return the dead letters
    it made and what it sent on."""
    producer = _Producer()
    streams._producer = lambda: producer
    record = SimpleNamespace(topic="unit-ns.telemetry", partition=partition, offset=offset,
                             key=message.request_id.encode(), value=encode(message))
    sends = asyncio.run(streams._ingest_one(SimpleNamespace(message=record), now))
    spec = TopicCatalog("unit-ns").spec("unit-ns.deadletter")
    return [decode(spec, value) for topic, value in producer.sent], sends


T = 1_700_000_000_000
QUEUED = Queued(event_time_ms=T, request_id="r1", tenant="t", model="m", created_ms=T,
                prompt_tokens=10, max_tokens=5)


def test_a_valid_record_the_stages_fail_on_is_dead_lettered_and_the_agent_goes_on(tmp_path):
    """A bug a record sets off in the stages must not stop the ingest agent (and with it every
    signal): the record goes to the dead-letter topic as ``unprocessable``, with the error."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)

    def failing(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    streams.stages.ingest = failing
    [letter], sends = _ingest_one(streams, QUEUED, T)
    assert sends == []
    assert (letter.source_topic, letter.reason, letter.offset, letter.partition) == (
        "unit-ns.telemetry", "unprocessable", 17, 2)
    assert letter.error == "ZeroDivisionError: a bug"


def test_an_event_far_ahead_of_the_clock_is_dead_lettered_and_moves_no_watermark(tmp_path):
    """The sweeps' event time of a partition was the newest event time read there: one event a
    year ahead stopped the sweeps until then and timed out every task on the next one."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path,
                         clock=lambda: T)
    ahead = QUEUED.model_copy(update={"event_time_ms": T + 365 * 86_400_000})
    [letter], sends = _ingest_one(streams, ahead, T)
    assert sends == [] and letter.reason == "future_event_time"
    assert letter.error.startswith(f"event_time_ms {ahead.event_time_ms} is 31,536,000,000 ms ahead")
    assert letter.event_time_ms == T  # stamped by the app's clock
    assert streams.stages.event_time(("t", 2)) == 0 and not streams.tables["requests"].data
    letters, sends = _ingest_one(streams, QUEUED, T, offset=18)
    assert letters == [] and sends and streams.stages.event_time(("t", 2)) == T


def test_a_key_whose_windows_did_not_change_is_sent_again_only_every_30_s(tmp_path) -> None:
    """A tenant idle for the hour it is kept was sent on every tick, with nothing new: 123k
    snapshots a minute for 630 idle tenants in a soak test. Its running total's rates move on
    with the span; that alone sends nothing before ``RESEND_MS``. The fleet view (each worker's
    age) is sent on every tick."""
    from schemas.events import SignalSnapshot
    from streams.app import RESEND_MS

    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)

    def tick(now_ms, completed=0.0, span=100.0):
        snaps = [SignalSnapshot(event_time_ms=now_ms, scope="tenant", key="acme", window_s=w,
                                window_end_ms=now_ms, values={"completed": completed})
                 for w in (10.0, 60.0)]
        snaps.append(SignalSnapshot(event_time_ms=now_ms, scope="tenant", key="acme",
                                    window_s=span, window_end_ms=now_ms,
                                    values={"completed": 5.0, "requests_per_s": 5 / span}))
        snaps.append(SignalSnapshot(event_time_ms=now_ms, scope="fleet", key="w0", window_s=0.5,
                                    window_end_ms=now_ms, values={"age_s": 0.0}))
        out, streams._sent = streams._to_send(snaps, now_ms)  # (as sent)
        return [(s.scope, s.window_s) for s in out]

    assert len(tick(0)) == 4                               # first seen: all of it
    assert tick(500, span=100.5) == [("fleet", 0.5)]       # nothing new
    assert len(tick(1_000, completed=1.0, span=101)) == 4  # a window changed: the key, whole
    assert tick(RESEND_MS, completed=1.0, span=130) == [("fleet", 0.5)]
    assert len(tick(1_000 + RESEND_MS, completed=1.0, span=131)) == 4  # sent again


def test_the_records_read_are_counted_by_the_name_of_their_source(tmp_path):
    """Before 6 Dec ``governor_streams_records_total`` was labelled with the one-letter codes the
    streams' deduplication keys records with (``source="k"``: the task topic)."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    for code in "tqwks":
        streams._counters[code].inc()
    sources = {s.labels["source"] for family in streams.metrics.registry.collect()
               if family.name == "governor_streams_records" for s in family.samples
               if s.name.endswith("_total")}
    assert sources == {"telemetry", "requests", "worker", "task", "scope"}


def test_every_streams_topic_is_internal_to_a_request_of_any_namespace() -> None:
    """A request may not name one of them as its ``reply_to`` (``internal_reply_topic``)."""
    for namespace in ("ns", "other"):
        for topic in all_streams_topics(namespace):
            assert TopicCatalog("ns").internal_reply_topic(topic) is not None, topic


def _queued_obs(offset: int, t: int) -> list:
    return ["t0", offset, 0, {"k": "q", "t": t, "tn": "acme"}]


def test_a_batch_keeps_the_order_its_observations_were_made_in_each_partition(tmp_path):
    """fleet:all and tenant:a share by-scope partition 0. A batch's sends were grouped by key,
    so tenant:a's observation made at 0 s went after fleet:all's made at 40 s, and was late by
    the windows' measure (30 s) though read one record at a time it was not."""
    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    producer = _Producer()
    streams._producer = lambda: producer
    sends = [Send("scope", "fleet:all", _queued_obs(0, T)),
             Send("scope", "tenant:a", _queued_obs(0, T)),
             Send("scope", "fleet:all", _queued_obs(1, T + 40_000))]
    asyncio.run(streams._send(sends))
    [(topic, value)] = producer.sent
    assert topic == "unit-ns.streams.by-scope"
    assert orjson.loads(value) == [[send.key, send.value] for send in sends]


def test_observations_grouped_by_key_are_judged_late_as_they_arrived(tmp_path):
    """tenant:a at 0 s, fleet:all at 40 s, tenant:a at 1 s in one partition: read one at a
    time the third is late (39 s behind the partition's newest, more than the allowed 30 s).
    Grouped by key, tenant:a's two were applied first, at tenant:a's newest time, and the
    third was not late; judged at the batch's newest, the first would have been late too."""
    def late_events(streams: StreamsApp, *records) -> float:
        streams.staged["windows"].begin()
        streams._observe([SimpleNamespace(partition=0, value=orjson.dumps(pairs))
                          for pairs in records])
        streams.staged["windows"].commit()
        total = streams.staged["windows"][f"tenant:a|{TOTAL}"]
        return total["b"]["c"].get("late_events", 0.0)

    records = [[["tenant:a", _queued_obs(0, T)]], [["fleet:all", _queued_obs(0, T + 40_000)]],
               [["tenant:a", _queued_obs(1, T + 1_000)]]]
    settings = settings_for("unit-ns", "127.0.0.1:1")
    one_at_a_time = StreamsApp(settings, datadir=tmp_path / "one")
    assert [late_events(one_at_a_time, record) for record in records] == [0.0, 0.0, 1.0]
    batched = StreamsApp(settings, datadir=tmp_path / "batched")
    assert late_events(batched, *records) == 1.0
