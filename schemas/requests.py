"""What clients send and receive: requests, their dispatch to a worker, and streamed responses."""

import json
import math
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from schemas.base import Message
from schemas.limits import (
    MAX_BLOCK_SIZE,
    MAX_CHUNK_CHARS,
    MAX_CHUNK_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_PREFIX_BLOCKS,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKEN_IDS,
    MAX_PROMPT_TOKENS,
    MAX_PARTITION,
    Attempt,
    BlockHash,
    EpochMs,
    Id,
    Name,
    Reason,
    Seconds,
    Step,
    TokenId,
)

FinishReason = Literal["stop", "length", "abort", "error"]


def check_step(step: int, steps_total: int) -> None:
    """A task's step is one of its ``steps_total`` steps."""
    if step > steps_total:
        raise ValueError(f"step ({step}) must not exceed steps_total ({steps_total})")


class InferenceRequest(Message):
    """One LLM call, as a client produces it to ``governor.requests`` (key: ``request_id``).

    A task is a workflow of ``steps_total`` calls; this one is step ``step``. The prompt is given
    as a token count, optionally with its text or token ids, and optionally with the hash chain of
    its prefix blocks (``prefix_hashes``, one per ``block_size`` tokens) so placement can find the
    worker that already caches it.
    """

    type: Literal["inference_request"] = "inference_request"
    request_id: Id
    task_id: Id | None = None
    step: Step = 1
    steps_total: Step = 1
    tenant: Name = "default"
    priority: int = Field(default=0, ge=0, le=9, description="0 is the lowest service class")
    model: Name = "llama-3-8b"
    prompt_tokens: int = Field(ge=0, le=MAX_PROMPT_TOKENS)
    prompt_text: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    prompt_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_PROMPT_TOKEN_IDS)
    prefix_hashes: list[BlockHash] = Field(default_factory=list, max_length=MAX_PREFIX_BLOCKS)
    block_size: int = Field(default=16, ge=1, le=MAX_BLOCK_SIZE)
    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS)
    ttft_slo_s: Seconds | None = None
    deadline_ms: EpochMs | None = Field(default=None, description="absolute; unset means none")
    reply_to: str | None = Field(default=None, min_length=1, max_length=249,
                                 pattern=r"^[A-Za-z0-9._-]+$",
                                 description="topic for chunks: a legal Kafka topic name")
    created_ms: EpochMs

    @model_validator(mode="after")
    def _consistent(self) -> "InferenceRequest":
        if self.reply_to in (".", ".."):
            raise ValueError(f"reply_to {self.reply_to!r} is not a legal topic name")
        check_step(self.step, self.steps_total)
        if self.task_id is None and self.steps_total > 1:
            raise ValueError(f"steps_total {self.steps_total} needs a task_id (a request without "
                             "one is a task of one step)")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_tokens:
            raise ValueError(
                f"prompt_token_ids has {len(self.prompt_token_ids)} ids but prompt_tokens is "
                f"{self.prompt_tokens}"
            )
        blocks = math.ceil(self.prompt_tokens / self.block_size)
        if len(self.prefix_hashes) > blocks:
            raise ValueError(
                f"prefix_hashes has {len(self.prefix_hashes)} blocks but a prompt of "
                f"{self.prompt_tokens} tokens has at most {blocks} blocks of {self.block_size}"
            )
        if self.deadline_ms is not None and self.deadline_ms < self.created_ms:
            raise ValueError("deadline_ms must not be before created_ms")
        return self

    @property
    def effective_task_id(self) -> str:
        return self.task_id or self.request_id


#: The fields that say whose a request is and where its answer goes: what can be salvaged of a
#: record that is no valid request, to tell its client so.
_IDENTITY = ("request_id", "task_id", "tenant", "model", "created_ms", "reply_to")
_IDENTITY_CHECKS = {
    name: TypeAdapter(Annotated[field.annotation, *field.metadata] if field.metadata
                      else field.annotation)
    for name, field in InferenceRequest.model_fields.items() if name in _IDENTITY
}


#: ``salvage_identity``'s ``reply_to`` for one given but no legal topic name: its stream has
#: nowhere to go.
UNUSABLE_REPLY_TO = ""


def salvage_identity(raw: bytes | None) -> dict[str, Any] | None:
    """The identity fields (``_IDENTITY``) of a record on the requests topic that is no valid
    request, each where it is valid by itself (its ``task_id`` only with its tenant; a
    ``reply_to`` given but not valid as ``UNUSABLE_REPLY_TO``); None where it names no valid
    ``request_id`` or is no request at all: not a JSON object, another ``type`` (a cancel), or
    no ``type`` and neither ``prompt_tokens`` nor ``max_tokens``."""
    try:
        data = json.loads(raw or b"")
    except (ValueError, RecursionError):  # (nested past the parser's depth: no ValueError)
        return None
    if not isinstance(data, dict) or data.get("type", "inference_request") != "inference_request":
        return None
    if "type" not in data and "prompt_tokens" not in data and "max_tokens" not in data:
        return None  # (a cancel without its type would take the id of the request it cancels)
    fields = {}
    for name, check in _IDENTITY_CHECKS.items():
        if name in data:
            try:
                fields[name] = check.validate_python(data[name])
            except ValidationError:
                pass
    if data.get("reply_to") is not None and fields.get("reply_to") in (None, ".", ".."):
        fields["reply_to"] = UNUSABLE_REPLY_TO
    if "tenant" in data and "tenant" not in fields:  # (a task is a tenant's: not the default's)
        fields.pop("task_id", None)
    return fields if "request_id" in fields else None


