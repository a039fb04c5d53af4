"""Through real Kafka into the real store: the sink dead-letters a record that breaks a rule
across its fields, or has a bad value in a field its row does not carry, with its model's error,
and stores the valid ones beside it (``tests/unit/analytics/test_across_fields.py`` and
``test_fast_and_full_paths.py`` try every rule and field without a broker)."""

import asyncio
import time

import orjson
import pytest

from analytics.store import StoreLocation
from analytics.synthetic import Record, produce
from analytics_support import caught_up_sink
from schemas import events
from schemas.codec import encode
from schemas.examples import examples
from schemas.requests import Dispatch, ResponseChunk

pytestmark = pytest.mark.integration


def _edited(model, **changes) -> bytes:
    """The model's example with ``changes`` (``a__b``: ``b`` within ``a``), stamped now (the
    store keeps no row older than its table's TTL)."""
    fields = orjson.loads(encode(examples()[model]))
    fields["event_time_ms"] = int(time.time() * 1000)
    for dotted, value in changes.items():
        *path, name = dotted.split("__")
        inner = fields
        for part in path:
            inner = inner[part]
        inner[name] = value
    return orjson.dumps(fields)


#: (topic suffix, record, what its model's error says), and valid records (None).
_CASES = [
    ("telemetry", _edited(events.Queued, step=3, steps_total=2),
     "step (3) must not exceed steps_total (2)"),
    ("dispatch", _edited(Dispatch, resume_from_token=64),
     "resume_from_token (64) must be below max_tokens (64)"),
    ("dispatch", _edited(Dispatch, request__priority=10), "request.priority"),
    ("responses", _edited(ResponseChunk, finish_reason=None),
     "finish_reason is required on the final chunk and only there"),
    ("responses", _edited(ResponseChunk, tokens=[1, -2]), "tokens.1"),
    ("telemetry", _edited(events.WorkerStatus, itl_ms=-1.0), "itl_ms"),
    ("telemetry", _edited(events.Queued), None),
    ("dispatch", _edited(Dispatch), None),
    ("responses", _edited(ResponseChunk), None),
    ("telemetry", _edited(events.WorkerStatus), None),
]


def test_the_sink_stores_what_the_models_take_and_dead_letters_the_rest(kafka_bootstrap,
                                                                        catalog, tmp_path):
    asyncio.run(produce(kafka_bootstrap, [
        Record(catalog.name(suffix), b"k", raw, partition=3 if suffix == "dispatch" else 0)
        for suffix, raw, _ in _CASES]))
    location = StoreLocation(catalog.namespace, data_dir=tmp_path / "chdb")

    async def stored():
        async with caught_up_sink(kafka_bootstrap, catalog, location) as (_, reader, _):
            return (reader.query("SELECT raw_head, error FROM dead_letters FINAL").rows,
                    {table: reader.query(f"SELECT count() FROM {table} FINAL").rows[0][0]
                     for table in ("request_events", "dispatches", "response_chunks",
                                   "worker_status")})

    dead, kept = asyncio.run(stored())
    errors = {raw.encode() if isinstance(raw, str) else raw: error for raw, error in dead}
    for _, raw, said in _CASES:
        if said is None:
            assert raw not in errors
        else:
            assert raw in errors, f"stored as valid: {raw!r}"
            assert said in errors[raw]
    assert kept == {"request_events": 1, "dispatches": 1, "response_chunks": 1,
                    "worker_status": 1}
