"""Tests of schemas.export: one JSON schema per model plus the topic catalog."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.base import Message
from schemas.codec import DecodeError, decode, encode
from schemas.config import GovernorConfig
from schemas.events import Cancelled, Failed
from schemas.export import export_json_schemas
from schemas.requests import CancelRequest, InferenceRequest
from schemas.topics import SPECS, TopicCatalog, all_models


def test_export_writes_a_schema_per_model_and_the_catalog(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "schemas"  # created on demand
    written = export_json_schemas(out)
    names = {p.name for p in written}
    expected = {f"{m.__name__}.json" for m in [*all_models(), GovernorConfig]} | {"topics.json"}
    assert names == expected
    assert len(written) == len(expected)
    assert {p.name for p in out.iterdir()} == expected
    for path in written:
        assert path.parent == out
        doc = json.loads(path.read_text())
        if path.name != "topics.json":
            assert "properties" in doc, path.name
            assert doc["title"] == path.stem


def test_exported_schema_states_limits_and_required_fields(tmp_path: Path) -> None:
    export_json_schemas(tmp_path)
    doc = json.loads((tmp_path / "InferenceRequest.json").read_text())
    assert doc["additionalProperties"] is False
    assert doc["properties"]["request_id"]["maxLength"] == 128
    assert doc["properties"]["type"]["const"] == "inference_request"
    assert {"request_id", "prompt_tokens", "max_tokens", "created_ms", "event_time_ms"} <= set(
        doc["required"]
    )


def test_exported_catalog_matches_the_specs(tmp_path: Path) -> None:
    export_json_schemas(tmp_path)
    catalog = json.loads((tmp_path / "topics.json").read_text())
    assert list(catalog) == [s.suffix for s in SPECS]
    for spec in SPECS:
        entry = catalog[spec.suffix]
        assert entry["partitions"] == spec.partitions
        assert entry["cleanup"] == spec.cleanup
        assert entry["retention_ms"] == spec.retention_ms
        assert entry["models"] == [m.__name__ for m in spec.models]


def test_export_overwrites_an_earlier_export(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text("stale")
    export_json_schemas(tmp_path)
    assert json.loads((tmp_path / "topics.json").read_text())["config"]["cleanup"] == "compact"


def test_exported_schemas_require_the_type_a_record_is_decoded_by(
        tmp_path: Path, examples: dict[type[Message], Message]) -> None:
    """A producer that follows the exported schemas is not dead-lettered: a record without
    its ``type`` is refused on a topic of several models (before 6 Dec the schemas gave it a
    default, not required, and a request so built was refused as ``schema_violation``)."""
    export_json_schemas(tmp_path)
    catalog = TopicCatalog()
    refused_without_type = set()
    for spec in SPECS:
        for model in spec.models:
            record = json.loads(encode(examples[model]))
            del record["type"]
            try:
                decode(catalog.spec(catalog.name(spec.suffix)), json.dumps(record).encode())
            except DecodeError:
                refused_without_type.add(model)
    assert {InferenceRequest, CancelRequest} <= refused_without_type
    for model in all_models():  # (every message carries it, as the README says)
        doc = json.loads((tmp_path / f"{model.__name__}.json").read_text())
        assert doc["required"][0] == "type", model.__name__


def test_a_failure_and_a_cancellation_may_name_their_attempt(tmp_path: Path) -> None:
    """Since 7 Dec ``Failed`` and ``Cancelled`` name the attempt they end, optionally (an older
    worker's name none), as ``Completed`` does; encoded without it where unset, so an older
    reader, which forbids the field, still reads those."""
    export_json_schemas(tmp_path)
    for model in (Failed, Cancelled):
        doc = json.loads((tmp_path / f"{model.__name__}.json").read_text())
        assert "attempt" not in doc["required"]
        said, unsaid = doc["properties"]["attempt"]["anyOf"]
        assert (said["minimum"], said["maximum"], unsaid) == (1, 1000, {"type": "null"})
    unset = Failed(event_time_ms=1, request_id="r", reason="worker_lost")
    assert "attempt" not in json.loads(encode(unset))
    assert json.loads(encode(unset.model_copy(update={"attempt": 2})))["attempt"] == 2
