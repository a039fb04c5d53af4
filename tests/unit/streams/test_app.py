"""The Faust app's topology, without a broker: agents, co-partitioned topics, tables, records."""

import asyncio

import orjson

from streams.app import StreamsApp, _chunks, all_streams_topics, internal_topics
from streams.delivery import InlineDelivery
from streams.rewind import ReadOffsets, RewindingConsumer
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


def test_a_valid_record_the_stages_fail_on_is_dead_lettered_and_the_agent_goes_on(tmp_path):
    """A bug a record sets off in the stages must not stop the ingest agent (and with it every
    signal): the record goes to the dead-letter topic as ``unprocessable``, with the error."""
    from types import SimpleNamespace

    from schemas.codec import decode, encode
    from schemas.events import Queued
    from schemas.topics import TopicCatalog

    streams = StreamsApp(settings_for("unit-ns", "127.0.0.1:1"), datadir=tmp_path)
    sent = []

    class Producer:
        async def send(self, topic, key, value, partition, timestamp, headers):
            sent.append((topic, value))
            acked = asyncio.get_running_loop().create_future()
            acked.set_result(None)
            return acked

    def failing(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    streams._producer = Producer
    streams.stages.ingest = failing
    queued = Queued(event_time_ms=1_700_000_000_000, request_id="r1", tenant="t", model="m",
                    created_ms=1_700_000_000_000, prompt_tokens=10, max_tokens=5)
    record = SimpleNamespace(topic="unit-ns.telemetry", partition=2, offset=17, key=b"r1",
                             value=encode(queued))
    assert asyncio.run(streams._ingest_one(SimpleNamespace(message=record))) == []
    [(topic, value)] = sent
    letter = decode(TopicCatalog("unit-ns").spec(topic), value)
    assert (topic, letter.reason, letter.offset, letter.partition) == (
        "unit-ns.deadletter", "unprocessable", 17, 2)
    assert letter.error == "ZeroDivisionError: a bug"
