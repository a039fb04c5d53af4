"""Tests of schemas.codec: round trips of every model and how bad records are classified."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import Message
from schemas.codec import DecodeError, EncodeError, decode, encode
from schemas.errors import TerminalError
from schemas.events import DeadLetter
from schemas.limits import (
    MAX_DEAD_LETTER_RAW_BYTES,
    MAX_EPOCH_MS,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKEN_IDS,
    MAX_REASON_CHARS,
    MAX_RECORD_BYTES,
)
from schemas.requests import InferenceRequest
from schemas.topics import SPECS, TopicCatalog, TopicSpec, all_models

CATALOG = TopicCatalog()
REQUESTS = CATALOG.spec(CATALOG.requests)
RESPONSES = CATALOG.spec(CATALOG.responses)
DEADLETTER = CATALOG.spec(CATALOG.deadletter)


def specs_carrying(model: type[Message]) -> list[TopicSpec]:
    return [spec for spec in SPECS if model in spec.models]


def valid_request_doc(**overrides: object) -> dict:
    doc = {"type": "inference_request", "event_time_ms": 1, "request_id": "r-1",
           "prompt_tokens": 3, "max_tokens": 2, "created_ms": 1}
    doc.update(overrides)
    return doc


def decode_error(spec: TopicSpec, raw: bytes | None) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(spec, raw)
    return info.value


# --- round trips ----------------------------------------------------------------------------------


def test_every_catalog_model_has_an_example(examples: dict[type[Message], Message]) -> None:
    missing = [m.__name__ for m in all_models() if m not in examples]
    assert not missing, f"add an example to tests/unit/schemas/conftest.py for {missing}"
    extra = [m.__name__ for m in examples if m not in all_models()]
    assert not extra, f"examples of models no topic carries: {extra}"


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.__name__)
def test_every_model_round_trips_on_each_topic_that_carries_it(
    model: type[Message], examples: dict[type[Message], Message]
) -> None:
    message = examples[model]
    spec_list = specs_carrying(model)
    assert spec_list, f"{model.__name__} is carried by no topic"
    raw = encode(message)
    assert isinstance(raw, bytes)
    json.loads(raw)  # plain JSON on the wire
    for spec in spec_list:
        back = decode(spec, raw)
        assert type(back) is model
        assert back == message
        assert encode(back) == raw


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.__name__)
def test_the_projects_own_examples_cover_and_round_trip(model: type[Message]) -> None:
    """``schemas.examples`` (used by integration tests and benchmarks) must keep up too."""
    from schemas.examples import examples as project_examples

    message = project_examples().get(model)
    assert message is not None, f"schemas/examples.py has no example of {model.__name__}"
    for spec in specs_carrying(model):
        assert decode(spec, encode(message)) == message


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.__name__)
def test_a_model_is_rejected_by_topics_that_do_not_carry_it(
    model: type[Message], examples: dict[type[Message], Message]
) -> None:
    raw = encode(examples[model])
    for spec in SPECS:
        if model not in spec.models:
            assert decode_error(spec, raw).reason == "schema_violation", spec.suffix


def test_dispatch_topic_carries_cancellations_too(examples: dict[type[Message], Message]) -> None:
    from schemas.requests import CancelRequest

    spec = CATALOG.spec(CATALOG.dispatch)
    assert isinstance(decode(spec, encode(examples[CancelRequest])), CancelRequest)


# --- dead letters keep arbitrary bytes ------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", bytes(range(256)), b"\xff" * 1000, b"\xc3\x28\xa0\xa1", b'{"json": "ish"}',
     bytes(range(256)) * (MAX_DEAD_LETTER_RAW_BYTES // 256)],
    ids=["empty", "all-bytes", "ff-run", "bad-utf8", "json", "max-size"],
)
def test_dead_letter_round_trips_non_utf8_bytes(raw: bytes) -> None:
    letter = DeadLetter(event_time_ms=1, source_topic="governor.requests", partition=0, offset=3,
                        consumer="router", reason="undecodable", error="x", key=b"\x80\x81",
                        raw=raw, raw_size=len(raw))
    encoded = encode(letter)
    encoded.decode("utf-8")  # the bytes travel as base64 text
    back = decode(DEADLETTER, encoded)
    assert back.raw == raw
    assert back.key == b"\x80\x81"
    assert back == letter


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=4096), key=st.none() | st.binary(max_size=1024))
def test_dead_letter_round_trips_any_bytes(raw: bytes, key: bytes | None) -> None:
    letter = DeadLetter(event_time_ms=1, source_topic="t", partition=0, offset=0, consumer="c",
                        reason="schema_violation", error="e", key=key, raw=raw, raw_size=len(raw))
    back = decode(DEADLETTER, encode(letter))
    assert (back.raw, back.key) == (raw, key)


def test_dead_letter_raw_over_the_limit_is_an_oversized_field() -> None:
    doc = json.loads(encode(DeadLetter(event_time_ms=1, source_topic="t", partition=0, offset=0,
                                       consumer="c", reason="undecodable", error="", raw=b"",
                                       raw_size=0)))
    import base64

    doc["raw"] = base64.urlsafe_b64encode(b"x" * (MAX_DEAD_LETTER_RAW_BYTES + 1)).decode()
    err = decode_error(DEADLETTER, json.dumps(doc).encode())
    assert err.reason == "oversized_field"
    assert "raw" in err.detail


def test_dead_letter_with_invalid_base64_is_a_schema_violation() -> None:
    doc = json.loads(encode(DeadLetter(event_time_ms=1, source_topic="t", partition=0, offset=0,
                                       consumer="c", reason="undecodable", error="", raw=b"ab",
                                       raw_size=2)))
    doc["raw"] = "!!!not base64!!!"
    err = decode_error(DEADLETTER, json.dumps(doc).encode())
    assert err.reason == "schema_violation"
    assert "raw" in err.detail


# --- classification of bad records ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "undecodable"),
        (b"", "undecodable"),
        (b"\xff\xfe\x00\x01", "undecodable"),
        (b"not json at all", "undecodable"),
        (b'{"type": "inference_request"', "undecodable"),  # truncated
        (b"[" * 100_000, "undecodable"),  # nesting beyond the parser's limit
        (b"{" * 100_000, "undecodable"),
        (json.dumps(valid_request_doc(request_id="r")).encode()[:-1] + b"\xff}", "undecodable"),
        (b"null", "schema_violation"),
        (b"[]", "schema_violation"),
        (b"42", "schema_violation"),
        (b'"a string"', "schema_violation"),
        (b"{}", "schema_violation"),
        (json.dumps({"type": "no_such_type", "event_time_ms": 1}).encode(), "schema_violation"),
        (json.dumps(valid_request_doc(prompt_tokens=-1)).encode(), "schema_violation"),
        (json.dumps(valid_request_doc(surprise=1)).encode(), "schema_violation"),
        (json.dumps(valid_request_doc(prompt_tokens=10**400)).encode(), "schema_violation"),
        (json.dumps(valid_request_doc(request_id="r" * 129)).encode(), "oversized_field"),
        (json.dumps(valid_request_doc(prompt_text="x" * (MAX_PROMPT_CHARS + 1))).encode(),
         "oversized_field"),
        (json.dumps(valid_request_doc(prefix_hashes=[1] * 8193, prompt_tokens=10**6)).encode(),
         "oversized_field"),
        (b" " * (MAX_RECORD_BYTES + 1), "oversized_record"),
        (json.dumps(valid_request_doc(prompt_text="x" * MAX_RECORD_BYTES)).encode(),
         "oversized_record"),
    ],
    ids=["none", "empty", "binary", "text", "truncated", "deep-arrays", "deep-objects",
         "bad-utf8-in-json", "json-null", "json-array", "json-number", "json-string",
         "empty-object", "unknown-type", "negative-count", "extra-field", "huge-int",
         "long-id", "long-prompt", "too-many-hashes", "oversized-blank", "oversized-json"],
)
def test_bad_records_are_classified(raw: bytes | None, reason: str) -> None:
    err = decode_error(REQUESTS, raw)
    assert err.reason == reason
    assert isinstance(err, TerminalError)
    assert str(err).startswith(f"{reason}: ")
    assert err.detail


@pytest.mark.parametrize(("field", "value", "message"), [
    ("prompt_tokens", "12", "Input should be a valid integer"),
    ("max_tokens", 16.0, "Input should be a valid integer"),
    ("priority", True, "Input should be a valid integer"),
    ("request_id", 7, "Input should be a valid string"),
])
def test_a_value_of_another_json_type_is_not_coerced(field: str, value, message: str) -> None:
    err = decode_error(REQUESTS, json.dumps(valid_request_doc(**{field: value})).encode())
    assert err.reason == "schema_violation"
    assert err.detail == f"inference_request.{field}: {message}"


def test_a_float_field_takes_a_json_integer() -> None:
    doc = valid_request_doc(ttft_slo_s=2)
    assert decode(REQUESTS, json.dumps(doc).encode()).ttft_slo_s == 2.0


def test_unknown_type_on_a_single_model_topic_is_a_schema_violation() -> None:
    err = decode_error(RESPONSES, json.dumps({"type": "inference_request"}).encode())
    assert err.reason == "schema_violation"
    assert "type" in err.detail


@pytest.mark.parametrize(("doc", "detail"), [
    ({"request_id": "r-1", "max_tokens": 5},
     "type: Field required (one of cancel_request, inference_request)"),
    (valid_request_doc(type="request"),
     "type: 'request' is no message of this topic (one of cancel_request, inference_request)"),
])
def test_a_record_without_a_valid_type_names_the_field(doc: dict, detail: str) -> None:
    """As any other field is named: before 6 Dec its client read "<record>: Unable to extract
    tag using discriminator 'type'"."""
    err = decode_error(REQUESTS, json.dumps(doc).encode())
    assert err.reason == "schema_violation"
    assert err.detail == detail


