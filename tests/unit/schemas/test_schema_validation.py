"""Validation limits of the message models (schemas.requests, events, commands, base, limits).

Each bad value must raise a pydantic ValidationError that names the offending field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from schemas import commands, events
from schemas.base import SCHEMA_VERSION, Message
from schemas.limits import (
    MAX_ATTEMPTS,
    MAX_BLOCK_SIZE,
    MAX_CHUNK_TOKENS,
    MAX_ELAPSED_S,
    MAX_EPOCH_MS,
    MAX_ID_CHARS,
    MAX_LATENCY_S,
    MAX_MAP_ENTRIES,
    MAX_NAME_CHARS,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_REASON_CHARS,
    MAX_SEQUENCES,
    MAX_TASK_STEPS,
)
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import all_models

from schema_examples import T0, make_request


def rebuild(message: Message, **changes: Any) -> Message:
    """A validated copy of ``message`` with ``changes`` (model_copy would not validate)."""
    data = message.model_dump()
    data.update(changes)
    return type(message).model_validate(data)


def assert_rejected(build: Any, field: str) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        build()
    assert field in str(info.value), f"error does not name {field!r}: {info.value}"
    return info.value


# --- InferenceRequest -----------------------------------------------------------------------------

REQUEST_FIELD_CASES = [
    ("prompt_tokens", -1),
    ("prompt_tokens", MAX_PROMPT_TOKENS + 1),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", MAX_OUTPUT_TOKENS + 1),
    ("request_id", "r" * (MAX_ID_CHARS + 1)),
    ("request_id", ""),
    ("request_id", "has space"),
    ("request_id", "semi;colon"),
    ("request_id", "new\nline"),
    ("request_id", "trailing-newline\n"),
    ("request_id", "ünïcode"),
    ("task_id", "t" * (MAX_ID_CHARS + 1)),
    ("task_id", "bad id"),
    ("tenant", "t" * (MAX_NAME_CHARS + 1)),
    ("tenant", "a=b"),  # '=' is allowed in ids, not in names
    ("model", ""),
    ("priority", -1),
    ("priority", 10),
    ("step", 0),
    ("steps_total", 10_001),
    ("block_size", 0),
    ("block_size", MAX_BLOCK_SIZE + 1),
    ("prompt_text", "x" * (MAX_PROMPT_CHARS + 1)),
    ("prompt_token_ids", [-1] * 40),
    ("prompt_token_ids", [2**31] * 40),
    ("prefix_hashes", [2**64]),
    ("prefix_hashes", [-(2**63) - 1]),
    ("ttft_slo_s", 0),
    ("ttft_slo_s", -1.0),
    ("ttft_slo_s", MAX_LATENCY_S + 1),
    ("ttft_slo_s", math.nan),
    ("ttft_slo_s", math.inf),
    ("ttft_slo_s", -math.inf),
    ("created_ms", -1),
    ("created_ms", MAX_EPOCH_MS + 1),
    ("event_time_ms", -1),
    ("reply_to", "t" * 250),
    ("reply_to", "no such topic!"),  # not a legal Kafka topic name: it stopped every worker
    ("reply_to", ""),
    ("schema_version", 0),
    ("schema_version", SCHEMA_VERSION + 1),
    ("type", "dispatch"),
]


@pytest.mark.parametrize(("field", "value"), REQUEST_FIELD_CASES,
                         ids=[f"{f}={str(v)[:12]!r}" for f, v in REQUEST_FIELD_CASES])
def test_request_field_limits(field: str, value: Any) -> None:
    assert_rejected(lambda: make_request(**{field: value}), field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_tokens", MAX_PROMPT_TOKENS),
        ("max_tokens", 1),
        ("max_tokens", MAX_OUTPUT_TOKENS),
        ("request_id", "a" * MAX_ID_CHARS),
        ("request_id", "A-z_0.9:/@+="),
        ("tenant", "n" * MAX_NAME_CHARS),
        ("priority", 0),
        ("priority", 9),
        ("block_size", MAX_BLOCK_SIZE),
        ("ttft_slo_s", MAX_LATENCY_S),
        ("created_ms", 0),
        ("deadline_ms", T0),  # a deadline equal to creation is allowed
        ("event_time_ms", MAX_EPOCH_MS),
        ("prompt_text", "x" * MAX_PROMPT_CHARS),
    ],
)
def test_request_values_at_the_limits_are_accepted(field: str, value: Any) -> None:
    extra: dict[str, Any] = {}
    if field == "prompt_tokens":
        extra = {"prompt_token_ids": None}
    if field == "block_size":
        extra = {"prefix_hashes": [1]}
    assert getattr(make_request(**{field: value}, **extra), field) == value


def test_request_step_after_steps_total_is_rejected() -> None:
    assert_rejected(lambda: make_request(step=4, steps_total=3), "step (4)")
    assert make_request(step=3, steps_total=3).step == 3


@pytest.mark.parametrize("ids", [39, 41, 0])
def test_request_token_ids_must_match_prompt_tokens(ids: int) -> None:
    err = assert_rejected(lambda: make_request(prompt_token_ids=list(range(ids))),
                          "prompt_token_ids")
    assert f"has {ids} ids but prompt_tokens is 40" in str(err)


def test_request_without_token_ids_needs_no_match() -> None:
    assert make_request(prompt_token_ids=None, prompt_tokens=7,
                        prefix_hashes=[]).prompt_tokens == 7


@pytest.mark.parametrize(
    ("prompt_tokens", "block_size", "hashes", "ok"),
    [
        (40, 16, 3, True),   # ceil(40 / 16) = 3
        (40, 16, 4, False),
        (32, 16, 2, True),
        (32, 16, 3, False),
        (0, 16, 0, True),
        (0, 16, 1, False),
        (1, 4096, 1, True),
        (1, 4096, 2, False),
    ],
)
def test_request_prefix_hashes_must_fit_the_prompt(
    prompt_tokens: int, block_size: int, hashes: int, ok: bool
) -> None:
    def build() -> InferenceRequest:
        return make_request(prompt_tokens=prompt_tokens, prompt_token_ids=None,
                            block_size=block_size, prefix_hashes=list(range(hashes)))

    if ok:
        assert len(build().prefix_hashes) == hashes
    else:
        assert_rejected(build, "prefix_hashes")


def test_request_deadline_before_creation_is_rejected() -> None:
    assert_rejected(lambda: make_request(deadline_ms=T0 - 1), "deadline_ms")


def test_request_extra_field_is_rejected() -> None:
    assert_rejected(lambda: make_request(priority_boost=3), "priority_boost")


def test_messages_are_frozen() -> None:
    request = make_request()
    with pytest.raises(ValidationError, match="frozen"):
        request.max_tokens = 5  # type: ignore[misc]


def test_effective_task_id_falls_back_to_request_id() -> None:
    assert make_request(task_id="t-1").effective_task_id == "t-1"
    assert make_request(task_id=None, step=1, steps_total=1).effective_task_id == "req-0001"


def test_a_request_of_several_steps_needs_a_task_id() -> None:
    """Without one a request is a task of one step: a later step of nothing was served, and its
    task admission booked work for a task no other step could join (before 6 Dec)."""
    with pytest.raises(ValidationError, match="steps_total 3 needs a task_id"):
        make_request(task_id=None)


# --- every model: base fields, extra fields, NaN --------------------------------------------------


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.__name__)
@pytest.mark.parametrize(
    ("field", "value"),
    [("schema_version", 0), ("schema_version", 2), ("event_time_ms", -1),
     ("event_time_ms", MAX_EPOCH_MS + 1), ("unexpected_field", 1)],
)
def test_every_model_checks_the_base_fields(
    model: type[Message], field: str, value: Any, examples: dict[type[Message], Message]
) -> None:
    assert_rejected(lambda: rebuild(examples[model], **{field: value}), field)


def _mentions_float(annotation: Any) -> bool:
    """Whether a field's type holds a float anywhere (optional, in a map, in a nested model)."""
    if annotation is float:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_mentions_float(f.annotation) for f in annotation.model_fields.values())
    return any(_mentions_float(arg) for arg in get_args(annotation))


