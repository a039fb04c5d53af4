"""The Faust app's topology, without a broker: agents, co-partitioned topics, tables, records."""

import orjson

from streams.app import StreamsApp, _chunks, all_streams_topics, internal_topics
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


def test_repartition_records_are_split_under_the_size_limit_in_order():
    pairs = [[f"key-{i}", {"payload": "x" * 100}] for i in range(100)]
    chunks = _chunks(pairs, limit=2_000)
    assert all(len(c) <= 2_000 for c in chunks) and len(chunks) > 1
    assert [p for c in chunks for p in orjson.loads(c)] == pairs
