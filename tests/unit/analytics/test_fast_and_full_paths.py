"""The sink's two paths give the same verdict: records made from the models' JSON schemas.

For every message the hot path decodes, records are made from its example by one to three
edits each, chosen at random (seeded) from its exported JSON schema: a value at, just inside
or just past a bound, each choice and a name no choice has, short and long text, another JSON
kind (null, a boolean, a fraction, text, a list, an object, an integer past 64 bits), a field
left out, or a field no model knows, at any depth (a dispatched request's, a heartbeat's reply
progress). They go through the hot path as the sink reads a fetch (``TopicRows.tables``, all
of a model's records at once) and each alone through the full pydantic path
(``fitted_row``); the two must give the same rows: the same stored row, or the same dead
letter with the same reason; and a valid record with every field of its message (as Governor
writes it: the hot path takes no other) must not leave the hot path.
"""

import math
import random
from collections import namedtuple
from typing import Any

import orjson
import pytest

import analytics.rows as rows_module
from analytics.rows import TopicRows, fitted_row, record_row
from analytics.schema import TABLES
from model_probes import CATALOG, as_json, edited, fast_messages
from schemas.codec import encode
from schemas.examples import examples

#: Records made per message model: about 4,000 in all, a few seconds.
_RECORDS = 300
_Record = namedtuple("_Record", "topic partition offset timestamp key value")
_OTHER_KINDS = (None, True, False, 0.5, "1", [], {}, 2**64)


def _options(schema: dict, defs: dict) -> list[dict]:
    """The schemas a value may match (``anyOf`` flattened, ``$ref`` followed)."""
    if "$ref" in schema:
        return _options(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return [o for option in schema["anyOf"] for o in _options(option, defs)]
    return [schema]


def _bounds(low: Any, high: Any) -> list:
    """The values at and just past each bound given."""
    got = []
    for bound, step in ((low, -1), (high, 1)):
        if bound is not None:
            got += [bound, bound + step] if isinstance(bound, int) else [
                float(bound), math.nextafter(float(bound), step * math.inf)]
    return got


def _values(schema: dict, defs: dict, now: Any) -> list:
    """What ``_edit`` may put where ``schema`` describes a value (holding ``now``)."""
    got = list(_OTHER_KINDS)
    for s in _options(schema, defs):
        kind = s.get("type")
        got += [s["const"]] if "const" in s else []
        got += [*s["enum"], "no_such_choice"] if "enum" in s else []
        if kind in ("integer", "number"):
            got += _bounds(s.get("minimum"), s.get("maximum"))
            got += _bounds(s.get("exclusiveMinimum"), s.get("exclusiveMaximum"))
            got += [0, 1, 7] if kind == "integer" else [0.0, 1.5, 1e300]
        elif kind == "string":
            most = s.get("maxLength", 64)
            got += ["", "a", ".", "..", "a b", "\u00e9", "a" * most, "a" * (most + 1)]
        elif kind == "array":
            items = now[:1] if isinstance(now, list) else []
            got += [[], items * 3]
            if s.get("maxItems", math.inf) <= 100:
                got.append(items * (s["maxItems"] + 1))
    return got


def _places(data: dict, schema: dict, defs: dict, path: tuple = ()):
    """(path, schema) of each field of ``data``'s model (given or not), of the models within it
    and of the first item of each list; and (path, None) of each object, for a field no model
    knows."""
    yield path, None
    for name, prop in schema.get("properties", {}).items():
        yield (*path, name), prop
        value = data.get(name)
        for option in _options(prop, defs):
            if option.get("type") == "object" and isinstance(value, dict):
                yield from _places(value, option, defs, (*path, name))
            if option.get("type") == "array" and isinstance(value, list) and value:
                item = _options(option["items"], defs)[0]
                yield (*path, name, 0), option["items"]
                if item.get("type") == "object" and isinstance(value[0], dict):
                    yield from _places(value[0], item, defs, (*path, name, 0))


def _at(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _edit(data: dict, schema: dict, defs: dict, rng: random.Random) -> dict:
    path, prop = rng.choice(list(_places(data, schema, defs)))
    if prop is None:
        return edited(data, path, {**_at(data, path), "no_such_field": 1})
    parent = _at(data, path[:-1])
    if isinstance(parent, dict) and path[-1] in parent and rng.random() < 0.1:
        return edited(data, path[:-1], {k: v for k, v in parent.items() if k != path[-1]})
    now = parent[path[-1]] if isinstance(parent, list) else parent.get(path[-1])
    return edited(data, path, rng.choice(_values(prop, defs, now)))


def _shape(data: Any) -> Any:
    """The fields of ``data`` and of the objects within it (a list's by its first item)."""
    if isinstance(data, dict):
        return {name: _shape(value) for name, value in data.items()}
    return [_shape(data[0])] if isinstance(data, list) and data else None


def _made(model, example: dict, rng: random.Random) -> list[bytes]:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    made = []
    for _ in range(_RECORDS):
        data = example
        for _ in range(rng.choice((1, 1, 2, 3))):
            data = _edit(data, schema, defs, rng)
        made.append(as_json(data))
    return made


@pytest.mark.parametrize("spec, model", [(spec, model) for spec, model, _ in fast_messages()],
                         ids=lambda v: getattr(v, "suffix", None) or v.__name__)
def test_the_hot_path_gives_the_full_paths_rows(spec, model, monkeypatch):
    rng = random.Random(f"{spec.suffix}-{model.__name__}")
    example = orjson.loads(encode(examples()[model]))
    made = _made(model, example, rng)
    records = [_Record(CATALOG.name(spec.suffix), 0, offset, 1_700_000_000_000, b"k", raw)
               for offset, raw in enumerate(made)]
    hot, full, slow = TopicRows(spec), {}, []

    def full_path(*args):
        slow.append(args)
        return record_row(*args)

    monkeypatch.setattr(rows_module, "record_row", full_path)
    for record in records:  # (alone: a row Arrow cannot build sends its whole batch down the
        table, row = fitted_row(spec, record)  # full path)
        full.setdefault(table, []).append(row)
        slow.clear()
        got = hot.tables([record])
        if table != "dead_letters" and _shape(orjson.loads(record.value)) == _shape(example):
            assert not slow, f"{record.value[:300]!r}, valid, left the hot path"
        assert got == {table: TABLES[table].to_arrow([row])}, (
            f"{record.value[:300]!r}: the full path gives {table} {row}, the hot path "
            f"{ {t: rows.to_pylist() for t, rows in got.items()} }")
    # (the edits make both kinds: a test where all were stored, or none, would show little)
    stored = sum(len(rows) for table, rows in full.items() if table != "dead_letters")
    assert 0.1 * _RECORDS <= stored <= 0.9 * _RECORDS, f"{stored} of {_RECORDS} stored"
    assert hot.tables(records) == {table: TABLES[table].to_arrow(rows)
                                   for table, rows in full.items()}  # (and as one fetch)


def test_the_edits_reach_the_models_within_a_message():
    """The walk reaches a dispatched request's fields and a heartbeat's reply progress."""
    places = {}
    for _, model, _ in fast_messages():
        schema = model.model_json_schema()
        example = orjson.loads(encode(examples()[model]))
        places[model.__name__] = {p for p, _ in _places(example, schema, schema.get("$defs", {}))}
    assert ("request", "reply_to") in places["Dispatch"]
    assert ("request",) in places["Dispatch"]  # (a field no model knows, in the request)
    assert ("reply_progress", 0, "tokens_sent") in places["WorkerStatus"]
    assert ("tokens", 0) in places["ResponseChunk"]
