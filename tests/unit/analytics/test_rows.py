"""Each message maps to one row of one table, with the columns the table expects."""

from collections import namedtuple

import orjson
import pyarrow as pa
import pytest

import analytics.rows as rows_module
from analytics.rows import SINK_CONSUMER, TopicRows, message_row, record_row
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
     {"type": "failed", "reason": "worker_lost", "detail": "heartbeat missed", "worker_id": "",
      "attempt": None}),  # (from a writer that names no attempt: stored as 0)
    (examples()[events.Rejected], "telemetry", "request_events",
     {"type": "rejected", "reason": "rate_limited", "retry_after_s": 1.0}),
    (examples()[events.Cancelled], "telemetry", "request_events",
     {"type": "cancelled", "reason": "", "detail": "client went away", "worker_id": "worker-3",
      "attempt": 2}),
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


# The sink's hot path (TopicRows): orjson for the frequent messages, pydantic for the rest.

_Record = namedtuple("_Record", "topic partition offset timestamp key value")  # as Kafka gives


def _records(suffix: str, values: list[bytes | None], first: int = 0) -> list[_Record]:
    topic = CATALOG.name(suffix)
    return [_Record(topic, 1, first + i, 1_700_000_000_000 + i, b"k", v)
            for i, v in enumerate(values)]


def _full_path(suffix: str, records: list[_Record]) -> dict[str, pa.Table]:
    """What pydantic's path gives for the same records, as Arrow tables."""
    spec, rows = CATALOG.spec(CATALOG.name(suffix)), {}
    for r in records:
        table, row = record_row(spec, r.topic, r.partition, r.offset, r.timestamp, r.key, r.value)
        rows.setdefault(table, []).append(row)
    return {table: TABLES[table].to_arrow(got) for table, got in rows.items()}


@pytest.mark.parametrize(("spec", "message"), list(_every_message()),
                         ids=lambda v: getattr(v, "suffix", None) or type(v).__name__)
def test_the_hot_path_gives_the_rows_of_the_full_path_for_every_message(spec, message):
    records = _records(spec.suffix, [encode(message)])
    assert TopicRows(spec).tables(records) == _full_path(spec.suffix, records)


def test_the_frequent_messages_are_decoded_without_pydantic(monkeypatch):
    frequent = [examples()[m] for m in (events.Queued, events.FirstToken, events.Completed,
                                        events.WorkerStatus)]
    records = _records("telemetry", [encode(m) for m in frequent])
    expected = _full_path("telemetry", records)

    def no_pydantic(*_):
        raise AssertionError("the hot path validated with pydantic")

    monkeypatch.setattr(rows_module, "decode", no_pydantic)
    assert TopicRows(CATALOG.spec(CATALOG.telemetry)).tables(records) == expected


def _edited(message, **changes) -> bytes:
    fields = orjson.loads(encode(message))
    fields.update(changes)
    return orjson.dumps({k: v for k, v in fields.items() if v is not _DROP})


_DROP = object()
_CHUNK = examples()[ResponseChunk]


@pytest.mark.parametrize(("value", "table", "reason"), [
    (_edited(_CHUNK, attempt=-1), "dead_letters", "schema_violation"),  # does not fit UInt16
    (_edited(_CHUNK, token_offset="ten"), "dead_letters", "schema_violation"),
    (_edited(_CHUNK, token_offset="10"), "dead_letters", "schema_violation"),  # no lax ints
    (_edited(_CHUNK, extra_field=1), "dead_letters", "schema_violation"),
    (_edited(_CHUNK, final="true"), "dead_letters", "schema_violation"),  # (raised before 6 Dec)
    (_edited(_CHUNK, final=1), "dead_letters", "schema_violation"),  # (stored before 6 Dec)
    (_edited(_CHUNK, worker_id=_DROP), "dead_letters", "schema_violation"),
    (_edited(_CHUNK, schema_version=99), "dead_letters", "schema_violation"),
    (_edited(_CHUNK, type="no_such_type"), "dead_letters", "schema_violation"),
    (b"[1, 2]", "dead_letters", "schema_violation"),
    (b"\xff not json", "dead_letters", "undecodable"),
    (None, "dead_letters", "undecodable"),
])
def test_a_record_off_the_hot_path_gets_the_full_paths_row_and_spoils_no_other(value, table,
                                                                               reason):
    good = encode(_CHUNK)
    records = _records("responses", [good, value, good], first=40)
    got = TopicRows(CATALOG.spec(CATALOG.responses)).tables(records)
    assert got == _full_path("responses", records)
    chunks = got["response_chunks"].column("kafka_offset").to_pylist()
    if table == "dead_letters":
        assert chunks == [40, 42]
        assert got["dead_letters"].column("reason").to_pylist() == [reason]
        assert got["dead_letters"].column("source_offset").to_pylist() == [41]
    else:
        assert chunks == [40, 41, 42] and "dead_letters" not in got


