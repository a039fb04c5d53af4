"""The message limits the sink's hot path checks on whole columns at once.

The hot path (``analytics/rows.py``) builds rows straight from JSON, and Arrow checks only that
each value fits its column's type. These checks add what the frequent messages' models bound
within a column's type (an id's characters and length, a count's maximum, a latency's range, a
state's choices), one vectorised Arrow operation a column per batch, so that a record every
other consumer dead-letters does not land in the tables the reports count as if it were valid
(before 6 Dec a ``Completed`` with ``output_tokens = 4e9`` and ``e2e_s = 1e300``, or a tenant
with a NUL and a newline in its name, was stored and reported). A flagged row is only a
suspect: it takes the full pydantic path, which stores it as it is or dead-letters it with the
field and the limit named. A check stricter than a model costs that row speed only; each of
``CHECKS`` is the loosest bound any message routed to the table has on its field (or the
column's default), and ``BY_TYPE`` adds, for the rows of one message type, that type's own
where it is stricter (a count from 1, an id it must give, a narrower choice). A null is out of
bounds unless its check passes it (``_or_null``): most fields have no None. The models' rules
across fields whose columns the rows carry (``step <= steps_total``, a final chunk and only it
with a finish reason, ...) are checks too, keyed by their columns (a tuple). The tests
(``tests/unit/analytics/test_bounds.py``, ``test_across_fields.py``) read each field's limits
off its model and try its validators, and fail where a check and its model disagree.

Before Arrow sees them, each number column's values are checked for their JSON kind
(``mistyped``): Arrow builds a float column from ``true`` as from 1.0 and an integer one from
``2.0`` as from 2, where the models (decoded strictly) refuse both.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.schema import COORDINATES, TABLES
from schemas import events, requests
from schemas.limits import (
    _ID_PATTERN,
    _NAME_PATTERN,
    FLEET_KEY,
    MAX_ATTEMPTS,
    MAX_BLOCK_SIZE,
    MAX_CHUNK_CHARS,
    MAX_CHUNK_TOKENS,
    MAX_ELAPSED_S,
    MAX_EPOCH_MS,
    MAX_ID_CHARS,
    MAX_LATENCY_S,
    MAX_MODELS_LOADED,
    MAX_NAME_CHARS,
    MAX_OUTPUT_TOKENS,
    MAX_POOL_CHARS,
    MAX_PREFIX_BLOCKS,
    MAX_PROMPT_TOKENS,
    MAX_REASON_CHARS,
    MAX_SEQUENCES,
    MAX_TASK_STEPS,
    MAX_WORKER_GPUS,
)

#: A column's values -> True where out of bounds (as Arrow, or as numpy: an Arrow compute call
#: costs about 10 us on a fetch's 500 rows, numpy's a tenth of that); a rule across fields
#: takes the values of each column its key names.
Check = Callable[..., pa.Array | np.ndarray]
#: A column, or the columns of a rule across fields.
Key = str | tuple[str, ...]


def _or_null(check: Check) -> Check:
    """``check`` (an Arrow one), where a null (a field left out, or None where its model allows
    it) passes. Elsewhere a null is flagged: a field its model has no None for, given as
    null."""
    def check_or_null(values: pa.Array) -> pa.Array:
        flagged = check(values)
        return pc.fill_null(flagged, False) if flagged.null_count else flagged
    return check_or_null


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


def _given(values: pa.Array) -> np.ndarray:
    """Not empty: where the message's type has the field (the column's "" is another type's).
    Read off the string offsets (a null is empty too)."""
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    return offsets[1:] == offsets[:-1]


def _present(values: pa.Array) -> np.ndarray:
    """Not null: where the message's type has the field and no None for it."""
    if values.null_count:
        return values.is_null().to_numpy(zero_copy_only=False)
    return np.zeros(len(values), bool)


def _upto(most: int, least: int = 0) -> Check:
    """An unsigned column (its type has no negative values) from ``least`` to ``most``."""
    if least == 0:
        return lambda values: pc.greater(values, most)
    return lambda values: pc.or_(pc.less(values, least), pc.greater(values, most))


def _from_one(values: pa.Array) -> pa.Array | np.ndarray:
    """An unsigned count from 1 (``CHECKS`` has its maximum)."""
    return pc.equal(values, 0) if values.null_count else values.to_numpy() == 0


def _span(most: float, above_zero: bool = False) -> Check:
    """A float column from 0 (or above it) to ``most``."""
    low = pc.greater if above_zero else pc.greater_equal
    return lambda values: pc.invert(pc.and_kleene(low(values, 0), pc.less_equal(values, most)))


def _one_of(*choices: str) -> Check:
    allowed = pa.array(sorted(set(choices)), pa.string())
    return lambda values: pc.invert(pc.is_in(values, value_set=allowed))


