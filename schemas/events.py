"""Past-tense facts: request lifecycle, worker status, KV cache changes and dead letters.

Lifecycle events go to ``governor.telemetry`` keyed by ``request_id`` so that each producer's
events of one request stay in order; the router's ``Queued`` goes out once its ``Dispatch`` is
on the broker, so the worker's ``Started`` (and more) may come before it. A request that was accepted (``Queued``) reaches exactly one terminal event:
``Completed``, ``Failed``, ``Rejected`` or ``Cancelled``.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.base import Message
from schemas.limits import (
    MAX_DEAD_LETTER_RAW_BYTES,
    MAX_ITL_MS,
    MAX_LATENCY_S,
    MAX_MAP_ENTRIES,
    MAX_MODELS_LOADED,
    MAX_OUTPUT_TOKENS,
    MAX_PARTITION,
    MAX_PREFIX_BLOCKS,
    MAX_PROMPT_TOKENS,
    MAX_WORKER_GPUS,
    Attempt,
    BlockHash,
    Count,
    Elapsed,
    EpochMs,
    Id,
    Name,
    Offset,
    PoolName,
    Reason,
    ScopeKey,
    Seconds,
    Sequences,
    Step,
    WorkerId,
)
from schemas.requests import InferenceRequest, check_step

#: Why an accepted request failed. None is for a deadline: a request whose deadline passes once
#: it runs is served to its end and counted late (it was accepted; a late answer beats none).
FailureReason = Literal["worker_lost", "engine_error", "retry_budget_exhausted", "invalid_request"]
RejectReason = Literal[
    "no_capacity", "deadline_unreachable", "rate_limited", "load_shed", "duplicate",
    "invalid_request", "task_failed",
]


class RequestEvent(Message):
    """Common fields of a request's lifecycle events.

    ``created_ms`` is the request's own ``created_ms``, the same on each of its events (unset on
    events written before it was added): the analytics store keys a request's rollup on it.
    """

    request_id: Id
    task_id: Id | None = None
    tenant: Name = "default"
    model: Name = "llama-3-8b"
    created_ms: EpochMs | None = None


def about(request: InferenceRequest) -> dict[str, object]:
    """The fields every lifecycle event of ``request`` shares."""
    return dict(request_id=request.request_id, task_id=request.task_id, tenant=request.tenant,
                model=request.model, created_ms=request.created_ms)


class Queued(RequestEvent):
    """The router accepted the request; from here on it must reach exactly one terminal state."""

    type: Literal["queued"] = "queued"
    prompt_tokens: int = Field(ge=0, le=MAX_PROMPT_TOKENS)
    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS)
    priority: int = Field(default=0, ge=0, le=9)
    step: Step = 1
    steps_total: Step = 1
    created_ms: EpochMs
    deadline_ms: EpochMs | None = None
    ttft_slo_s: Seconds | None = None

    @model_validator(mode="after")
    def _step_within_task(self) -> "Queued":
        check_step(self.step, self.steps_total)
        return self


class Started(RequestEvent):
    """A worker began prefill of an attempt."""

    type: Literal["started"] = "started"
    worker_id: Id
    attempt: Attempt = 1


class FirstToken(RequestEvent):
    """The first output token of an attempt left a worker: the request's first token when
    ``tokens_done`` is 0, else that of a continuation, resumed after tokens streamed before
    (not a new TTFT)."""

    type: Literal["first_token"] = "first_token"
    worker_id: Id
    attempt: Attempt = 1
    ttft_s: Elapsed = Field(description="from the request's created_ms")
    #: Left out of the record when 0 (a request's first token), so that a reader older than the
    #: field, which forbids fields it does not know, reads every first token but a continuation's.
    tokens_done: int = Field(default=0, ge=0, le=MAX_OUTPUT_TOKENS,
                             exclude_if=lambda done: done == 0,
                             description="tokens streamed before this attempt (its Dispatch's "
                                         "resume_from_token)")


class Preempted(RequestEvent):
    """The engine evicted the request's KV cache and will recompute it."""

    type: Literal["preempted"] = "preempted"
    worker_id: Id
    tokens_done: int = Field(ge=0, le=MAX_OUTPUT_TOKENS)


class Requeued(RequestEvent):
    """A worker gave an unfinished request back (shutdown, drain deadline, model switch, its
    engine's server failing).

    Not terminal: the router places it again as a continuation from ``tokens_done``.
    """

    type: Literal["requeued"] = "requeued"
    worker_id: Id
    attempt: Attempt = 1
    tokens_done: int = Field(ge=0, le=MAX_OUTPUT_TOKENS)
    detail: Reason = ""
    engine_failed: bool = Field(
        default=False, description="given back because the worker's engine failed it (its "
                                   "server unreachable, a stream cut, an HTTP 5xx), not because "
                                   "the worker stops: counted against the worker's breaker")


