"""The engine interface every worker drives: a pure object advanced by an injected clock.

The worker process owns all I/O; an engine only learns of requests through ``add`` and reports
the tokens it produced up to a given time through ``advance``. The simulated engine and the vLLM
adapter implement the same interface, so the worker does not care which one it runs.
"""

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

from schemas.limits import MAX_ITL_MS

#: Token ids are drawn from a vocabulary of this size (Llama 3's).
VOCAB_SIZE = 128_256


def reference_token(request_id: str, index: int) -> int:
    """Token ``index`` of a request's response: a pure function of both.

    Any worker produces the same stream for the same request, so a stream resumed on another
    worker can be checked token by token.
    """
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VOCAB_SIZE


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What an engine needs to know of a request.

    ``answer_tokens``: how long the model's answer runs (a simulated engine's stand-in for the
    end of sequence a real model samples): generation stops there, finish reason "stop", when
    that comes before ``max_tokens``, the client's cap. None: it runs to ``max_tokens``.

    ``answer_hashes``: the hash ids, of ``hash_block_size`` tokens each, of the blocks the
    sequence fills as it generates, after its prompt's full blocks (the first holds the prompt's
    tail and the answer's start): a simulated engine caches each once its tokens' KV is
    computed, as vLLM's prefix cache does, so the next turn of a conversation, which re-sends
    the answer, hits it. The offline simulator reads them from the next step of the request's
    task (a trace's ``hash_ids`` are its prompt's); a live engine is given none."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    resume_from_token: int = 0
    prefix_hashes: tuple[int, ...] = ()
    hash_block_size: int = 16  # prompt tokens each prefix hash stands for
    answer_tokens: int | None = None
    answer_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """Why an engine gave up on a request. ``retryable``: the engine's trouble, not the
    request's (its server died, dropped the stream or answered 5xx): the request continues on
    another worker. ``invalid_request``: the engine refused the request itself (an HTTP 4xx).
    ``engine_error``: anything else."""

    kind: Literal["retryable", "invalid_request", "engine_error"]
    detail: str


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Tokens one request produced since the last ``advance``.

    ``token_offset`` is the index of ``tokens[0]`` in the whole response. ``first`` is set on the
    batch that carries the first token of this attempt. A batch finished other than by "stop" or
    "length" says why in ``failure``.
    """

    request_id: str
    token_offset: int
    tokens: tuple[int, ...]
    first: bool
    finished: bool
    finish_reason: str | None = None
    time_s: float = 0.0  # engine time at which the last token of the batch was produced
    first_token_s: float | None = None  # engine time of the attempt's first token, on that batch
    token_count: int | None = None  # set when ``tokens`` is left empty to save time
    failure: EngineFailure | None = None
    #: on the finishing batch: prompt tokens the prefix cache held (vLLM's ``num_cached_tokens``)
    cached_tokens: int = 0

    @property
    def count(self) -> int:
        return len(self.tokens) if self.token_count is None else self.token_count


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    state: str = "warm"
    prefill_backlog_tokens: int = 0  # prompt tokens admitted or waiting but not yet prefilled
    prefill_context_tokens: int | None = None  # tokens computed of those still prefilling
    # Work done so far, where the engine counts it (None where it does not): engine iterations,
    # and prompt tokens computed (cache hits left out, recomputation after preemption counted).
    steps: int | None = None
    prefilled_tokens: int | None = None
    #: The longest prompt and output the engine serves (vLLM's ``max_model_len``); None: not known.
    max_model_len: int | None = None
    #: The GPUs it runs on (tensor parallelism): each is billed. 1 where the worker cannot tell
    #: (a vLLM server's own).
    gpus: int = 1


class WorkCounts(Protocol):
    """The engine's work so far, as ``EngineStats`` counts it (a ``SimEngine`` counts it too)."""

    steps: int | None
    prefilled_tokens: int | None


def interval_report(seq_seconds: float, tokens: int, before: tuple[int | None, int | None],
                    stats: WorkCounts, *, decode_seconds: float) -> dict:
    """What a heartbeat reports about the time since the previous one: the mean inter-token
    latency (``seq_seconds``: decoding sequences times seconds of engine time; ``tokens``:
    generated; ``decode_seconds``: the engine time in which any sequence was decoding), and,
    where the engine counts them, the work done that the latency is judged by (``before``: the
    engine's ``steps`` and ``prefilled_tokens`` at the previous heartbeat; ``stats``: its
    counts now, an ``EngineStats`` or the offline simulator's ``SimEngine`` itself)."""
    if seq_seconds == 0:
        itl = None  # nothing decoded (first tokens alone come from prefill): no evidence
    elif tokens == 0:
        # sequences decoding and no token: each waited that whole time (not the sum of their
        # waits: 64 sequences stalled for 0.5 s read 32 s)
        itl = round(min(decode_seconds * 1000, MAX_ITL_MS), 3)
    else:
        itl = round(min(seq_seconds / tokens * 1000, MAX_ITL_MS), 3)
    # (one dict, no tuples: the offline simulator asks ~113k times a run)
    steps, prefilled = stats.steps, stats.prefilled_tokens
    steps_before, prefilled_before = before
    if steps is None or prefilled is None or steps_before is None or prefilled_before is None \
            or steps < steps_before or prefilled < prefilled_before:
        return {"itl_ms": itl}
    return {"itl_ms": itl, "steps": steps - steps_before,
            "prefilled_tokens": prefilled - prefilled_before, "generated_tokens": tokens}


class CapacityError(ValueError):
    """A request that this engine can never serve (it does not fit in the KV cache)."""


class Engine(Protocol):
    def add(self, request: EngineRequest, now_s: float) -> None:
        """Queue a request that arrived at ``now_s``."""

    def abort(self, request_id: str) -> bool:
        """Drop a request; False when the engine does not hold it."""

    def advance(self, now_s: float) -> list[TokenBatch]:
        """Run up to ``now_s`` and return the tokens produced meanwhile."""

    def next_event_s(self) -> float | None:
        """When the next token is due, or None when the engine is idle."""

    def stats(self) -> EngineStats:
        """Current load."""