def _longest(most: int) -> Check:
    return lambda values: pc.greater(pc.utf8_length(values), most)


def _epoch(values: pa.Array) -> pa.Array:
    ms = pc.cast(values, pa.int64())
    return pc.or_(pc.less(ms, 0), pc.greater(ms, MAX_EPOCH_MS))


def _names(values: pa.Array) -> pa.Array:
    """A list of names: True for a row with one that is not a name, or with too many."""
    flat = pc.list_flatten(values)
    rows = pc.list_parent_indices(values)
    bad = pc.filter(rows, pc.fill_null(_text(_NAME_PATTERN, MAX_NAME_CHARS)(flat), True))
    return pc.or_(pc.greater(pc.list_value_length(values), MAX_MODELS_LOADED),
                  pc.is_in(pa.array(range(len(values)), pa.int64()),
                           value_set=pc.cast(bad, pa.int64())))


def _literals(model_field: object) -> tuple[str, ...]:
    return get_args(model_field)


def _ints(values: pa.Array) -> np.ndarray:
    """An unsigned count column as int64 (a null as 0: where it is none, its check flags it)."""
    return (pc.fill_null(values, 0) if values.null_count else values).to_numpy().astype(np.int64)


# Rules across fields (the models' validators), on the columns their rows carry: each checks
# the columns its key names (a tuple of them) and is True where the rule is broken.

def _step_past_steps_total(step: pa.Array, steps_total: pa.Array) -> np.ndarray:
    """``schemas.requests.check_step`` (a row of no task step has 0 for both)."""
    return _ints(step) > _ints(steps_total)


def _steps_without_task(task_id: pa.Array, steps_total: pa.Array) -> np.ndarray:
    """``InferenceRequest``: a request of several steps names its task."""
    return _given(task_id) & (_ints(steps_total) > 1)


def _deadline_before_creation(deadline: pa.Array, created: pa.Array) -> pa.Array:
    """``InferenceRequest``: no deadline before its creation."""
    return pc.fill_null(pc.less(deadline, created), False)


def _prefix_past_prompt(blocks: pa.Array, size: pa.Array, tokens: pa.Array) -> np.ndarray:
    """``InferenceRequest``: no more prefix blocks than ``ceil(prompt_tokens / block_size)``
    (counts past their bounds clipped, so that the product stays in 64 bits)."""
    size = np.minimum(_ints(size), MAX_BLOCK_SIZE + 1)
    blocks = np.minimum(_ints(blocks), MAX_PREFIX_BLOCKS + 1)
    return blocks * size >= _ints(tokens) + np.maximum(size, 1)


def _final_without_reason(is_final: pa.Array, finish_reason: pa.Array) -> np.ndarray:
    """``ResponseChunk``: a finish reason on the final chunk and only there."""
    return (_ints(is_final) == 1) == _given(finish_reason)


_STEPS = ("step", "steps_total")


_ID, _OPTIONAL_ID = _text(_ID_PATTERN, MAX_ID_CHARS), _text(_ID_PATTERN, MAX_ID_CHARS, True)
_NAME, _OPTIONAL_NAME = _text(_NAME_PATTERN, MAX_NAME_CHARS), _text(_NAME_PATTERN, MAX_NAME_CHARS,
                                                                      True)
_ATTEMPT = _upto(MAX_ATTEMPTS, least=1)


def _worker_id(values: pa.Array) -> pa.Array:
    """A heartbeat's worker id: an id, but not the fleet's key (``WorkerId``)."""
    return pc.or_(_ID(values), pc.equal(values, FLEET_KEY))


_REASONS = ("", *_literals(events.FailureReason), *_literals(events.RejectReason))
_FINISH = ("", *_literals(requests.FinishReason))
_TYPES = tuple(get_args(m.model_fields["type"].annotation)[0] for m in (
    *events.RequestEvent.__subclasses__(), requests.InferenceRequest, requests.CancelRequest))