def _float_fields() -> list[tuple[type[Message], str]]:
    """Every (model, top-level field) whose type holds a float: read from the models, not
    from the examples, so a float field added to a model is in the NaN test at once."""
    return [(model, name) for model in all_models()
            for name, field in model.model_fields.items() if _mentions_float(field.annotation)]


def _fill_floats(annotation: Any, value: Any) -> Any:
    """``value`` with every float its type allows set where the example left it empty: an
    optional float that is None gets 1.0, an empty map of floats one entry, nested models
    the same, so that the NaN test has a float to replace."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if value is None and annotation is not float and len(args) == 1 and args[0] is not float:
        annotation = args[0]  # Optional[X]: fill as X
    if annotation is float or (value is None and float in args):
        return 1.0 if value is None else value
    if get_origin(annotation) is Annotated:
        return _fill_floats(args[0], value)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
        return {name: _fill_floats(field.annotation, value.get(name))
                for name, field in annotation.model_fields.items() if name in value}
    if get_origin(annotation) is dict and isinstance(value, dict) and _mentions_float(args[1]):
        return ({k: _fill_floats(args[1], v) for k, v in value.items()} if value
                else {"a": _fill_floats(args[1], None)})
    return value


@pytest.mark.parametrize(("model", "field"), _float_fields(),
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_no_model_accepts_non_finite_floats(
    model: type[Message], field: str, bad: float, examples: dict[type[Message], Message]
) -> None:
    """Every float a model carries (at top level, in maps, in nested models) rejects NaN/inf."""
    data = examples[model].model_dump()
    data[field] = _fill_floats(model.model_fields[field].annotation, data[field])
    model.model_validate(data)  # the filled-in example is valid as it is
    paths = [p for p in _float_paths(data) if p[0] == field]
    assert paths, f"no float to replace in {model.__name__}.{field}"
    for path in paths:
        changed = _replace(data, path, bad)
        assert_rejected(lambda: model.model_validate(changed), field)


def _float_paths(node: Any, prefix: tuple = ()) -> Any:
    if isinstance(node, float):
        yield prefix
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _float_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _float_paths(value, (*prefix, index))


def _replace(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    if isinstance(node, dict):
        return {**node, path[0]: _replace(node[path[0]], path[1:], value)}
    copy = list(node)
    copy[path[0]] = _replace(copy[path[0]], path[1:], value)
    return copy


def test_the_nan_test_covers_the_optional_floats() -> None:
    """Floats the examples leave empty (None) are in the NaN test too."""
    fields = {(m.__name__, f) for m, f in _float_fields()}
    assert {("Queued", "ttft_slo_s"), ("WorkerStatus", "itl_ms"), ("Dispatch", "request"),
            ("SignalSnapshot", "values"), ("SetAdmissionLimits", "limits")} <= fields


# --- Dispatch and ResponseChunk cross-field rules -------------------------------------------------


@pytest.mark.parametrize(("resume", "ok"), [(0, True), (63, True), (64, False), (65, False)])
def test_dispatch_resume_must_be_below_max_tokens(resume: int, ok: bool) -> None:
    def build() -> Dispatch:
        return Dispatch(event_time_ms=T0, request=make_request(max_tokens=64), worker_id="w",
                        slot=0, resume_from_token=resume)

    if ok:
        assert build().resume_from_token == resume
    else:
        assert_rejected(build, "resume_from_token")


@pytest.mark.parametrize(("field", "value"),
                         [("slot", -1), ("slot", 65_536), ("attempt", 0), ("attempt", 1001),
                          ("resume_from_token", -1), ("worker_id", "w w")])
def test_dispatch_field_limits(field: str, value: Any) -> None:
    fields = dict(event_time_ms=T0, request=make_request(), worker_id="w", slot=0)
    fields[field] = value
    assert_rejected(lambda: Dispatch(**fields), field)


def test_dispatch_rejects_an_invalid_inner_request() -> None:
    inner = make_request().model_dump()
    inner["max_tokens"] = 0
    assert_rejected(lambda: Dispatch(event_time_ms=T0, request=inner, worker_id="w", slot=0),
                    "request.max_tokens")


@pytest.mark.parametrize(
    ("final", "finish_reason", "ok"),
    [(False, None, True), (True, "stop", True), (True, "length", True), (True, "abort", True),
     (True, "error", True), (True, None, False), (False, "stop", False), (True, "eos", False)],
)
def test_chunk_final_and_finish_reason_go_together(
    final: bool, finish_reason: str | None, ok: bool
) -> None:
    def build() -> ResponseChunk:
        return ResponseChunk(event_time_ms=T0, request_id="r", worker_id="w", token_offset=0,
                             tokens=[1], final=final, finish_reason=finish_reason)

    if ok:
        assert build().final is final
    else:
        assert_rejected(build, "finish_reason")


@pytest.mark.parametrize(
    ("field", "value"),
    [("tokens", [1] * (MAX_CHUNK_TOKENS + 1)), ("tokens", [-1]), ("token_offset", -1),
     ("token_offset", MAX_OUTPUT_TOKENS + 1), ("text", "x" * (MAX_CHUNK_TOKENS * 64 + 1))],
)
def test_chunk_field_limits(field: str, value: Any) -> None:
    fields: dict[str, Any] = dict(event_time_ms=T0, request_id="r", worker_id="w",
                                  token_offset=0, tokens=[1])
    fields[field] = value
    assert_rejected(lambda: ResponseChunk(**fields), field)


def test_cancel_reason_is_bounded() -> None:
    assert_rejected(lambda: CancelRequest(event_time_ms=T0, request_id="r",
                                          reason="x" * (MAX_REASON_CHARS + 1)), "reason")


# --- events ---------------------------------------------------------------------------------------

EVENT_CASES = [
    (events.Queued, "prompt_tokens", -1),
    (events.Queued, "max_tokens", 0),
    (events.Queued, "priority", 10),
    (events.FirstToken, "ttft_s", -0.001),
    (events.Preempted, "tokens_done", MAX_OUTPUT_TOKENS + 1),
    (events.Completed, "output_tokens", -1),
    (events.Completed, "cached_tokens", MAX_PROMPT_TOKENS + 1),
    (events.Completed, "finish_reason", "abort"),
    (events.Completed, "e2e_s", -1.0),
    (events.Failed, "reason", "bored"),
    (events.Failed, "detail", "x" * (MAX_REASON_CHARS + 1)),
    (events.Rejected, "reason", "worker_lost"),
    (events.Rejected, "retry_after_s", 86_401),
    (events.Started, "attempt", 0),
    (events.WorkerStatus, "slot", 65_536),
    (events.WorkerStatus, "state", "dead"),
    (events.WorkerStatus, "models_loaded", ["m"] * 65),
    (events.WorkerStatus, "kv_blocks_free", -1),
    (events.WorkerStatus, "running", 2**53 + 1),
    # the analytics' 32-bit columns (before 5 Dec only the sink refused 2**53, naming no field)
    (events.WorkerStatus, "running", MAX_SEQUENCES + 1),
    (events.WorkerStatus, "waiting", MAX_SEQUENCES + 1),
    (events.KvBlocksStored, "block_size", 0),
    (events.KvBlocksStored, "block_hashes", [2**64]),
    (events.KvBlocksEvicted, "block_hashes", [0] * 8193),
    (events.SignalSnapshot, "window_s", 0),
    (events.SignalSnapshot, "scope", "galaxy"),
    (events.SignalSnapshot, "values", {f"k{i}": 1.0 for i in range(MAX_MAP_ENTRIES + 1)}),
    (events.SignalSnapshot, "values", {"bad key": 1.0}),
    (events.DeadLetter, "source_topic", "t" * 250),
    (events.DeadLetter, "partition", -1),
    (events.DeadLetter, "reason", "no_reason"),
    (events.DeadLetter, "key", b"k" * 1025),
    (events.DeadLetter, "raw_size", -1),
    # schema-valid values that used to crash a consumer (orjson refuses integers over 64 bits;
    # int(e2e_s * 1000) of 1e306 overflowed): each bound is the one its peers already had
    (events.Started, "attempt", MAX_ATTEMPTS + 1),
    (events.Started, "attempt", 2**64),
    (events.FirstToken, "attempt", MAX_ATTEMPTS + 1),
    (events.Requeued, "attempt", MAX_ATTEMPTS + 1),
    (events.Completed, "attempt", MAX_ATTEMPTS + 1),
    (events.WorkerStatus, "reply_progress", [{"request_id": "r", "attempt": MAX_ATTEMPTS + 1,
                                              "tokens_sent": 1}]),
    (events.Queued, "step", MAX_TASK_STEPS + 1),
    (events.Queued, "steps_total", MAX_TASK_STEPS + 1),
    (events.Queued, "step", 4),  # the example is step 2 of 3
    (events.Queued, "ttft_slo_s", 0),
    (events.FirstToken, "ttft_s", MAX_ELAPSED_S * 1.01),
    (events.Completed, "e2e_s", 1e306),
    (events.ConfigApplied, "config_offset", 2**63),
    (events.ConfigRejected, "config_offset", 2**63),
    (events.DeadLetter, "offset", 2**63),
    (events.DeadLetter, "partition", 2**31),
    (events.DeadLetter, "raw_size", 2**64),
]


@pytest.mark.parametrize(("model", "field", "value"), EVENT_CASES,
                         ids=[f"{m.__name__}.{f}" for m, f, _ in EVENT_CASES])
def test_event_field_limits(model: type[Message], field: str, value: Any,
                            examples: dict[type[Message], Message]) -> None:
    assert_rejected(lambda: rebuild(examples[model], **{field: value}), field)


@pytest.mark.parametrize(("model", "field", "value"), [
    (events.Started, "attempt", MAX_ATTEMPTS), (events.Queued, "step", MAX_TASK_STEPS),
    # workers measure latencies from the client's created_ms, any valid epoch (0 included)
    (events.Completed, "e2e_s", MAX_EPOCH_MS / 1000),
    (events.FirstToken, "ttft_s", MAX_EPOCH_MS / 1000)])
def test_event_values_at_the_limits_are_accepted(model: type[Message], field: str, value: Any,
                                                 examples: dict[type[Message], Message]) -> None:
    changes = {field: value, **({"steps_total": value} if field == "step" else {})}
    assert getattr(rebuild(examples[model], **changes), field) == value


def _bounds(field: str) -> set[tuple[str, object]]:
    """(model, maximum) of every property called ``field`` in every exported schema."""
    found = set()
    for model in all_models():
        doc = model.model_json_schema()
        for where, props in [(model.__name__, doc.get("properties", {}))] + [
                (f"{model.__name__}.{name}", d.get("properties", {}))
                for name, d in doc.get("$defs", {}).items()]:
            if field in props:
                options = props[field].get("anyOf", [props[field]])
                found |= {(where, o.get("maximum")) for o in options if o.get("type") == "integer"}
    return found


@pytest.mark.parametrize(("field", "limit"), [("attempt", MAX_ATTEMPTS), ("step", MAX_TASK_STEPS),
                                              ("steps_total", MAX_TASK_STEPS)])
def test_every_model_bounds_a_field_the_same_way(field: str, limit: int) -> None:
    bounds = _bounds(field)
    assert len(bounds) >= 2 and {maximum for _, maximum in bounds} == {limit}, bounds


def _maps(node: Any, where: str):
    """(where, schema) of each map (an object of named entries) in an exported JSON schema."""
    if isinstance(node, dict):
        if node.get("type") == "object" and ("additionalProperties" in node
                                             or "patternProperties" in node):
            yield where, node
        for name, inner in node.items():
            yield from _maps(inner, f"{where}.{name}")
    elif isinstance(node, list):
        for index, inner in enumerate(node):
            yield from _maps(inner, f"{where}[{index}]")


def test_every_map_of_every_model_bounds_its_entries_and_their_names() -> None:
    """Read off the exported schemas, so that a new map field is bounded too (before 6 Dec
    ``ConfigSet.entries_since_ms`` took any number of entries, named by no rule the schema said)."""
    unbounded = [where for model in all_models()
                 for where, node in _maps(model.model_json_schema(), model.__name__)
                 if node.get("additionalProperties") is not False
                 and ("maxProperties" not in node
                      or "maxLength" not in node.get("propertyNames", {}))]
    assert unbounded == []


# --- commands -------------------------------------------------------------------------------------

COMMAND_CASES = [
    (commands.SetRoutingWeights, "weights", {"h100": -0.1}),
    (commands.SetRoutingWeights, "weights", {"h100": 1e7}),
    (commands.SetRoutingWeights, "weights", {f"p{i}": 1.0 for i in range(MAX_MAP_ENTRIES + 1)}),
    (commands.SetAdmissionLimits, "limits", {"acme": {"requests_per_s": 0, "tokens_per_s": 1}}),
    (commands.SetAdmissionLimits, "limits", {"acme": {"requests_per_s": 1, "tokens_per_s": 1,
                                                      "priority": 10}}),
    (commands.SetAdmissionLimits, "limits", {"acme": {"requests_per_s": 1, "tokens_per_s": 1,
                                                      "surprise": 1}}),
    (commands.SetLoadShedLevel, "min_value", -1),
    (commands.SetBreakerState, "state", "ajar"),
    (commands.SetRetryBudget, "ratio", 1.01),
    (commands.ScalePool, "replicas", -1),
    (commands.ScalePool, "replicas", 4097),
    (commands.SleepWorker, "level", 3),
    (commands.LoadModel, "model", "m" * 65),
    (commands.DrainWorker, "command_id", ""),
    (commands.DrainWorker, "reason", "x" * (MAX_REASON_CHARS + 1)),
    (commands.DrainWorker, "issued_by", "two words"),
]


@pytest.mark.parametrize(("model", "field", "value"), COMMAND_CASES,
                         ids=[f"{m.__name__}.{f}" for m, f, _ in COMMAND_CASES])
def test_command_field_limits(model: type[Message], field: str, value: Any,
                              examples: dict[type[Message], Message]) -> None:
    assert_rejected(lambda: rebuild(examples[model], **{field: value}), field)


def test_tenant_limit_defaults() -> None:
    limit = commands.TenantLimit(requests_per_s=1, tokens_per_s=2)
    assert (limit.burst_s, limit.priority) == (2.0, 0)


def test_command_defaults() -> None:
    drain = commands.DrainWorker(event_time_ms=T0, command_id="c", worker_id="w")
    assert (drain.issued_by, drain.reason, drain.schema_version) == ("operator", "", SCHEMA_VERSION)
