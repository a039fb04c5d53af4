"""Probes read off the models of the sink's hot-path messages (shared by ``test_bounds.py`` and
``test_across_fields.py``): for each field, the values just outside its limits and exactly at them
(``ge``/``gt``/``le``/``lt``, lengths, pattern, ``Literal`` choices, null), as its annotation and
metadata say, and the records that carry them."""

import json
import math
import re
import string
import types
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from analytics.rows import fast_routes, route
from analytics.schema import TABLES
from schemas.codec import DecodeError, decode
from schemas.topics import SPECS, TopicCatalog

CATALOG = TopicCatalog("t")
Record = namedtuple("Record", "topic partition offset timestamp key value")  # as Kafka gives
_LIMITS = ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")


@dataclass(frozen=True)
class FieldLimits:
    """What a model's annotation and metadata allow of one value."""

    kind: Any  # int, float, str, bool, list, a model class, or Literal
    nullable: bool
    limits: dict[str, Any] = field(default_factory=dict)
    choices: tuple = ()
    item: "FieldLimits | None" = None


def described(annotation: Any, metadata: list, nullable: bool = False) -> FieldLimits:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        (inner,) = [a for a in args if a is not type(None)]
        return described(inner, metadata, nullable or type(None) in args)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return described(base, [*metadata, *extra], nullable)
    limits = {}
    for item in metadata:
        for constraint in (item.metadata if isinstance(item, FieldInfo) else [item]):
            limits.update({name: getattr(constraint, name) for name in _LIMITS
                           if getattr(constraint, name, None) is not None})
    if origin is Literal:
        return FieldLimits(Literal, nullable, limits, choices=get_args(annotation))
    if origin is list:
        return FieldLimits(list, nullable, limits, item=described(get_args(annotation)[0], []))
    return FieldLimits(annotation, nullable, limits)


def fields_of(model: type[BaseModel]) -> dict[str, FieldLimits]:
    return {name: described(f.annotation, f.metadata) for name, f in model.model_fields.items()}


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), text) is not None


def fast_messages():
    """(topic spec, model, table) of each message the hot path builds a row of."""
    for spec in SPECS:
        for model, found in fast_routes(spec):
            yield spec, model, found.table


def _choices_on(table: str, name: str) -> set:
    """Every choice any message routed to ``table`` allows its field ``name``."""
    return {choice for _, model, t in fast_messages() if t == table
            for described in [fields_of(model).get(name)]
            if described is not None and described.kind is Literal
            for choice in described.choices}


_BAD_CHARACTERS = " \n\x00=#\u00e9\u2028"


def just_outside(f: FieldLimits, example: Any, table: str, name: str) -> list[tuple[str, Any]]:
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


def at_limits(f: FieldLimits, example: Any) -> list[tuple[str, Any]]:
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


def _an_item(f: FieldLimits, example: Any) -> Any:
    if example:
        return example[0]
    return {int: f.item.limits.get("ge", 0), str: "a"}[f.item.kind]


def probes(model: type[BaseModel], example: dict, table: str, path: tuple = ()):
    """(path, kind, label, value) of each field of ``model`` and of the models within it."""
    for name, f in fields_of(model).items():
        value = example.get(name)  # (a field left out when at its default: None)
        for label, probe in just_outside(f, value, table, name):
            yield (*path, name), "outside", label, probe
        for label, probe in at_limits(f, value):
            yield (*path, name), "at", label, probe
        if isinstance(f.kind, type) and issubclass(f.kind, BaseModel) and value is not None:
            yield from probes(f.kind, value, table, (*path, name))
        if f.kind is list and value:
            item = f.item
            if isinstance(item.kind, type) and issubclass(item.kind, BaseModel):
                yield from probes(item.kind, value[0], table, (*path, name, 0))
            else:
                for label, probe in just_outside(item, value[0], table, name):
                    yield (*path, name, 0), "outside", label, probe
                for label, probe in at_limits(item, value[0]):
                    yield (*path, name, 0), "at", label, probe


def edited(fields: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = list(fields) if isinstance(fields, list) else dict(fields)
    copy[head] = edited(fields[head] if rest else None, tuple(rest), value)
    return copy


def as_json(fields: Any) -> bytes:
    """As Governor's encoder writes it (and integers past 64 bits, which orjson refuses)."""
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def record(spec, raw: bytes) -> Record:
    return Record(CATALOG.name(spec.suffix), 1, 40, 1_700_000_000_000, b"k", raw)


def changed_columns(spec, model: type[BaseModel], plain: dict, fields: dict) -> set[str] | None:
    """The columns of the hot path's row of ``fields`` that differ from those of ``plain`` (the
    example's), as its route builds them before any check; None where it builds none (a field
    missing, a value of another JSON type)."""
    found = route(model, spec.suffix)
    names = [name for name, _ in TABLES[found.table].columns][3:]  # (time, then its own)

    def carried(given: dict) -> tuple:
        return given["event_time_ms"], *found.columns(given)

    try:
        row = carried(fields)
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    return {name for name, a, b in zip(names, row, carried(plain), strict=True) if a != b}


def rejected(spec, raw: bytes) -> bool:
    try:
        decode(spec, raw)
    except DecodeError:
        return True
    return False