#: Each hot-path table's checks, by column (the coordinates and ``time`` are Kafka's own or
#: checked as an epoch below): the loosest bound of the messages routed to the table.
CHECKS: dict[str, dict[Key, Check]] = {
    "request_events": {
        "time": _epoch, "type": _one_of(*_TYPES), "request_id": _ID, "task_id": _OPTIONAL_ID,
        "tenant": _OPTIONAL_NAME, "model": _OPTIONAL_NAME, "worker_id": _OPTIONAL_ID,
        "attempt": _or_null(_upto(MAX_ATTEMPTS)), "priority": _upto(9),
        "step": _upto(MAX_TASK_STEPS), "steps_total": _upto(MAX_TASK_STEPS),
        "prompt_tokens": _upto(MAX_PROMPT_TOKENS), "max_tokens": _upto(MAX_OUTPUT_TOKENS),
        "output_tokens": _upto(MAX_OUTPUT_TOKENS), "cached_tokens": _upto(MAX_PROMPT_TOKENS),
        "tokens_done": _upto(MAX_OUTPUT_TOKENS), "ttft_s": _or_null(_span(MAX_ELAPSED_S)),
        "e2e_s": _or_null(_span(MAX_ELAPSED_S)), "created": _or_null(_epoch),
        "deadline": _or_null(_epoch), "reason": _one_of(*_REASONS),
        "finish_reason": _one_of(*_FINISH), "detail": _longest(MAX_REASON_CHARS),
        "retry_after_s": _or_null(_span(MAX_LATENCY_S)),
        "ttft_slo_s": _or_null(_span(MAX_LATENCY_S, above_zero=True)),
        "prefix_blocks": _upto(MAX_PREFIX_BLOCKS), "block_size": _upto(MAX_BLOCK_SIZE),
        _STEPS: _step_past_steps_total,
    },
    "dispatches": {
        "time": _epoch, "request_id": _ID, "task_id": _OPTIONAL_ID, "tenant": _OPTIONAL_NAME,
        "model": _OPTIONAL_NAME, "worker_id": _OPTIONAL_ID, "slot": _upto(65_535),
        "attempt": _upto(MAX_ATTEMPTS), "resume_from_token": _upto(MAX_OUTPUT_TOKENS),
        "router_id": _OPTIONAL_ID,
    },
    "response_chunks": {
        "time": _epoch, "request_id": _ID, "worker_id": _ID, "attempt": _ATTEMPT,
        "token_offset": _upto(MAX_OUTPUT_TOKENS), "tokens": _upto(MAX_CHUNK_TOKENS),
        "text_chars": _upto(MAX_CHUNK_CHARS), "is_final": _upto(1),
        "finish_reason": _one_of(*_FINISH), ("is_final", "finish_reason"): _final_without_reason,
    },
    "worker_status": {
        "time": _epoch, "worker_id": _worker_id, "slot": _upto(65_535),
        "pool": _text(_NAME_PATTERN, MAX_POOL_CHARS), "gpu_type": _NAME,
        "gpus": _upto(MAX_WORKER_GPUS, least=1), "models_loaded": _names,
        "state": _one_of(*_literals(events.WorkerState)),
        "running": _upto(MAX_SEQUENCES), "waiting": _upto(MAX_SEQUENCES), "started": _epoch,
        **{c: _upto(2**53) for c in ("kv_blocks_used", "kv_blocks_free", "prefix_cache_queries",
                                     "prefix_cache_hits", "preemptions", "requests_completed")},
    },
}

# What a type's own field adds to ``CHECKS`` (which hold the range for every row).
_OF_A_REQUEST = {"tenant": _given, "model": _given}  # (a cancellation has neither)
_ON_A_WORKER = {**_OF_A_REQUEST, "worker_id": _given}
_ASKED = {**_OF_A_REQUEST, "step": _from_one, "steps_total": _from_one, "max_tokens": _from_one,
          "created": _present}
_COUNTED = {**_ON_A_WORKER, "attempt": _from_one}
#: An attempt a message may leave unsaid (null), else counted from 1.
_UNSAID_OR_FROM_ONE = _or_null(lambda values: pc.equal(values, 0))

#: The rows of a message type whose field is stricter than the loosest of its table (a field
#: the type has, where the others leave the column's default, "" or 0 or null; a narrower
#: choice): checks of those rows besides ``CHECKS``, by table, ``type`` and column.
BY_TYPE: dict[str, dict[str, dict[Key, Check]]] = {
    "request_events": {
        "inference_request": {
            **_ASKED, "block_size": _from_one, ("task_id", "steps_total"): _steps_without_task,
            ("deadline", "created"): _deadline_before_creation,
            ("prefix_blocks", "block_size", "prompt_tokens"): _prefix_past_prompt},
        "queued": _ASKED,
        "started": _COUNTED,
        "first_token": {**_COUNTED, "ttft_s": _present},
        "preempted": _ON_A_WORKER,
        "requeued": _COUNTED,
        "completed": {**_COUNTED, "e2e_s": _present, "finish_reason": _one_of(*_literals(
            events.Completed.model_fields["finish_reason"].annotation))},
        "failed": {**_OF_A_REQUEST, "reason": _one_of(*_literals(events.FailureReason)),
                   "attempt": _UNSAID_OR_FROM_ONE},
        "rejected": {**_OF_A_REQUEST, "reason": _one_of(*_literals(events.RejectReason))},
        "cancelled": {**_OF_A_REQUEST, "attempt": _UNSAID_OR_FROM_ONE},
        "cancel_request": {"attempt": _UNSAID_OR_FROM_ONE},
    },
    "dispatches": {"dispatch": {**_COUNTED, "router_id": _given}},
}