class Completed(RequestEvent):
    """Terminal: the response is complete."""

    type: Literal["completed"] = "completed"
    worker_id: Id
    attempt: Attempt = 1
    prompt_tokens: int = Field(ge=0, le=MAX_PROMPT_TOKENS)
    output_tokens: int = Field(ge=0, le=MAX_OUTPUT_TOKENS)
    cached_tokens: int = Field(default=0, ge=0, le=MAX_PROMPT_TOKENS)
    finish_reason: Literal["stop", "length"] = "length"
    e2e_s: Elapsed = Field(description="from the request's created_ms")


class Failed(RequestEvent):
    """Terminal: the request could not be served."""

    type: Literal["failed"] = "failed"
    reason: FailureReason
    detail: Reason = ""
    worker_id: Id | None = None
    #: Unset, a reader tells the attempt by ``worker_id`` alone: a late failure of an attempt
    #: that a newer one on the same worker replaced would look like the newer one's.
    attempt: Attempt | None = Field(default=None, exclude_if=lambda a: a is None,
                                    description="the attempt it ends; unset where not said (a "
                                                "writer older than the field)")


#: Refusals for now, not for the task: the tenant is over its rate, or no live worker serves
#: the model yet. With a retry hint they fail no task (a retry under a new request id is routed
#: as usual); without one (a request larger than its tenant's burst) no retry can help.
NOT_NOW = frozenset({"rate_limited", "no_capacity"})


class Rejected(RequestEvent):
    """Terminal: admission refused the request; ``retry_after_s`` hints when to try again,
    ``None`` where a retry cannot help (under the governor policy a refused step fails its
    task, and the task's later requests are refused too, unless the refusal was
    ``rate_limited`` or ``no_capacity`` with a hint: ``for_now``)."""

    type: Literal["rejected"] = "rejected"
    reason: RejectReason
    detail: Reason = ""
    retry_after_s: float | None = Field(default=None, ge=0, le=MAX_LATENCY_S)

    @property
    def for_now(self) -> bool:
        return refused_for_now(self.reason, self.retry_after_s)


def refused_for_now(reason: str, retry_after_s: float | None) -> bool:
    """A refusal that fails no task: ``NOT_NOW``, with a retry hint."""
    return reason in NOT_NOW and retry_after_s is not None


class Cancelled(RequestEvent):
    """Terminal: the client withdrew the request."""

    type: Literal["cancelled"] = "cancelled"
    reason: Reason = ""
    worker_id: Id | None = None
    attempt: Attempt | None = Field(default=None, exclude_if=lambda a: a is None,
                                    description="the attempt it ends; unset where not said (a "
                                                "writer older than the field)")


TERMINAL_EVENT_TYPES = frozenset({"completed", "failed", "rejected", "cancelled"})

WorkerState = Literal["starting", "loading", "warm", "draining", "sleeping", "crashed", "stopped"]


class StreamProgress(BaseModel):
    """How far one attempt's token stream to a client's own topic has gone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: Id
    attempt: Attempt = 1
    tokens_sent: Count


class WorkerStatus(Message):
    """A worker's heartbeat, about every 0.5 s (``governor.telemetry``, key ``worker_id``)."""

    type: Literal["worker_status"] = "worker_status"
    worker_id: WorkerId
    slot: int = Field(ge=0, le=65_535)
    pool: PoolName
    gpu_type: Name
    gpus: int = Field(default=1, ge=1, le=MAX_WORKER_GPUS, exclude_if=lambda n: n == 1,
                      description="GPUs of gpu_type its engine runs on (tensor parallelism), "
                                  "each billed at the GPU's price; written only above 1")
    models_loaded: list[Name] = Field(default_factory=list, max_length=MAX_MODELS_LOADED)
    state: WorkerState = "warm"
    kv_blocks_used: Count = 0
    kv_blocks_free: Count = 0
    running: Sequences = 0
    waiting: Sequences = 0
    prefix_cache_queries: Count = 0
    prefix_cache_hits: Count = 0
    preemptions: Count = 0
    requests_completed: Count = 0
    prefill_backlog_tokens: Count | None = Field(
        default=None, description="prompt tokens queued or admitted but not yet prefilled")
    prefill_context_tokens: Count | None = Field(
        default=None, description="tokens already computed of the sequences still prefilling "
                                  "(the rest of their prompts attends to them)")
    itl_ms: float | None = Field(default=None, ge=0, le=MAX_ITL_MS,
                                 description="mean inter-token latency since the last status")
    steps: Count | None = Field(default=None, description="engine iterations since the last status")
    prefilled_tokens: Count | None = Field(
        default=None, description="prompt tokens computed since the last status (cache hits left out)")
    generated_tokens: Count | None = Field(default=None,
                                           description="tokens generated since the last status")
    max_model_len: Count | None = Field(
        default=None, description="the longest prompt and output its engine serves (vLLM's "
                                  "max_model_len); none: not known")
    started_ms: EpochMs
    reply_progress: list[StreamProgress] = Field(
        default_factory=list, max_length=MAX_MAP_ENTRIES,
        description="the tokens sent so far by each running request that replies to a topic of "
                    "its own (reply_to), whose chunks the router does not read: a continuation "
                    "after a crash resumes after them")


