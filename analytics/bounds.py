"""The message limits the sink's hot path checks on whole columns at once.

The hot path (``analytics/rows.py``) builds rows straight from JSON, and Arrow checks only that
each value fits its column's type. These checks add what the frequent messages' models bound
within a column's type (an id's characters and length, a count's maximum, a latency's range, a
state's choices), one vectorised Arrow operation a column per batch, so that a record every
other consumer dead-letters does not land in the tables the reports count as if it were valid
(before 6 Dec a ``Completed`` with ``output_tokens = 4e9`` and ``e2e_s = 1e300``, or a tenant
with a NUL and a newline in its name, was stored and reported). A flagged row is only a
suspect: it takes the full pydantic path, which stores it as it is or dead-letters it with the
field and the limit named. A check stricter than a model costs that row speed only; each is
the loosest bound any message routed to the table has on its field (or the column's default).
"""

from collections.abc import Callable
from typing import get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas import events, requests
from schemas.limits import (
    _ID_PATTERN,
    _NAME_PATTERN,
    MAX_ATTEMPTS,
    MAX_BLOCK_SIZE,
    MAX_CHUNK_TOKENS,
    MAX_ELAPSED_S,
    MAX_EPOCH_MS,
    MAX_ID_CHARS,
    MAX_LATENCY_S,
    MAX_NAME_CHARS,
    MAX_OUTPUT_TOKENS,
    MAX_POOL_CHARS,
    MAX_PREFIX_BLOCKS,
    MAX_PROMPT_TOKENS,
    MAX_REASON_CHARS,
    MAX_SEQUENCES,
    MAX_TASK_STEPS,
)

Check = Callable[[pa.Array], pa.Array]  # a column's values -> True where out of bounds


def _text(pattern: str, most: int, optional: bool = False) -> Check:
    """Characters of ``pattern`` (``^[...]+$``), at most ``most`` of them; ``optional``: or
    empty (the column's default where a message has no such field). The length is checked
    apart: a counted repetition such as ``{1,128}``, compiled by RE2 at every call, cost ten
    times as much on a fetch of 500 rows."""
    regex = pattern[:-2] + "*$" if optional else pattern

    def check(values: pa.Array) -> pa.Array:
        return pc.or_(pc.invert(pc.match_substring_regex(values, regex)),
                      pc.greater(pc.utf8_length(values), most))
    return check


def _upto(most: int) -> Check:
    """An unsigned column (its type has no negative values) at most ``most``."""
    return lambda values: pc.greater(values, most)


def _span(most: float) -> Check:
    """A float column from 0 to ``most``."""
    return lambda values: pc.invert(pc.and_kleene(pc.greater_equal(values, 0),
                                                  pc.less_equal(values, most)))


def _one_of(*choices: str) -> Check:
    allowed = pa.array(sorted(set(choices)), pa.string())
    return lambda values: pc.invert(pc.is_in(values, value_set=allowed))


def _longest(most: int) -> Check:
    return lambda values: pc.greater(pc.utf8_length(values), most)


def _epoch(values: pa.Array) -> pa.Array:
    return pc.greater(pc.cast(values, pa.int64()), MAX_EPOCH_MS)


def _each_name(values: pa.Array) -> pa.Array:
    """A list of names: True for a row with one that is not a name."""
    flat = pc.list_flatten(values)
    rows = pc.list_parent_indices(values)
    bad = pc.filter(rows, _text(_NAME_PATTERN, MAX_NAME_CHARS)(flat))
    return pc.is_in(pa.array(range(len(values)), pa.int64()), value_set=pc.cast(bad, pa.int64()))


def _literals(model_field: object) -> tuple[str, ...]:
    return get_args(model_field)


_ID, _OPTIONAL_ID = _text(_ID_PATTERN, MAX_ID_CHARS), _text(_ID_PATTERN, MAX_ID_CHARS, True)
_NAME, _OPTIONAL_NAME = _text(_NAME_PATTERN, MAX_NAME_CHARS), _text(_NAME_PATTERN, MAX_NAME_CHARS,
                                                                      True)
