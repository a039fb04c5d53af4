"""Export a JSON schema per message model, so producers in any language can validate."""

import json
from pathlib import Path

from schemas.config import GovernorConfig
from schemas.topics import SPECS, all_models


def export_json_schemas(directory: Path) -> list[Path]:
    """Write ``<Model>.json`` for every message model and the config; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for model in [*all_models(), GovernorConfig]:
        path = directory / f"{model.__name__}.json"
        path.write_text(json.dumps(model.model_json_schema(), indent=2) + "\n")
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