class KvBlocksStored(Message):
    """Blocks that a worker's prefix cache now holds (``governor.kv``, key ``worker_id``)."""

    type: Literal["kv_blocks_stored"] = "kv_blocks_stored"
    worker_id: Id
    block_size: int = Field(ge=1, le=4096)
    block_hashes: list[BlockHash] = Field(max_length=MAX_PREFIX_BLOCKS)
    parent_hash: BlockHash | None = None


class KvBlocksEvicted(Message):
    """Blocks that a worker's prefix cache dropped."""

    type: Literal["kv_blocks_evicted"] = "kv_blocks_evicted"
    worker_id: Id
    block_hashes: list[BlockHash] = Field(max_length=MAX_PREFIX_BLOCKS)


class KvCacheCleared(Message):
    """A worker's prefix cache is empty (restart, model switch)."""

    type: Literal["kv_cache_cleared"] = "kv_cache_cleared"
    worker_id: Id


SignalScope = Literal["worker", "pool", "model", "tenant", "fleet"]

#: The signal a router sends (scope ``model``, value 1) when a request of the model begins to wait
#: with no live worker of it: the autoscaler counts it as a waiting request, so a pool at zero
#: is woken while the request waits, not once its wait has ended in a refusal.
WAITING_FOR_WORKER = "requests_waiting_for_worker"


class SignalSnapshot(Message):
    """Live signals over one window for one scope (``governor.signals``, key ``scope:key``).

    Every figure is optional: a window without completions has no latency percentiles.
    """

    type: Literal["signal_snapshot"] = "signal_snapshot"
    scope: SignalScope
    key: ScopeKey
    window_s: float = Field(gt=0, le=86_400)
    window_end_ms: EpochMs
    values: dict[Name, float] = Field(default_factory=dict, max_length=MAX_MAP_ENTRIES)


def waiting_for_worker(model: str, now_ms: int, wait_s: float, requests: int = 1
                       ) -> SignalSnapshot:
    """The router's word that ``requests`` requests of ``model`` began to wait, up to ``wait_s``,
    with no live worker of the model (``WAITING_FOR_WORKER``); its window is the wait, at most a
    day."""
    return SignalSnapshot(event_time_ms=now_ms, scope="model", key=model,
                          window_s=min(wait_s, 86_400.0), window_end_ms=now_ms,
                          values={WAITING_FOR_WORKER: float(requests)})


class ConfigApplied(Message):
    """A component applied a live setting (``governor.telemetry``, key: the setting)."""

    type: Literal["config_applied"] = "config_applied"
    key: str = Field(max_length=256)
    component: Id
    config_offset: Offset


class ConfigRejected(Message):
    """A live setting failed validation; the last good configuration stays in force."""

    type: Literal["config_rejected"] = "config_rejected"
    key: str = Field(max_length=256)
    component: Id
    config_offset: Offset
    reason: Reason


#: ``unprocessable``: a valid message its consumer failed on (a bug it set off), kept aside so
#: that the consumer goes on, or a command it cannot carry out (a ``ScalePool`` beyond what
#: the local stack's supervisor can give). ``future_event_time``: stamped further ahead of its consumer's
#: clock than the consumer accepts (a producer whose clock runs ahead), which would move event
#: time forward for everything else it reads. ``duplicate_request_id``: a request under an id
#: that names another request the router has (a client that reuses ids).
DeadLetterReason = Literal["undecodable", "schema_violation", "oversized_record", "oversized_field",
                           "unprocessable", "future_event_time", "duplicate_request_id"]


class DeadLetter(Message):
    """A record no consumer could use, kept with why (``governor.deadletter``)."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    type: Literal["dead_letter"] = "dead_letter"
    source_topic: str = Field(max_length=249)
    partition: int = Field(ge=0, le=MAX_PARTITION)
    offset: Offset
    consumer: Id
    reason: DeadLetterReason
    error: Reason
    key: bytes | None = Field(default=None, max_length=1024)
    raw: bytes = Field(max_length=MAX_DEAD_LETTER_RAW_BYTES, description="head of the record")
    raw_size: Count
