"""Export a JSON schema per message model, so producers in any language can validate."""

import json
from pathlib import Path

from pydantic import BaseModel

from schemas.config import GovernorConfig
from schemas.topics import SPECS, all_models


def export_json_schemas(directory: Path) -> list[Path]:
    """Write ``<Model>.json`` for every message model and the config; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for model in [*all_models(), GovernorConfig]:
        path = directory / f"{model.__name__}.json"
        path.write_text(json.dumps(_schema(model), indent=2) + "\n")
        written.append(path)
    catalog = {
        spec.suffix: {"key": spec.key, "partitions": spec.partitions, "cleanup": spec.cleanup,
                      "retention_ms": spec.retention_ms, "models": [m.__name__ for m in spec.models],
                      "doc": spec.doc}
        for spec in SPECS
    }
    path = directory / "topics.json"
    path.write_text(json.dumps(catalog, indent=2) + "\n")
    return [*written, path]


def _schema(model: type[BaseModel]) -> dict:
    """The model's JSON schema, with its ``type`` required: it has a default for Python code
    building messages, but a topic of several models is decoded by it, and a record without
    it is dead-lettered (before 6 Dec the schemas let producers leave it out)."""
    schema = model.model_json_schema()
    if "type" in schema["properties"] and "type" not in schema.get("required", []):
        schema["required"] = ["type", *schema.get("required", [])]
    return schema
