"""The hot path's column checks (``analytics/bounds.py``) against the models' own limits.

For every message the hot path decodes (each model whose route builds its row from its fields)
and every field of it, the values just outside the field's limits are read off the model's
metadata (``ge``/``gt``/``le``/``lt``, lengths, pattern, ``Literal`` choices, and null for a
field that may not be null), put into the model's example, and run through ``TopicRows`` as the
sink runs it. Where such a value reaches the row, the record must never be stored as valid: the
model rejects it, so the full path dead-letters it. The values exactly at the limits must stay
on the hot path, so that no check drifts stricter than its model unseen. A model's limit that
changes fails these tests until ``bounds.py`` follows.
"""

import json
import math
import re
import string
import types
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import orjson
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

import analytics.rows as rows_module
from analytics.bounds import CHECKS
from analytics.rows import TopicRows, fast_routes, record_row
from analytics.schema import TABLES
from not_in_the_row import NOT_IN_THE_ROW
from schemas.codec import DecodeError, decode, encode
from schemas.examples import examples
from schemas.topics import SPECS, TopicCatalog

CATALOG = TopicCatalog("t")
_Record = namedtuple("_Record", "topic partition offset timestamp key value")  # as Kafka gives
_LIMITS = ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")


@dataclass(frozen=True)
class _Field:
    """What a model's annotation and metadata allow of one value."""

    kind: Any  # int, float, str, bool, list, a model class, or Literal
    nullable: bool
    limits: dict[str, Any] = field(default_factory=dict)
    choices: tuple = ()
    item: "_Field | None" = None


def _described(annotation: Any, metadata: list, nullable: bool = False) -> _Field:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        (inner,) = [a for a in args if a is not type(None)]
        return _described(inner, metadata, nullable or type(None) in args)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return _described(base, [*metadata, *extra], nullable)
    limits = {}
    for item in metadata:
        for constraint in (item.metadata if isinstance(item, FieldInfo) else [item]):
            limits.update({name: getattr(constraint, name) for name in _LIMITS
                           if getattr(constraint, name, None) is not None})
    if origin is Literal:
        return _Field(Literal, nullable, limits, choices=get_args(annotation))
    if origin is list:
        return _Field(list, nullable, limits, item=_described(get_args(annotation)[0], []))
    return _Field(annotation, nullable, limits)


def _fields(model: type[BaseModel]) -> dict[str, _Field]:
    return {name: _described(f.annotation, f.metadata) for name, f in model.model_fields.items()}


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), text) is not None


def _fast_messages():
    """(topic spec, model, table) of each message the hot path builds a row of."""
    for spec in SPECS:
        for model, found in fast_routes(spec):
            yield spec, model, found.table


def _choices_on(table: str, name: str) -> set:
    """Every choice any message routed to ``table`` allows its field ``name``."""
    return {choice for _, model, t in _fast_messages() if t == table
            for described in [_fields(model).get(name)]
            if described is not None and described.kind is Literal
            for choice in described.choices}


_BAD_CHARACTERS = " \n\x00=#\u00e9\u2028"


def _just_outside(f: _Field, example: Any, table: str, name: str) -> list[tuple[str, Any]]:
    """(label, value) of each value just outside ``f``'s limits."""
    got = [] if f.nullable else [("null", None)]
    lim = f.limits
    if f.kind is int:
        got += [(f"{k}{d:+d}", lim[k] + d) for k, d in (("ge", -1), ("gt", 0), ("le", 1),
                                                         ("lt", 0)) if k in lim]
    elif f.kind is float:
        got += [(k, math.nextafter(float(lim[k]), -math.inf if k == "ge" else math.inf))
                for k in ("ge", "le") if k in lim]
        got += [(k, float(lim[k])) for k in ("gt", "lt") if k in lim]
    elif f.kind is str:
        if "max_length" in lim:
            got.append(("max_length+1", "a" * (lim["max_length"] + 1)))
        if lim.get("min_length", 0) > 0:
            got.append(("min_length-1", "a" * (lim["min_length"] - 1)))
        if "pattern" in lim:
            base = example if isinstance(example, str) and example else "a"
            got += [(f"pattern-{ord(c):x}", base + c) for c in _BAD_CHARACTERS
                    if not _matches(lim["pattern"], "a" + c)]
    elif f.kind is Literal:
        others = ({"", "no_such_choice"} | _choices_on(table, name)) - set(f.choices)
        got += [(f"not-{other or 'empty'}", other) for other in sorted(others)]
    elif f.kind is list and "max_length" in lim:
        got.append(("max_length+1", [_an_item(f, example)] * (lim["max_length"] + 1)))
    return got


