"""One codec for every topic: JSON validated by pydantic.

JSON was chosen over msgpack after measuring both (``benchmarks/codec.py``): pydantic parses and
validates JSON in one pass in Rust, which beats unpacking msgpack into Python objects and then
validating them, and JSON records stay readable with any Kafka tool and producible from any
language against the exported JSON schemas.
"""

from typing import Literal

from pydantic import ValidationError

from schemas.base import Message
from schemas.errors import LISTED_ERRORS, TerminalError, listed
from schemas.events import DeadLetterReason
from schemas.limits import MAX_RECORD_BYTES, MAX_REASON_CHARS
from schemas.topics import TopicSpec

_TOO_LONG = frozenset({"string_too_long", "too_long", "bytes_too_long"})
#: pydantic's errors for a record of a topic of several models without a valid ``type``.
_NO_TYPE = frozenset({"union_tag_not_found", "union_tag_invalid"})


class EncodeError(TerminalError):
    """A message too large to send."""


class DecodeError(TerminalError):
    """A record that is not a valid message of its topic."""

    def __init__(self, reason: DeadLetterReason, detail: str,
                 invalid: ValidationError | None = None) -> None:
        """``invalid``: the validation that refused the record, where one did (``governor
        command`` words it as a configuration error is: ``schemas.errors.one_line``)."""
        super().__init__(f"{reason}: {detail}")
        self.reason: DeadLetterReason = reason
        self.detail = detail[:MAX_REASON_CHARS]
        self.invalid = invalid


def encode(message: Message) -> bytes:
    data = message.model_dump_json().encode()
    if len(data) > MAX_RECORD_BYTES:
        raise EncodeError(
            f"{type(message).__name__} encodes to {len(data)} bytes, over the limit of "
            f"{MAX_RECORD_BYTES}"
        )
    return data


def decode(spec: TopicSpec, raw: bytes | None) -> Message:
    """Decode and validate one record of the topic ``spec`` describes, or raise DecodeError.

    Strictly: each value must have its field's JSON type (no ``"12"`` or ``12.0`` for an
    integer), as the exported JSON schemas say; Python code building messages is not affected."""
    if raw is None:
        raise DecodeError("undecodable", "record has no value")
    if len(raw) > MAX_RECORD_BYTES:
        raise DecodeError(
            "oversized_record", f"record is {len(raw)} bytes, over the limit of {MAX_RECORD_BYTES}"
        )
    try:
        return spec.adapter.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise DecodeError(_classify(exc), _describe(exc, spec), exc) from None
    except (ValueError, RecursionError) as exc:  # defensive: the parser never should
        raise DecodeError("undecodable", f"{type(exc).__name__}: {exc}") from None


def _classify(exc: ValidationError) -> Literal["undecodable", "schema_violation", "oversized_field"]:
    kinds = {err["type"] for err in exc.errors(include_url=False)}
    if "json_invalid" in kinds or "json_type" in kinds:
        return "undecodable"
    if kinds & _TOO_LONG:
        return "oversized_field"
    return "schema_violation"


def _describe(exc: ValidationError, spec: TopicSpec) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:LISTED_ERRORS]:
        where = ".".join(str(p) for p in err["loc"]) or "<record>"
        parts.append(f"{where}: {err['msg']}" if err["type"] not in _NO_TYPE or err["loc"]
                     else _no_type(err, spec))
    return listed(parts, exc.error_count())


def _no_type(err: dict, spec: TopicSpec) -> str:
    """The field a record of ``spec``'s topic lacks, named as every other field is (pydantic
    says "Unable to extract tag using discriminator 'type'")."""
    given = "Field required" if err["type"] == "union_tag_not_found" else \
        f"{err['ctx']['tag']!r} is no message of this topic"
    return f"type: {given} (one of {', '.join(sorted(spec.types))})"
