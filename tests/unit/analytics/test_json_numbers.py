"""A number field takes a JSON number of its own kind, and nothing Python compares equal to one.

Python takes ``True`` for 1 and ``1.0`` for 1, and so did two readers: pydantic's ``Literal``
of integers (``SleepWorker.level`` took ``true`` for 1, although the codec decodes strictly),
and Arrow, building the sink's hot-path columns (``true`` landed as 1.0 in a float column such
as ``e2e_s``, ``2.0`` as 2 in an integer one, and ``"schema_version": true`` passed as 1).

For every message model of the topic catalog, every number field of it and of the models
within it (an int, a float or a ``Literal`` of ints, as their annotations say) is given
``true``, ``false`` and, for an integer, the same value as a float: the codec must refuse the
record naming the field, and the sink must dead-letter it naming the field, those its rows do
not carry too (``not_in_the_row.py``).
The live configuration is read the same way: ``governor config set`` of each number setting
to ``true`` is refused naming the setting.
"""

import json
import types
from collections import namedtuple
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from analytics.rows import TopicRows
from schemas.codec import DecodeError, decode, encode
from schemas.config import GovernorConfig
from schemas.examples import examples
from schemas.topics import SPECS, TopicCatalog

CATALOG = TopicCatalog("t")
_Record = namedtuple("_Record", "topic partition offset timestamp key value")  # as Kafka gives


def _unwrapped(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated`` metadata and its ``None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _number_kind(annotation: Any) -> type | None:
    """int or float where ``annotation`` is a number (a ``Literal`` of ints: int), else None."""
    bare = _unwrapped(annotation)
    if bare in (int, float):
        return bare
    if get_origin(bare) is Literal and all(type(c) is int for c in get_args(bare)):
        return int
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _numbers(model: type[BaseModel], data: dict, path: tuple = ()):
    """(path, kind) of each number field of ``model`` and of the models within it, where
    ``data`` (the example as JSON data) has a list item or a map entry for the ones within
    lists and maps."""
    for name, info in model.model_fields.items():
        kind = _number_kind(info.annotation)
        if kind is not None:
            yield (*path, name), kind
            continue
        bare, value = _unwrapped(info.annotation), data.get(name)
        if get_origin(bare) in (list, dict) and value:
            key = 0 if isinstance(value, list) else next(iter(value))
            inner = get_args(bare)[-1]
            if _number_kind(inner) is not None:
                yield (*path, name, key), _number_kind(inner)
            elif _is_model(_unwrapped(inner)):
                yield from _numbers(_unwrapped(inner), value[key], (*path, name, key))
        elif _is_model(bare) and value is not None:
            yield from _numbers(bare, value, (*path, name))


def _at(data: Any, path: tuple) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else data[part]
        if data is None:
            return None
    return data


def _edited(data: Any, path: tuple, value: Any) -> Any:
    head, *rest = path
    copy = list(data) if isinstance(data, list) else dict(data)
    copy[head] = _edited(data[head], tuple(rest), value) if rest else value
    return copy


def _wrong_numbers(kind: type, now: Any) -> list[tuple[str, Any]]:
    """(label, value) of what a field of ``kind`` (holding ``now``) must refuse."""
    got = [("true", True), ("false", False)]
    if kind is int:
        got.append(("float", float(now if isinstance(now, int) else 1)))
    return got


def _probes():
    for spec in SPECS:
        for model in spec.models:
            data = orjson.loads(encode(examples()[model]))
            for path, kind in _numbers(model, data):
                for label, value in _wrong_numbers(kind, _at(data, path)):
                    dotted = ".".join(map(str, path))
                    raw = json.dumps(_edited(data, path, value), separators=(",", ":")).encode()
                    yield pytest.param(spec, model, dotted, raw,
                                       id=f"{spec.suffix}-{model.__name__}-{dotted}-{label}")


_PROBES = list(_probes())


def test_the_probes_reach_every_kind_of_number():
    """The walk finds the fields this test is about (a change of the models that hid them from
    it would make every other test here pass unseen)."""
    fields = {p.values[2] for p in _PROBES}
    assert {"level", "e2e_s", "ttft_s", "retry_after_s", "ttft_slo_s", "schema_version",
            "request.ttft_slo_s", "limits.acme.priority", "weights.h100@llama-3-8b",
            "tokens.0", "reply_progress.0.tokens_sent"} <= fields


@pytest.mark.parametrize("spec, model, field, raw", _PROBES)
def test_the_codec_refuses_another_kind_of_number(spec, model, field, raw):
    with pytest.raises(DecodeError) as refused:
        decode(spec, raw)
    assert f"{field}: " in refused.value.detail


@pytest.mark.parametrize("spec, model, field, raw", _PROBES)
def test_the_sink_dead_letters_another_kind_of_number(spec, model, field, raw):
    record = _Record(CATALOG.name(spec.suffix), 1, 40, 1_700_000_000_000, b"k", raw)
    got = TopicRows(spec).tables([record])
    assert list(got) == ["dead_letters"], f"{field} stored as a number of its kind"
    assert f"{field}: " in got["dead_letters"].column("error")[0].as_py()


def _config_numbers():
    """(dotted key, kind) of every number setting, with an entry in each map."""
    config = GovernorConfig().with_setting(
        "tenants.acme", {"requests_per_s": 10.0, "tokens_per_s": 1000.0}).with_setting(
        "router_weights.kv", 2.0).with_setting(
        "autoscaler.pools.h100@m", {"min_replicas": 1, "max_replicas": 2}).with_setting(
        "models.m", {"params_b": 8.0, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                     "head_dim": 128, "hidden_size": 4096, "intermediate_size": 14336,
                     "vocab_size": 128256, "max_model_len": 8192})
    data = config.model_dump(mode="json")
    for path, kind in _numbers(GovernorConfig, data):
        for label, value in _wrong_numbers(kind, _at(data, path)):
            key = ".".join(map(str, path))
            yield pytest.param(config, key, value, id=f"{key}-{label}")


_CONFIG_NUMBERS = list(_config_numbers())


def test_the_config_probes_reach_each_map():
    keys = {p.values[1] for p in _CONFIG_NUMBERS}
    assert {"slo.ttft_slo_s", "tenants.acme.priority", "gpu_prices_usd_per_hour.a100",
            "router_weights.kv", "autoscaler.pools.h100@m.min_replicas",
            "models.m.n_layers"} <= keys


@pytest.mark.parametrize("config, key, value", _CONFIG_NUMBERS)
def test_a_setting_refuses_another_kind_of_number(config, key, value):
    with pytest.raises(ValidationError) as refused:
        config.with_setting(key, value)
    assert key in str(refused.value)