def _at_limits(f: _Field, example: Any) -> list[tuple[str, Any]]:
    """(label, value) of each value exactly at ``f``'s limits (or each of its choices)."""
    lim = f.limits
    if f.kind is int:
        return [(k, lim[k] + d) for k, d in (("ge", 0), ("gt", 1), ("le", 0), ("lt", -1))
                if k in lim]
    if f.kind is float:
        return ([(k, float(lim[k])) for k in ("ge", "le") if k in lim]
                + [(k, math.nextafter(float(lim[k]), math.inf if k == "gt" else -math.inf))
                   for k in ("gt", "lt") if k in lim])
    if f.kind is str:
        most = lim.get("max_length", 64)
        got = [("max_length", "a" * most)] if "max_length" in lim else []
        if lim.get("min_length", 0) > 0:
            got.append(("min_length", "a" * lim["min_length"]))
        if "pattern" in lim:  # every character the pattern allows
            allowed = "".join(c for c in string.printable if _matches(lim["pattern"], c))
            got += [(f"pattern{i}", allowed[i:i + most]) for i in range(0, len(allowed), most)]
        return got
    if f.kind is Literal:
        return [(f"choice-{c}", c) for c in f.choices]
    if f.kind is list and "max_length" in lim:
        return [("max_length", [_an_item(f, example)] * lim["max_length"])]
    return []


def _an_item(f: _Field, example: Any) -> Any:
    if example:
        return example[0]
    return {int: f.item.limits.get("ge", 0), str: "a"}[f.item.kind]


def _probes(model: type[BaseModel], example: dict, table: str, path: tuple = ()):
    """(path, kind, label, value) of each field of ``model`` and of the models within it."""
    for name, f in _fields(model).items():
        value = example.get(name)  # (a field left out when at its default: None)
        for label, probe in _just_outside(f, value, table, name):
            yield (*path, name), "outside", label, probe
        for label, probe in _at_limits(f, value):
            yield (*path, name), "at", label, probe
        if isinstance(f.kind, type) and issubclass(f.kind, BaseModel) and value is not None:
            yield from _probes(f.kind, value, table, (*path, name))
        if f.kind is list and value:
            item = f.item
            if isinstance(item.kind, type) and issubclass(item.kind, BaseModel):
                yield from _probes(item.kind, value[0], table, (*path, name, 0))
            else:
                for label, probe in _just_outside(item, value[0], table, name):
                    yield (*path, name, 0), "outside", label, probe
                for label, probe in _at_limits(item, value[0]):
                    yield (*path, name, 0), "at", label, probe


