"""The hot path against the models' rules across fields (their validators).

A rule across fields (``step <= steps_total``, a final chunk and only it has a
``finish_reason``, ...) is code, not metadata, so the probes are found by trying: every value
each field of a hot-path message allows by itself (read off the model as ``test_bounds.py``
reads its limits: the values at them, each choice, null where the field has a None, and the
short strings of punctuation its pattern allows) is put into the model's example, alone and
two at a time; a record the model refuses only with an error about an object (a validator's,
not a field's) breaks a rule across fields. Each must be dead-lettered by the sink with the
model's own error, and each validator of the hot-path messages must be broken by a probe, so
that a new one is covered or fails here.
"""

import itertools
import re
import string
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from analytics.rows import TopicRows
from model_probes import (
    as_json,
    edited,
    fast_messages,
    fields_of,
    probes,
    record,
)
from schemas.codec import DecodeError, decode, encode
from schemas.examples import examples

#: Values longer than this (as JSON) are tried alone, not in pairs: a 500,000-character prompt
#: text beside each other value would cost seconds and find nothing more.
_PAIRED_BYTES = 300
#: The label of a string of punctuation, tried alone: a rule on one field's text (no
#: ``reply_to`` of ``.``) needs no partner.
_PUNCTUATION = "punct-"


def _punctuation(pattern: str, least: int) -> list[tuple[str, str]]:
    """The strings of one or two punctuation characters ``pattern`` allows (``.``, ``..``)."""
    marks = [c for c in string.punctuation if re.fullmatch(pattern, c)]
    return [(f"{_PUNCTUATION}{text}", text) for size in (1, 2) if size >= least
            for text in map("".join, itertools.product(marks, repeat=size))]


def _allowed(model: type[BaseModel], example: dict, table: str):
    """(path, label, value) of each value a field of ``model`` (or of a model within it) allows
    by itself."""
    for path, kind, label, value in probes(model, example, table):
        if kind == "at":
            yield path, label, value
    yield from _also_allowed(model, example)


def _also_allowed(model: type[BaseModel], example: dict):
    """What ``at_limits`` leaves out: null where a field has a None, each boolean, and short
    punctuation."""
    for name, f in fields_of(model).items():
        if f.nullable:
            yield (name,), "null", None
        if f.kind is bool:
            yield from (((name,), "true", True), ((name,), "false", False))
        if f.kind is str and "pattern" in f.limits:
            for label, text in _punctuation(f.limits["pattern"], f.limits.get("min_length", 0)):
                yield (name,), label, text
        inner = example.get(name)
        if isinstance(f.kind, type) and issubclass(f.kind, BaseModel) and inner is not None:
            for path, label, value in _also_allowed(f.kind, inner):
                yield (name, *path), label, value


def _at(data: Any, loc: tuple) -> Any:
    for part in loc:
        data = data[part]
    return data


def _broken_rules(model: type[BaseModel], data: dict) -> list[tuple[tuple, str]] | None:
    """(location, message) of each rule across fields ``data`` breaks, where the model refuses
    it for those alone (each error a validator's, about an object); None otherwise (valid, or
    a field of it out of its limits)."""
    try:
        model.model_validate_json(as_json(data), strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if all(e["type"] == "value_error" and isinstance(_at(data, e["loc"]), dict)
               for e in errors):
            return [(tuple(e["loc"]), e["msg"]) for e in errors]
    return None


def _tried(model: type[BaseModel], example: dict, table: str):
    """(edits, data) of each value allowed alone, and of each pair of them accepted alone."""
    accepted = []
    for path, label, value in _allowed(model, example, table):
        data = edited(example, path, value)
        yield ((path, label),), data
        if (len(as_json(value)) <= _PAIRED_BYTES and not label.startswith(_PUNCTUATION)
                and _broken_rules(model, data) is None):
            accepted.append((path, label, value))
    for (p1, l1, v1), (p2, l2, v2) in itertools.combinations(accepted, 2):
        if p1[:len(p2)] != p2 and p2[:len(p1)] != p1:
            yield ((p1, l1), (p2, l2)), edited(edited(example, p1, v1), p2, v2)


def _rule(message: str) -> str:
    """A validator's message without the values it quotes."""
    return re.sub(r"'[^']*'|\d+", "N", message)


def _all_probes():
    for spec, model, table in fast_messages():
        example = orjson.loads(encode(examples()[model]))
        for edits, data in _tried(model, example, table):
            broken = _broken_rules(model, data)
            if broken:
                named = "+".join(f"{'.'.join(map(str, p))}={label}" for p, label in edits)
                yield pytest.param(spec, model, broken, as_json(data),
                                   id=f"{spec.suffix}-{model.__name__}-{named}")


_PROBES = list(_all_probes())


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    for part in loc:
        model = fields_of(model)[part].kind
    return model


def _validated_models() -> dict[type[BaseModel], set[str]]:
    """The hot-path messages and the models within them that have validators, and theirs."""
    found, todo = {}, [model for _, model, _ in fast_messages()]
    while todo:
        model = todo.pop()
        decorators = model.__pydantic_decorators__
        names = set(decorators.model_validators) | set(decorators.field_validators)
        if names:
            found[model] = names
        todo += [f.kind for f in fields_of(model).values()
                 if isinstance(f.kind, type) and issubclass(f.kind, BaseModel)]
    return found


def test_the_validators_are_the_kinds_the_probes_find():
    """A field validator, or a model validator before its fields, would be no rule across
    fields this test can tell from a field's limits: a new one is a decision."""
    for model in _validated_models():
        decorators = model.__pydantic_decorators__
        assert not decorators.field_validators, model
        assert {d.info.mode for d in decorators.model_validators.values()} == {"after"}, model


def test_each_validator_of_a_hot_path_message_is_broken_by_a_probe():
    broken = {_model_at(model, loc) for _, model, rules, _ in (p.values for p in _PROBES)
              for loc, _ in rules}
    assert set(_validated_models()) <= broken


def test_the_rules_across_fields_are_the_known_ones():
    """Each rule the probes break, by model and message: a new rule shows here."""
    found = {(_model_at(model, loc).__name__, _rule(message))
             for _, model, rules, _ in (p.values for p in _PROBES) for loc, message in rules}
    assert found == {
        ("Dispatch", "Value error, resume_from_token (N) must be below max_tokens (N)"),
        ("InferenceRequest", "Value error, deadline_ms must not be before created_ms"),
        ("InferenceRequest", "Value error, prefix_hashes has N blocks but a prompt of N tokens "
                             "has at most N blocks of N"),
        ("InferenceRequest", "Value error, prompt_token_ids has N ids but prompt_tokens is N"),
        ("InferenceRequest", "Value error, reply_to N is not a legal topic name"),
        ("InferenceRequest", "Value error, step (N) must not exceed steps_total (N)"),
        ("InferenceRequest", "Value error, steps_total N needs a task_id (a request without "
                             "one is a task of one step)"),
        ("Queued", "Value error, step (N) must not exceed steps_total (N)"),
        ("ResponseChunk", "Value error, finish_reason is required on the final chunk and only "
                          "there"),
    }


@pytest.mark.parametrize("spec, model, rules, raw", _PROBES)
def test_a_record_breaking_a_rule_across_fields_is_never_stored_as_valid(spec, model, rules,
                                                                          raw):
    with pytest.raises(DecodeError) as refused:
        decode(spec, raw)
    got = TopicRows(spec).tables([record(spec, raw)])
    assert list(got) == ["dead_letters"], f"stored although {rules}"
    assert got["dead_letters"].column("error")[0].as_py() == refused.value.detail