_REASONS = ("", *_literals(events.FailureReason), *_literals(events.RejectReason))
_FINISH = ("", *_literals(requests.FinishReason))
_TYPES = tuple(get_args(m.model_fields["type"].annotation)[0] for m in (
    *events.RequestEvent.__subclasses__(), requests.InferenceRequest, requests.CancelRequest))

#: Each hot-path table's checks, by column (the coordinates and ``time`` are Kafka's own or
#: checked as an epoch below).
CHECKS: dict[str, dict[str, Check]] = {
    "request_events": {
        "time": _epoch, "type": _one_of(*_TYPES), "request_id": _ID, "task_id": _OPTIONAL_ID,
        "tenant": _OPTIONAL_NAME, "model": _OPTIONAL_NAME, "worker_id": _OPTIONAL_ID,
        "attempt": _upto(MAX_ATTEMPTS), "priority": _upto(9), "step": _upto(MAX_TASK_STEPS),
        "steps_total": _upto(MAX_TASK_STEPS), "prompt_tokens": _upto(MAX_PROMPT_TOKENS),
        "max_tokens": _upto(MAX_OUTPUT_TOKENS), "output_tokens": _upto(MAX_OUTPUT_TOKENS),
        "cached_tokens": _upto(MAX_PROMPT_TOKENS), "tokens_done": _upto(MAX_OUTPUT_TOKENS),
        "ttft_s": _span(MAX_ELAPSED_S), "e2e_s": _span(MAX_ELAPSED_S), "created": _epoch,
        "deadline": _epoch, "reason": _one_of(*_REASONS), "finish_reason": _one_of(*_FINISH),
        "detail": _longest(MAX_REASON_CHARS), "retry_after_s": _span(MAX_LATENCY_S),
        "ttft_slo_s": _span(MAX_LATENCY_S), "prefix_blocks": _upto(MAX_PREFIX_BLOCKS),
        "block_size": _upto(MAX_BLOCK_SIZE),
    },
    "dispatches": {
        "time": _epoch, "request_id": _ID, "task_id": _OPTIONAL_ID, "tenant": _OPTIONAL_NAME,
        "model": _OPTIONAL_NAME, "worker_id": _OPTIONAL_ID, "slot": _upto(65_535),
        "attempt": _upto(MAX_ATTEMPTS), "resume_from_token": _upto(MAX_OUTPUT_TOKENS),
        "router_id": _OPTIONAL_ID,
    },
    "response_chunks": {
        "time": _epoch, "request_id": _ID, "worker_id": _ID, "attempt": _upto(MAX_ATTEMPTS),
        "token_offset": _upto(MAX_OUTPUT_TOKENS), "tokens": _upto(MAX_CHUNK_TOKENS),
        "finish_reason": _one_of(*_FINISH),
    },
    "worker_status": {
        "time": _epoch, "worker_id": _ID, "slot": _upto(65_535),
        "pool": _text(_NAME_PATTERN, MAX_POOL_CHARS), "gpu_type": _NAME,
        "models_loaded": _each_name, "state": _one_of(*_literals(events.WorkerState)),
        "running": _upto(MAX_SEQUENCES), "waiting": _upto(MAX_SEQUENCES), "started": _epoch,
        **{c: _upto(2**53) for c in ("kv_blocks_used", "kv_blocks_free", "prefix_cache_queries",
                                     "prefix_cache_hits", "preemptions", "requests_completed")},
    },
}


def out_of_bounds(table: str, rows: pa.Table) -> list[int]:
    """The indices of ``rows`` (a batch of ``table``'s rows) with a value out of its field's
    bounds (a null, a field the message left out, is never)."""
    checks = CHECKS.get(table)
    if not checks or rows.num_rows == 0:
        return []
    flags = []
    for column, check in checks.items():
        flagged = check(rows.column(column).combine_chunks())
        if flagged.null_count:
            flagged = pc.fill_null(flagged, False)
        flags.append(flagged.to_numpy(zero_copy_only=False))
    return np.flatnonzero(np.logical_or.reduce(flags)).tolist()