@dataclass(frozen=True)
class _Rule:
    """A ``BY_TYPE`` check of one column, for the rows of the types it holds for (``of``: a
    mask over the table's types in the order of ``_Typed.types``, and one more for a type not
    among them)."""

    column: Key
    check: Check
    of: np.ndarray


@dataclass(frozen=True)
class _Typed:
    types: pa.Array
    rules: tuple[_Rule, ...]


def _typed(by_type: dict[str, dict[Key, Check]]) -> _Typed:
    """``BY_TYPE``'s checks of one table by column, each once for the types that share it (a
    column's check per type would cost a pass over the batch each: 160 Arrow calls a fetch)."""
    types = sorted(by_type)
    shared: dict[tuple[Key, Check], np.ndarray] = {}
    for i, kind in enumerate(types):
        for column, check in by_type[kind].items():
            shared.setdefault((column, check), np.zeros(len(types) + 1, bool))[i] = True
    return _Typed(pa.array(types, pa.string()),
                  tuple(_Rule(column, check, of) for (column, check), of in shared.items()))


_TYPED = {table: _typed(by_type) for table, by_type in BY_TYPE.items()}


def _array(values: pa.ChunkedArray) -> pa.Array:
    return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()


def _flagged(check: Check, rows: pa.Table, key: Key) -> np.ndarray:
    """Where ``check`` flags the column ``key`` names (or, a rule across fields, the columns)."""
    flagged = check(*(_array(rows.column(name)) for name in
                      (key if isinstance(key, tuple) else (key,))))
    if isinstance(flagged, np.ndarray):
        return flagged
    if flagged.null_count:  # a null the check did not pass (``_or_null``)
        flagged = pc.fill_null(flagged, True)
    return flagged.to_numpy(zero_copy_only=False)


def out_of_bounds(table: str, rows: pa.Table) -> list[int]:
    """The indices of ``rows`` (a batch of ``table``'s rows) with a value out of its field's
    bounds, for the message type of its row, or breaking a rule across its fields."""
    checks = CHECKS.get(table)
    if not checks or rows.num_rows == 0:
        return []
    flags = np.logical_or.reduce([_flagged(check, rows, key) for key, check in checks.items()])
    typed = _TYPED.get(table)
    if typed is not None:
        kinds = pc.index_in(rows.column("type"), value_set=typed.types)
        kinds = pc.fill_null(kinds, len(typed.types)).to_numpy(zero_copy_only=False)
        for rule in typed.rules:
            of_type = rule.of[kinds]
            if of_type.any():
                flags |= of_type & _flagged(rule.check, rows, rule.column)
    return np.flatnonzero(flags).tolist()


#: The Python values orjson gives for a JSON integer, and for any JSON number (or null, which
#: the checks above judge).
_INTEGER, _NUMBER = frozenset({int, type(None)}), frozenset({int, float, type(None)})
_BOOLEANS = frozenset({True, False})


def _suspect(values: tuple, kinds: frozenset[type]) -> bool:
    """Whether ``values`` may hold a value not of ``kinds``, cheaply (a pass in C): a float
    makes the sum of integers a float; a boolean equals 1 or 0, as 1.0 and 0 do. (A boolean
    among integers Arrow refuses itself.)"""
    try:
        if kinds is _NUMBER:
            return not _BOOLEANS.isdisjoint(values)
        return type(sum(values)) is not int
    except TypeError:  # a null among integers, or a value no number (a list, text)
        return not kinds.issuperset(map(type, values))


def _number_columns(table: str) -> tuple[tuple[int, frozenset[type]], ...]:
    """(index, kinds) of each column of ``table`` filled from a JSON number (but Kafka's own
    partition and offset)."""
    kafka = {name for name, _ in COORDINATES if name.startswith("kafka_")}
    return tuple((i, _NUMBER if pa.types.is_floating(kind) else _INTEGER)
                 for i, (name, kind) in enumerate(TABLES[table].columns)
                 if name not in kafka and (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                           or pa.types.is_timestamp(kind)))


_NUMBER_COLUMNS = {table: _number_columns(table) for table in CHECKS}


def mistyped(table: str, columns: list[tuple]) -> list[int]:
    """The indices of the rows of ``columns`` (a batch of ``table``'s rows, by column) with a
    number of another JSON kind than its column's: a boolean for any number, a float for an
    integer."""
    bad: set[int] = set()
    for i, kinds in _NUMBER_COLUMNS.get(table, ()):
        values = columns[i]
        if _suspect(values, kinds):
            bad.update(row for row, value in enumerate(values) if type(value) not in kinds)
    return sorted(bad)