#: How the reason of a router's recall begins (``CancelRequest.recalls``).
RECALLED = "recalled: "


class CancelRequest(Message):
    """A client withdraws a request (on ``governor.requests``, key ``request_id``).

    The router also sends one to a worker (``governor.dispatch``) with ``attempt`` set to recall
    that attempt: the worker stops it and hands it back (``Requeued`` with the tokens done), and
    the router continues it elsewhere; the request lives on.
    """

    type: Literal["cancel_request"] = "cancel_request"
    request_id: Id
    reason: Reason = "cancelled by client"
    attempt: Attempt | None = None

    @property
    def recalls(self) -> bool:
        """The router asks for the attempt back and waits for its ``Requeued`` (``reason``
        begins ``recalled:``); a ``superseded:`` one follows an attempt already resumed
        elsewhere, and nobody waits for an answer to it."""
        return self.attempt is not None and self.reason.startswith(RECALLED)


class Dispatch(Message):
    """The router's placement of a request on one worker slot (``governor.dispatch``, partition = slot).

    ``attempt`` counts placements of the same request. A continuation after a worker failure has
    ``resume_from_token`` > 0: the worker must produce tokens from that offset on, so the client's
    stream continues with no duplicate and no gap.

    ``stream_partition``: the partition of the request's stream on its topic (``reply_to``, or
    the responses topic), fixed when the router first placed it (``infra.bus.stream_partition``)
    and kept by its continuations: every record of the stream is written there, whatever
    partitions are added to the topic meanwhile. None (a dispatch of an older release, or one
    placed where the topic's partitions were not known): its request id, the key, decides.
    """

    type: Literal["dispatch"] = "dispatch"
    request: InferenceRequest
    worker_id: Id
    slot: int = Field(ge=0, le=65_535)
    attempt: Attempt = 1
    resume_from_token: int = Field(default=0, ge=0, le=MAX_OUTPUT_TOKENS)
    router_id: Id = "router"
    stream_partition: int | None = Field(default=None, ge=0, le=MAX_PARTITION,
                                         exclude_if=lambda partition: partition is None)

    @model_validator(mode="after")
    def _resume_within_output(self) -> "Dispatch":
        if self.resume_from_token >= self.request.max_tokens:
            raise ValueError(
                f"resume_from_token ({self.resume_from_token}) must be below max_tokens "
                f"({self.request.max_tokens})"
            )
        return self


class ResponseChunk(Message):
    """A run of generated tokens (``governor.responses``, or the request's ``reply_to``; key
    ``request_id``).

    ``token_offset`` is the index of the first token in ``tokens`` within the whole response, so a
    reader can drop duplicates and detect gaps. The last chunk has ``final`` set and a
    ``finish_reason``: "stop" or "length" for an answer, "abort" for a request cancelled, "error"
    for one that failed or was rejected. Every request that ends has its stream ended so (see
    ``stream_end``), unless its stream has nowhere to go (its ``reply_to`` missing, gone or
    refusing writes); why it ended is in its terminal event on the telemetry topic.
    """

    type: Literal["chunk"] = "chunk"
    request_id: Id
    worker_id: Id
    attempt: Attempt = 1
    token_offset: int = Field(ge=0, le=MAX_OUTPUT_TOKENS)
    tokens: list[TokenId] = Field(max_length=MAX_CHUNK_TOKENS)
    text: str | None = Field(default=None, max_length=MAX_CHUNK_CHARS)
    final: bool = False
    finish_reason: FinishReason | None = None

    @model_validator(mode="after")
    def _final_has_reason(self) -> "ResponseChunk":
        if self.final != (self.finish_reason is not None):
            raise ValueError("finish_reason is required on the final chunk and only there")
        return self


def stream_end(request_id: str, by: str, token_offset: int, finish_reason: FinishReason,
               event_time_ms: int, attempt: int = 1) -> ResponseChunk:
    """The final chunk, with no tokens, of a request's stream that ends other than in an answer:
    ``by`` (a worker, or the router that ended it) cancelled it ("abort") or failed or refused it
    ("error") after ``token_offset`` tokens. A client reading only its stream is not left
    waiting."""
    return ResponseChunk(event_time_ms=event_time_ms, request_id=request_id, worker_id=by,
                         attempt=attempt, token_offset=token_offset, tokens=[], final=True,
                         finish_reason=finish_reason)