def _edited(fields: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = list(fields) if isinstance(fields, list) else dict(fields)
    copy[head] = _edited(fields[head] if rest else None, tuple(rest), value)
    return copy


def _json(fields: Any) -> bytes:
    """As Governor's encoder writes it (and integers past 64 bits, which orjson refuses)."""
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def _record(spec, raw: bytes) -> _Record:
    return _Record(CATALOG.name(spec.suffix), 1, 40, 1_700_000_000_000, b"k", raw)


def _changed(spec, plain: tuple, raw: bytes) -> set[str] | None:
    """The columns of the row of ``raw`` that differ from those of ``plain`` (the example's
    row); None where ``raw`` leaves the hot path (a dead letter's row)."""
    table, row = TopicRows(spec).row(_record(spec, raw))
    if table != plain[0]:
        return None
    return {name for (name, _), a, b in zip(TABLES[table].columns, row, plain[1], strict=True)
            if a != b}


def _rejected(spec, raw: bytes) -> bool:
    try:
        decode(spec, raw)
    except DecodeError:
        return True
    return False


@dataclass(frozen=True)
class _Probe:
    spec: Any
    model: type[BaseModel]
    table: str
    path: tuple
    kind: str  # "outside" its field's limits, or "at" them
    raw: bytes
    changed: set[str] | None  # the columns it changes; None: off the hot path

    @property
    def field(self) -> str:
        return ".".join(map(str, self.path))


def _all_probes():
    for spec, model, table in _fast_messages():
        fields = orjson.loads(encode(examples()[model]))
        plain = TopicRows(spec).row(_record(spec, _json(fields)))
        for path, kind, label, value in _probes(model, fields, table):
            raw = _json(_edited(fields, path, value))
            if path == ("type",) and not _rejected(spec, raw):
                continue  # another type's name on this one's fields: a valid message of that type
            probe = _Probe(spec, model, table, path, kind, raw, _changed(spec, plain, raw))
            yield pytest.param(probe, id=f"{spec.suffix}-{model.__name__}-{probe.field}-{label}")


_PARAMS = list(_all_probes())
_PROBES = [p.values[0] for p in _PARAMS]


def _cases(kind: str):
    """The probes of ``kind`` whose value reaches the row: the row differs from the example's
    (a value the row does not carry cannot be checked on its columns)."""
    return [p for p in _PARAMS if p.values[0].kind == kind and p.values[0].changed != set()]


@pytest.mark.parametrize("probe", _cases("outside"))
def test_a_value_just_outside_its_models_limit_is_never_stored_as_valid(probe):
    assert _rejected(probe.spec, probe.raw)  # (the model's word: the probe is outside its limits)
    got = TopicRows(probe.spec).tables([_record(probe.spec, probe.raw)])
    assert list(got) == ["dead_letters"], f"stored in {probe.table} although its model rejects it"
    named = next(p for p in reversed(probe.path) if isinstance(p, str))
    if named != "type":  # (another type's: its model names the fields this one lacks)
        assert named in got["dead_letters"].column("error")[0].as_py()


@pytest.mark.parametrize("probe", [p for p in _cases("at")
                                   if not _rejected(p.values[0].spec, p.values[0].raw)])
def test_a_value_at_its_models_limit_stays_on_the_hot_path(probe, monkeypatch):
    """No check is stricter than its model (a deliberate exception would be listed here).
    A probe at one limit that breaks a rule across fields, such as a step past ``steps_total``,
    is no valid message: it is left out."""
    record = _record(probe.spec, probe.raw)
    _, expected = record_row(probe.spec, *record)

    def no_pydantic(*_):
        raise AssertionError(f"{probe.field} at its limit left the hot path")

    monkeypatch.setattr(rows_module, "decode", no_pydantic)
    assert TopicRows(probe.spec).tables([record]) == {
        probe.table: TABLES[probe.table].to_arrow([expected])}


def test_every_checked_column_is_reached_by_a_probe():
    """The probes reach each column ``bounds.py`` checks: no check goes untested."""
    reached = {table: set() for table in CHECKS}
    reached["request_events"].add("type")  # (the hot path takes only its routes' own types)
    for probe in _PROBES:
        if probe.kind == "outside":
            reached[probe.table] |= probe.changed or set()
    assert {table: set(CHECKS[table]) - got for table, got in reached.items()} == {
        table: set() for table in CHECKS}


def test_the_fields_the_row_does_not_carry_are_the_known_ones():
    """A field the probes find out of every column is named above: a new one is a decision."""
    found: dict = {}
    for probe in _PROBES:
        if probe.kind == "outside" and probe.changed == set():
            found.setdefault(probe.spec.suffix, {}).setdefault(probe.model.__name__, set()).add(
                probe.field)
    assert found == NOT_IN_THE_ROW
