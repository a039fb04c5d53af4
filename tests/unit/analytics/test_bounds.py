"""The hot path's column checks (``analytics/bounds.py``) against the models' own limits.

For every message the hot path decodes (each model whose route builds its row from its fields)
and every field of it, the values just outside the field's limits are read off the model's
metadata (``ge``/``gt``/``le``/``lt``, lengths, pattern, ``Literal`` choices, and null for a
field that may not be null), put into the model's example, and run through ``TopicRows`` as the
sink runs it. The record must never be stored as valid, whether its row carries the field or
not: the model rejects it, so the full path dead-letters it. The values exactly at the limits
must stay on the hot path, so that no check drifts stricter than its model unseen. A model's
limit that changes fails these tests until ``bounds.py`` follows.
"""

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

import analytics.rows as rows_module
from analytics.bounds import CHECKS
from analytics.rows import TopicRows, record_row, route
from analytics.schema import TABLES
from model_probes import (
    as_json,
    changed_columns,
    edited,
    fast_messages,
    probes,
    record,
    rejected,
)
from not_in_the_row import NOT_IN_THE_ROW
from schemas.codec import encode
from schemas.examples import examples


@dataclass(frozen=True)
class _Probe:
    spec: Any
    model: type[BaseModel]
    table: str
    path: tuple
    kind: str  # "outside" its field's limits, or "at" them
    raw: bytes
    changed: set[str] | None  # the columns it changes; None: its row cannot be built

    @property
    def field(self) -> str:
        return ".".join(map(str, self.path))


def _all_probes():
    for spec, model, table in fast_messages():
        fields = orjson.loads(encode(examples()[model]))
        for path, kind, label, value in probes(model, fields, table):
            probed = edited(fields, path, value)
            raw = as_json(probed)
            if path == ("type",) and not rejected(spec, raw):
                continue  # another type's name on this one's fields: a valid message of that type
            probe = _Probe(spec, model, table, path, kind, raw,
                           changed_columns(spec, model, fields, probed))
            yield pytest.param(probe, id=f"{spec.suffix}-{model.__name__}-{probe.field}-{label}")


_PARAMS = list(_all_probes())
_PROBES = [p.values[0] for p in _PARAMS]


def _cases(kind: str):
    """The probes of ``kind``: of every field, whether its row carries it or not."""
    return [p for p in _PARAMS if p.values[0].kind == kind]


@pytest.mark.parametrize("probe", _cases("outside"))
def test_a_value_just_outside_its_models_limit_is_never_stored_as_valid(probe):
    assert rejected(probe.spec, probe.raw)  # (the model's word: the probe is outside its limits)
    got = TopicRows(probe.spec).tables([record(probe.spec, probe.raw)])
    assert list(got) == ["dead_letters"], f"stored in {probe.table} although its model rejects it"
    named = next(p for p in reversed(probe.path) if isinstance(p, str))
    if named != "type":  # (another type's: its model names the fields this one lacks)
        assert named in got["dead_letters"].column("error")[0].as_py()


@pytest.mark.parametrize("probe", [p for p in _cases("at")
                                   if not rejected(p.values[0].spec, p.values[0].raw)])
def test_a_value_at_its_models_limit_stays_on_the_hot_path(probe, monkeypatch):
    """No check is stricter than its model (a deliberate exception would be listed here).
    A probe at one limit that breaks a rule across fields, such as a step past ``steps_total``,
    is no valid message: it is left out."""
    given = record(probe.spec, probe.raw)
    _, expected = record_row(probe.spec, *given)

    def no_pydantic(*_):
        raise AssertionError(f"{probe.field} at its limit left the hot path")

    monkeypatch.setattr(rows_module, "decode", no_pydantic)
    assert TopicRows(probe.spec).tables([given]) == {
        probe.table: TABLES[probe.table].to_arrow([expected])}


def test_every_checked_column_is_reached_by_a_probe():
    """The probes reach each column ``bounds.py`` checks: no check goes untested."""
    reached = {table: set() for table in CHECKS}
    reached["request_events"].add("type")  # (the hot path takes only its routes' own types)
    for probe in _PROBES:
        if probe.kind == "outside":
            reached[probe.table] |= probe.changed or set()
    checked = {table: {column for key in checks for column in
                       (key if isinstance(key, tuple) else (key,))}
               for table, checks in CHECKS.items()}
    assert {table: checked[table] - got for table, got in reached.items()} == {
        table: set() for table in CHECKS}


def test_the_fields_the_row_does_not_carry_are_the_known_ones():
    """A field the probes find out of every column is named in ``not_in_the_row.py``: a new
    one is a decision."""
    found: dict = {}
    for probe in _PROBES:
        if (probe.kind == "outside" and probe.changed == set()
                and probe.path not in (("schema_version",), ("type",))):
            found.setdefault(probe.spec.suffix, {}).setdefault(probe.model.__name__, set()).add(
                probe.field)
    assert found == NOT_IN_THE_ROW


def test_the_fields_the_row_does_not_carry_are_judged_by_their_model():
    """Each is among its route's ``unread`` fields, which send a record that gives one other
    than its default to its model's judgement."""
    for spec, model, _ in fast_messages():
        unread = set(route(model, spec.suffix).unread)
        for path in NOT_IN_THE_ROW.get(spec.suffix, {}).get(model.__name__, ()):
            assert path.split(".")[0] in unread, (spec.suffix, model.__name__, path)
