"""Each message maps to one row of one table, with the columns the table expects."""

import pytest

from analytics.rows import SINK_CONSUMER, message_row, record_row
from analytics.schema import COORDINATES, TABLES
from schemas import events
from schemas.codec import encode
from schemas.commands import ScalePool, SetBreakerState
from schemas.config import ConfigSet
from schemas.examples import T, examples
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import SPECS, TopicCatalog

CATALOG = TopicCatalog("t")


def _every_message():
    for spec in SPECS:
        for model in spec.models:
            yield spec, examples()[model]


@pytest.mark.parametrize(("spec", "message"), list(_every_message()),
                         ids=lambda v: getattr(v, "suffix", None) or type(v).__name__)
def test_every_message_of_the_catalog_has_a_table_and_a_full_row(spec, message):
    topic = CATALOG.name(spec.suffix)
    table, row = record_row(spec, topic, 3, 41, 0, b"key", encode(message))
    assert table in TABLES
    assert (table == "dead_letters") == isinstance(message, events.DeadLetter)
    assert len(row) == len(TABLES[table].columns)
    assert row[:4] == (topic, 3, 41, message.event_time_ms)
    TABLES[table].to_arrow([row])  # every value fits its Arrow type


ROWS = [  # message, topic suffix, table, {column: value}
    (examples()[InferenceRequest], "requests", "request_events",
     {"type": "inference_request", "request_id": "req-1", "task_id": "task-1", "step": 2,
      "steps_total": 5, "tenant": "acme", "priority": 3, "prompt_tokens": 40, "max_tokens": 64,
      "prefix_blocks": 2, "block_size": 16, "ttft_slo_s": 1.5, "deadline": T + 30_000,
      "created": T, "worker_id": ""}),
    (examples()[CancelRequest], "requests", "request_events",
     {"type": "cancel_request", "request_id": "req-1", "reason": "",
      "detail": "cancelled by client"}),
    (examples()[CancelRequest], "dispatch", "dispatches",
     {"type": "cancel_request", "request_id": "req-1", "worker_id": ""}),
    (examples()[Dispatch], "dispatch", "dispatches",
     {"type": "dispatch", "worker_id": "worker-3", "slot": 3, "attempt": 2, "resume_from_token": 10,
      "tenant": "acme", "task_id": "task-1"}),
    (examples()[ResponseChunk], "responses", "response_chunks",
     {"token_offset": 10, "tokens": 3, "is_final": 1, "finish_reason": "length"}),
    (examples()[events.Queued], "telemetry", "request_events",
     {"type": "queued", "prompt_tokens": 40, "max_tokens": 64, "deadline": T + 1, "created": T,
      "worker_id": "", "ttft_s": None}),
    (examples()[events.FirstToken], "telemetry", "request_events",
     {"type": "first_token", "worker_id": "worker-3", "ttft_s": 0.25, "attempt": 1}),
    (examples()[events.Completed], "telemetry", "request_events",
     {"type": "completed", "output_tokens": 64, "e2e_s": 2.0, "finish_reason": "length"}),
    (examples()[events.Failed], "telemetry", "request_events",
     {"type": "failed", "reason": "worker_lost", "detail": "heartbeat missed", "worker_id": ""}),
    (examples()[events.Rejected], "telemetry", "request_events",
     {"type": "rejected", "reason": "rate_limited", "retry_after_s": 1.0}),
    (examples()[events.Cancelled], "telemetry", "request_events",
     {"type": "cancelled", "reason": "", "detail": "client went away"}),
    (examples()[events.WorkerStatus], "telemetry", "worker_status",
     {"worker_id": "worker-3", "slot": 3, "pool": "h100@llama-3-8b", "gpu_type": "h100"}),
    (examples()[events.KvBlocksStored], "kv", "kv_events", {"type": "kv_blocks_stored"}),
    (events.KvCacheCleared(event_time_ms=T, worker_id="w"), "kv", "kv_events",
     {"type": "kv_cache_cleared", "blocks": 0, "block_size": 0}),
    (examples()[events.SignalSnapshot], "signals", "signals", {}),
    (ScalePool(event_time_ms=T, command_id="c1", issued_by="autoscaler", reason="queue deep",
               pool="h100@m", gpu_type="h100", model="m", replicas=4), "control",
     "control_commands",
     {"type": "scale_pool", "target": "h100@m", "reason": "queue deep", "issued_by": "autoscaler",
      "params": '{"pool":"h100@m","gpu_type":"h100","model":"m","replicas":4}'}),
    (SetBreakerState(event_time_ms=T, command_id="c2", worker_id="w-1", state="open"), "control",
     "control_commands",
     {"target": "w-1", "params": '{"worker_id":"w-1","state":"open","until_ms":null}'}),
    (ConfigSet(event_time_ms=T, key="slo.ttft_slo_s", value=1.0, set_by="ops"), "config",
     "config_changes", {"type": "config_set", "setting": "slo.ttft_slo_s", "value": "1.0",
                        "set_by": "ops", "config_offset": None}),
    (events.ConfigRejected(event_time_ms=T, key="slo.ttft_slo_s", component="router-0",
                           config_offset=12, reason="must be > 0"), "telemetry", "config_changes",
     {"type": "config_rejected", "component": "router-0", "config_offset": 12,
      "reason": "must be > 0", "value": ""}),
    (examples()[events.DeadLetter], "deadletter", "dead_letters", {}),
]


@pytest.mark.parametrize(("message", "suffix", "table", "expected"), ROWS,
                         ids=[f"{r[1]}-{type(r[0]).__name__}" for r in ROWS])
def test_row_values(message, suffix, table, expected):
    got_table, columns = message_row(message, suffix)
    assert got_table == table
    names = [name for name, _ in TABLES[table].own_columns]
    row = dict(zip(names, columns, strict=True))
    assert {k: row[k] for k in expected} == expected


def test_signal_values_become_a_map_and_dead_letters_keep_their_source():
    snapshot = examples()[events.SignalSnapshot]
    _, columns = message_row(snapshot, "signals")
    assert dict(columns[-1]) == snapshot.values
    letter = examples()[events.DeadLetter]
    _, columns = message_row(letter, "deadletter")
    assert columns[:4] == (letter.source_topic, letter.partition, letter.offset, letter.consumer)
    assert columns[-2:] == (letter.raw, letter.raw_size)


@pytest.mark.parametrize(("raw", "reason"), [
    (b"\xff not json", "undecodable"),
    (None, "undecodable"),
    (b'{"type": "queued", "request_id": "r"}', "schema_violation"),
    (encode(examples()[InferenceRequest]), "schema_violation"),  # a valid message, wrong topic
])
def test_a_record_the_sink_cannot_decode_becomes_a_dead_letter_row(raw, reason):
    spec = CATALOG.spec(CATALOG.telemetry)
    table, row = record_row(spec, CATALOG.telemetry, 2, 7, 1_700_000_000_123, b"k", raw)
    assert table == "dead_letters"
    values = dict(zip([n for n, _ in TABLES[table].columns], row, strict=True))
    assert values["time"] == 1_700_000_000_123  # the record's timestamp: the same row if re-read
    assert (values["source_topic"], values["source_partition"], values["source_offset"]) == (
        CATALOG.telemetry, 2, 7)
    assert values["consumer"] == SINK_CONSUMER and values["reason"] == reason
    assert values["raw_head"] == (raw or b"") and values["raw_size"] == len(raw or b"")


def test_every_table_starts_with_the_record_coordinates():
    for spec in TABLES.values():
        assert spec.columns[:4] == COORDINATES
