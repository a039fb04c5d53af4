"""Property tests of schemas.codec.decode on hostile input: it returns a Message or raises
DecodeError, for every topic, and never anything else."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.base import Message
from schemas.codec import DecodeError, EncodeError, decode, encode
from schemas.limits import MAX_RECORD_BYTES
from schemas.topics import SPECS, TopicSpec, all_models

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TOPICS = st.sampled_from(SPECS)
TYPES = sorted({t for spec in SPECS for t in spec.types})

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50)
    | st.sampled_from(TYPES)
)
json_docs = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=20) | st.sampled_from(["type", "request_id", "tokens"]),
                      children, max_size=6),
    max_leaves=40,
)


def assert_decodes_or_rejects(spec: TopicSpec, raw: bytes | None) -> Message | None:
    """The codec contract: a Message of the topic, or a DecodeError with a known reason."""
    try:
        message = decode(spec, raw)
    except DecodeError as err:
        assert err.reason in {"undecodable", "schema_violation", "oversized_record",
                              "oversized_field"}
        return None
    assert isinstance(message, spec.models)
    # Whatever decodes must encode back to a record that decodes to the same message.
    try:
        again = encode(message)
    except EncodeError:
        return message
    assert decode(spec, again) == message
    return message


@FUZZ
@given(spec=TOPICS, raw=st.binary(max_size=2048))
def test_random_bytes(spec: TopicSpec, raw: bytes) -> None:
    assert_decodes_or_rejects(spec, raw)


@FUZZ
@given(spec=TOPICS, doc=json_docs)
def test_random_json_documents(spec: TopicSpec, doc: object) -> None:
    assert_decodes_or_rejects(spec, json.dumps(doc).encode())


@FUZZ
@given(spec=TOPICS, doc=st.dictionaries(
    st.sampled_from(["type", "event_time_ms", "schema_version", "request_id", "worker_id", "key",
                     "value", "tokens", "token_offset", "final", "finish_reason", "raw",
                     "prompt_tokens", "max_tokens", "created_ms", "request", "slot"]),
    json_docs, max_size=12))
def test_random_documents_with_real_field_names(spec: TopicSpec, doc: dict) -> None:
    assert_decodes_or_rejects(spec, json.dumps(doc).encode())


HOSTILE = [
    b"[" * 100_000,
    b"{" * 100_000,
    b'{"a":' * 50_000,
    b"[" * 100_000 + b"]" * 100_000,
    b'{"type":"config_set","event_time_ms":1,"key":"k","value":' + b"[" * 5000 + b"]" * 5000 + b"}",
    str(10**400).encode(),
    b'{"type":"inference_request","prompt_tokens":' + str(10**4000).encode() + b"}",
    b'{"type":"config_set","event_time_ms":1,"key":"k","value":' + b"9" * 100_000 + b"}",
    b'{"type":"config_set","event_time_ms":1,"key":"k","value":1e99999}',
    b'{"type":"config_set","event_time_ms":1,"key":"k","value":-0.0}',
    b'"' + b"x" * (MAX_RECORD_BYTES - 2) + b'"',
    b'"' + b"x" * MAX_RECORD_BYTES + b'"',
    b'{"type":"chunk","request_id":"' + b"r" * 900_000 + b'"}',
    b'{"type":"chunk","tokens":[' + b"1," * 400_000 + b"1]}",
    b'{"' + b"k" * 500_000 + b'":1}',
    b'{"type":"dead_letter","raw":"' + b"A" * 999_000 + b'"}',
    b'"\\ud800"',  # a lone surrogate escape
    b'{"type":"chunk","request_id":"\\u0000"}',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b"\x00" * 1000,
    b"{}" * 1000,
    b"NaN",
    b"-Infinity",
]


@pytest.mark.parametrize("raw", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.suffix)
def test_hostile_payloads(spec: TopicSpec, raw: bytes) -> None:
    assert_decodes_or_rejects(spec, raw)


def test_hostile_payloads_over_the_limit_are_oversized_records() -> None:
    raw = b"[" * (MAX_RECORD_BYTES + 1)
    for spec in SPECS:
        with pytest.raises(DecodeError) as info:
            decode(spec, raw)
        assert info.value.reason == "oversized_record"


@st.composite
def mutated_records(draw: st.DrawFn, examples: dict) -> tuple[TopicSpec, bytes]:
    model = draw(st.sampled_from(all_models()))
    spec = next(s for s in SPECS if model in s.models)
    raw = bytearray(encode(examples[model]))
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "replace"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8)
                              | st.sampled_from([b"[", b"{", b'"', b"\\", b",", b"9" * 30,
                                                 b"NaN", b"-", b"e999", b"\\u0000"]))
        elif op == "delete" and raw:
            del raw[at:at + draw(st.integers(min_value=1, max_value=8))]
        elif op == "replace" and raw:
            raw[at] = draw(st.integers(min_value=0, max_value=255))
    return spec, bytes(raw)


@FUZZ
@given(data=st.data())
def test_mutated_valid_records(data: st.DataObject, examples: dict) -> None:
    spec, raw = data.draw(mutated_records(examples))
    assert_decodes_or_rejects(spec, raw)
    for other in SPECS:  # the same bytes on any topic
        assert_decodes_or_rejects(other, raw)


def test_unmutated_examples_decode(examples: dict) -> None:
    """The mutation test starts from records that decode, so a rejection is the mutation's doing."""
    for model in all_models():
        spec = next(s for s in SPECS if model in s.models)
        assert assert_decodes_or_rejects(spec, encode(examples[model])) == examples[model]