_DONE, _STATUS = examples()[events.Completed], examples()[events.WorkerStatus]
_DISPATCH = examples()[Dispatch]


@pytest.mark.parametrize(("suffix", "value", "named"), [
    ("telemetry", _edited(_DONE, output_tokens=4_000_000_000), "output_tokens"),
    ("telemetry", _edited(_DONE, e2e_s=1e300), "e2e_s"),
    ("telemetry", _edited(_DONE, tenant="ev\u0000il\nx"), "tenant"),
    ("telemetry", _edited(_DONE, request_id="r" * 129), "request_id"),
    ("telemetry", _edited(_DONE, attempt=60_000), "attempt"),
    ("telemetry", _edited(_DONE, finish_reason="pwned"), "finish_reason"),
    ("telemetry", _edited(_DONE, event_time_ms=2**62), "event_time_ms"),
    ("telemetry", _edited(_STATUS, running=2**31), "running"),
    ("telemetry", _edited(_STATUS, models_loaded=["llama-3-8b", "a b"]), "models_loaded.1"),
    ("telemetry", _edited(_STATUS, state="hacked"), "state"),
    ("responses", _edited(_CHUNK, worker_id="w\u2028"), "worker_id"),
    ("dispatch", _edited(_DISPATCH, slot=70_000), "slot"),
    # a JSON value of another type, which the hot path counted (before 6 Dec)
    ("responses", _edited(_CHUNK, tokens="abc"), "tokens"),
    ("responses", _edited(_CHUNK, text=["abc"]), "text"),
    ("responses", _edited(_CHUNK, text=0), "text"),
    ("telemetry", _edited(_STATUS, models_loaded="llama"), "models_loaded"),
    ("requests", _edited(examples()[InferenceRequest], prefix_hashes="ab"), "prefix_hashes"),
])
def test_a_value_that_fits_its_column_but_not_its_field_is_dead_lettered_naming_the_field(
        suffix, value, named):
    """Every other consumer dead-letters such a record; the hot path stored it as valid (before
    6 Dec a Completed of 4e9 tokens and e2e 1e300 s, of a tenant with a NUL and a newline in
    its name, was counted by report slo)."""
    good = [encode(m) for m in {"telemetry": (_DONE, _STATUS), "responses": (_CHUNK,),
                                "dispatch": (_DISPATCH,),
                                "requests": (examples()[InferenceRequest],)}[suffix]]
    records = _records(suffix, [*good, value, *good], first=40)
    got = TopicRows(CATALOG.spec(CATALOG.name(suffix))).tables(records)
    assert got == _full_path(suffix, records)
    letters = got["dead_letters"]
    assert letters.column("source_offset").to_pylist() == [40 + len(good)]
    assert letters.column("reason").to_pylist() in (["schema_violation"], ["oversized_field"])
    assert named in letters.column("error")[0].as_py()
    stored = sorted(o for t, rows in got.items() if t != "dead_letters"
                    for o in rows.column("kafka_offset").to_pylist())
    assert stored == [o for o in range(40, 41 + 2 * len(good)) if o != 40 + len(good)]


def test_a_batch_whose_rows_of_a_table_are_all_out_of_bounds_gives_their_dead_letters():
    """Before 6 Dec the hot path raised on such a batch (Arrow took an empty list of rows as
    of no type), so a fetch of one such record stopped the sink."""
    bad = [_edited(_DONE, output_tokens=4_000_000_000), _edited(_DONE, attempt=60_000)]
    records = _records("telemetry", [*bad, encode(_STATUS)], first=40)
    got = TopicRows(CATALOG.spec(CATALOG.telemetry)).tables(records)
    assert got == _full_path("telemetry", records)
    assert got["dead_letters"].column("source_offset").to_pylist() == [40, 41]
    assert "request_events" not in got