def test_oversized_field_names_the_field() -> None:
    err = decode_error(REQUESTS, json.dumps(valid_request_doc(tenant="t" * 65)).encode())
    assert err.reason == "oversized_field"
    assert "tenant" in err.detail


def test_schema_violation_detail_names_the_field_and_counts_the_rest() -> None:
    doc = {"type": "inference_request", "surprise": 1}  # five fields missing, one extra
    err = decode_error(REQUESTS, json.dumps(doc).encode())
    assert err.reason == "schema_violation"
    assert "request_id" in err.detail
    assert "and 1 more" in err.detail


def test_decode_error_detail_is_bounded() -> None:
    err = DecodeError("schema_violation", "x" * (MAX_REASON_CHARS * 3))
    assert len(err.detail) == MAX_REASON_CHARS
    assert err.reason == "schema_violation"


def test_record_of_exactly_the_limit_is_not_oversized() -> None:
    doc = json.dumps(valid_request_doc()).encode()
    padded = doc[:-1] + b" " * (MAX_RECORD_BYTES - len(doc)) + b"}"
    assert len(padded) == MAX_RECORD_BYTES
    assert isinstance(decode(REQUESTS, padded), InferenceRequest)


# --- encode limits --------------------------------------------------------------------------------


def test_encode_refuses_a_message_over_the_record_limit() -> None:
    # Every field is within its own limit, but 4-byte UTF-8 characters and 10-digit token ids
    # together make the JSON well over MAX_RECORD_BYTES.
    request = InferenceRequest(
        event_time_ms=1, created_ms=1, request_id="big", max_tokens=1,
        prompt_tokens=MAX_PROMPT_TOKEN_IDS,
        prompt_text="\U0001f600" * MAX_PROMPT_CHARS,
        prompt_token_ids=[2**31 - 1] * MAX_PROMPT_TOKEN_IDS,
    )
    assert len(request.model_dump_json().encode()) > MAX_RECORD_BYTES
    with pytest.raises(EncodeError, match="InferenceRequest encodes to \\d+ bytes") as info:
        encode(request)
    assert isinstance(info.value, TerminalError)


