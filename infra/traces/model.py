"""The request record every trace format is loaded into, and the error bad traces raise.

A :class:`TraceRequest` is one request of a workload: when it arrives (seconds after the start of
the trace), how many prompt tokens it sends and how many it generates, optionally the chain of
prefix-block hashes that lets a simulator or router model KV-cache reuse, and the tenant, task and
SLO data the control plane schedules by. It is format-neutral: Azure CSV, Mooncake JSONL and
Governor JSONL rows (see ``infra.traces.loaders``) and the built-in synthetic workload (see
``infra.traces.synthetic``) all produce it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from schemas.errors import TerminalError
from schemas.limits import MAX_BLOCK_SIZE

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 512
#: The latest arrival a trace row may have: a year (one at 1e300 s had ``replay`` wait for
#: ever; epoch seconds written as ``arrival_s`` are past it). ``sim`` takes at most 14 days
#: after its ``--rate-scale`` (``MAX_WORKLOAD_S``).
MAX_ARRIVAL_S = 365 * 86_400.0
"""Tokens per prefix-cache block that a hash id stands for (the Mooncake trace's block size)."""

DEFAULT_TENANT = "default"
DEFAULT_MODEL = "llama-3-8b"


class TraceError(TerminalError):
    """A trace file (or a request built for one) is missing, malformed or out of order.

    Retrying cannot help: the file or the arguments must be fixed. Messages name the file, the
    line number and the offending field, with the value shown bounded in length.
    """


def _is_int(value: object) -> bool:
    """True for a real ``int`` (``bool`` is an ``int`` subclass but never a token count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """True for a finite ``int`` or ``float`` that is not a ``bool``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload trace.

    Attributes:
        arrival_s: Seconds after the start of the trace. Loaders of formats with absolute
            timestamps (Azure, Mooncake) subtract the first timestamp, so those traces start at 0;
            Governor JSONL already holds relative times and keeps them as written.
        prompt_tokens: Input (context) tokens, non-negative.
        output_tokens: Tokens to generate, non-negative.
        hash_ids: One id per ``block_size``-token block of the prompt; two requests whose leading
            ids are equal share that prefix of KV cache. Empty when the trace has no prefix data.
        block_size: Tokens per hash block (512 in the Mooncake trace).
        tenant: Who sent the request.
        priority: Scheduling priority, 0 to 9; larger is more important (`sim`, `replay` and
            `demo` refuse a row outside that range).
        model: The model the request is for.
        task_id: The multi-step task (agent workflow) this request is a step of, if any.
        step: This request's 1-based step within its task; 1 without a ``task_id``.
        steps_total: How many steps the task has; 1 without a ``task_id``. The rows of one task
            (one ``tenant`` and ``task_id``) must agree on it: the loaders check across rows.
        ttft_slo_s: Time-to-first-token target, seconds after this request's arrival; at most
            ``deadline_s``.
        deadline_s: Completion deadline, seconds after this request's arrival; the request
            succeeds only when it completes within it.

    Raises:
        TraceError: a field has the wrong type or an impossible value.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    block_size: int = DEFAULT_BLOCK_SIZE
    tenant: str = DEFAULT_TENANT
    priority: int = 0
    model: str = DEFAULT_MODEL
    task_id: str | None = None
    step: int = 1
    steps_total: int = 1
    ttft_slo_s: float | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if not _is_number(self.arrival_s) or not 0 <= self.arrival_s <= MAX_ARRIVAL_S:
            raise TraceError(f"field 'arrival_s' must be a number from 0 to {MAX_ARRIVAL_S:,.0f} "
                             f"(a year), got {self.arrival_s!r}")
        for name in ("prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise TraceError(f"field {name!r} must be an integer >= 0, got {value!r}")
        if not isinstance(self.hash_ids, tuple) or not all(_is_int(h) for h in self.hash_ids):
            raise TraceError(f"field 'hash_ids' must be a tuple of integers, got {self.hash_ids!r:.80}")
        for name in ("block_size", "step", "steps_total"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise TraceError(f"field {name!r} must be an integer >= 1, got {value!r}")
        if self.step > self.steps_total:
            raise TraceError(f"field 'step' ({self.step}) exceeds 'steps_total' ({self.steps_total})")
        if self.block_size > MAX_BLOCK_SIZE:
            raise TraceError(f"field 'block_size' must be at most {MAX_BLOCK_SIZE}, "
                             f"got {self.block_size}")
        blocks = math.ceil(self.prompt_tokens / self.block_size)
        if len(self.hash_ids) > blocks:
            raise TraceError(f"field 'hash_ids' has {len(self.hash_ids)} ids but a prompt of "
                             f"{self.prompt_tokens} tokens has at most {blocks} blocks of "
                             f"{self.block_size}")
        if not _is_int(self.priority):
            raise TraceError(f"field 'priority' must be an integer, got {self.priority!r}")
        for name in ("tenant", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TraceError(f"field {name!r} must be a non-empty string, got {value!r}")
        if self.task_id is not None and (not isinstance(self.task_id, str) or not self.task_id):
            raise TraceError(f"field 'task_id' must be a non-empty string or None, got {self.task_id!r}")
        if self.task_id is None and self.steps_total > 1:  # (step > 1 implies steps_total > 1)
            name = "step" if self.step > 1 else "steps_total"
            raise TraceError(f"field {name!r} is {getattr(self, name)} but 'task_id' is missing; "
                             "a row without a task is a task of one step (give it a task_id)")
        for name in ("ttft_slo_s", "deadline_s"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                raise TraceError(f"field {name!r} must be a finite number > 0 or None, got {value!r}")
        if self.ttft_slo_s is not None and self.deadline_s is not None \
                and self.ttft_slo_s > self.deadline_s:
            raise TraceError(f"field 'ttft_slo_s' ({self.ttft_slo_s:g}) exceeds 'deadline_s' "
                             f"({self.deadline_s:g}); the first token cannot be due after the "
                             "whole answer (swapped, or in other units?)")

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the request's whole KV-cache footprint at completion."""
        return self.prompt_tokens + self.output_tokens
