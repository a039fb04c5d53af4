"""A worker may not be named ``all``: the streams publish the whole fleet's signals as
``fleet:all``, beside each worker's fleet view as ``fleet:<worker id>``, so a worker named so
mixed its view into the fleet's (its Prometheus series and the demo's fleet totals; before
7 Dec its heartbeats were taken). Its heartbeat is dead-lettered, naming the field and why, by
every consumer, the sink's hot path too."""

import json
from collections import namedtuple

import pytest

from analytics.rows import TopicRows
from schemas.codec import DecodeError, decode, encode
from schemas.events import WorkerStatus
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("t")
SPEC = CATALOG.spec(CATALOG.telemetry)
_Record = namedtuple("_Record", "topic partition offset timestamp key value")


def _heartbeat(worker_id: str) -> bytes:
    status = WorkerStatus(event_time_ms=1_700_000_000_000, worker_id="w0", slot=0,
                          pool="h100@m", gpu_type="h100", started_ms=1_700_000_000_000)
    return json.dumps({**json.loads(encode(status)), "worker_id": worker_id}).encode()


def test_a_heartbeat_of_a_worker_named_all_is_refused_naming_the_field_and_why():
    with pytest.raises(DecodeError) as refused:
        decode(SPEC, _heartbeat("all"))
    assert refused.value.reason == "schema_violation"
    assert "worker_status.worker_id" in refused.value.detail
    assert "fleet:all" in refused.value.detail


def test_the_sink_dead_letters_it_too():
    raw = _heartbeat("all")
    got = TopicRows(SPEC).tables([_Record(CATALOG.telemetry, 0, 1, 0, b"all", raw)])
    assert list(got) == ["dead_letters"]
    assert "fleet:all" in got["dead_letters"].column("error")[0].as_py()


@pytest.mark.parametrize("worker_id", ["ALL", "all-0", "worker-all", "w0"])
def test_other_worker_ids_are_taken(worker_id):
    assert decode(SPEC, _heartbeat(worker_id)).worker_id == worker_id
    raw = _heartbeat(worker_id)
    got = TopicRows(SPEC).tables([_Record(CATALOG.telemetry, 0, 1, 0, b"w", raw)])
    assert list(got) == ["worker_status"]


def test_the_exported_schema_says_so():
    assert WorkerStatus.model_json_schema()["properties"]["worker_id"]["not"] == {"const": "all"}