def test_encode_accepts_a_large_message_under_the_limit() -> None:
    request = InferenceRequest(event_time_ms=1, created_ms=1, request_id="big", max_tokens=1,
                               prompt_tokens=0, prompt_text="a" * MAX_PROMPT_CHARS)
    raw = encode(request)
    assert MAX_PROMPT_CHARS < len(raw) <= MAX_RECORD_BYTES
    assert decode(REQUESTS, raw) == request



TELEMETRY = CATALOG.spec(CATALOG.telemetry)
_EVENT = b'"event_time_ms":1700000000000,"request_id":"r1","worker_id":"w1"'


@pytest.mark.parametrize(("raw", "detail"), [
    (b'{"type":"started",' + _EVENT + b',"attempt":18446744073709551616}',
     "started.attempt: Input should be less than or equal to 1000"),
    (b'{"type":"completed",' + _EVENT + b',"prompt_tokens":1,"output_tokens":1,"e2e_s":1e306}',
     f"completed.e2e_s: Input should be less than or equal to {MAX_EPOCH_MS // 1000}"),
    (b'{"type":"queued","event_time_ms":1,"request_id":"r2","prompt_tokens":1,"max_tokens":1,'
     b'"created_ms":1,"step":5,"steps_total":99999999999999999999999}',
     "queued.steps_total: Input should be less than or equal to 10000"),
])
def test_telemetry_a_consumer_cannot_process_is_dead_lettered_naming_field_and_limit(
        raw: bytes, detail: str) -> None:
    """Schema-valid before 5 Dec: an attempt of 2**64 decoded, then orjson refused to encode it
    in the streams' repartition records and stopped the agent; e2e_s = 1e306 overflowed."""
    err = decode_error(TELEMETRY, raw)
    assert err.reason == "schema_violation"
    assert err.detail.startswith(detail), err.detail
