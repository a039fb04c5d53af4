"""From a Kafka record to one row of one base table. Pure: no I/O, no clock (but for a dead
letter stamped out of range, below).

Each record becomes exactly one row, so "every record landed once" is a row count. The row starts
with the record's coordinates (topic, partition, offset: the event's identity) and its event time;
what follows depends on the message (see ``analytics/schema.py`` for the columns).

A record the sink cannot decode does not stop it: it becomes a ``dead_letters`` row with
``consumer = 'analytics-sink'`` and the reason. The sink does not produce it to the dead-letter
topic, since the topic's own consumers already do (and the sink stores their dead letters too);
its row only keeps the record accounted for. Its time is the Kafka record's timestamp, so reading
the record again gives the same row; a timestamp out of the times messages accept (0 or before,
past ``MAX_EPOCH_MS``) is replaced by the sink's clock, its error saying so, so that the row is
kept and can be read (a flush written again after a crash, perhaps in another month, adds no
second row of it: ``dead_letters`` then gets only the records it does not hold,
``analytics/journal.py``).

The hot path (``TopicRows.tables``) decodes the frequent messages (request lifecycle, dispatches,
response chunks, heartbeats) with orjson straight into row tuples, with no pydantic object per
record, and lets Arrow check every value against its column as it builds the batch's columns.
A record that is not exactly as Governor's encoder writes it (a field missing or extra, another
schema version, a value that does not fit its column) takes the full pydantic path of
``record_row``, which gives the same row for a valid message and a dead-letter row with the
reason otherwise. The bounds within a column's type (an id's length, a count's maximum) and
the rules across fields its columns show (``step <= steps_total``) are checked per batch
(``analytics/bounds.py``), and a row out of them takes the full path too. A field its row does
not carry (a dispatched request's own, a heartbeat's interval figures: each route's ``unread``)
given otherwise than its default has the record judged by its model (pydantic's validation
alone, its row still built from the JSON) before its row is taken; the items of a list whose
row carries its length (a chunk's token ids, a request's block hashes) are checked as it is
counted. So the hot path stores exactly what the models take
(``tests/unit/analytics/test_fast_and_full_paths.py``).
"""

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_args

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pydantic_core import SchemaValidator

from analytics.bounds import mistyped, out_of_bounds
from analytics.schema import TABLES
from analytics.window import wall_clock_ms
from schemas.base import SCHEMA_VERSION, Message
from schemas.codec import DecodeError, decode
from schemas.commands import Command
from schemas.config import ConfigSet
from schemas.events import (
    ConfigApplied,
    ConfigRejected,
    DeadLetter,
    KvBlocksEvicted,
    KvBlocksStored,
    KvCacheCleared,
    RequestEvent,
    SignalSnapshot,
    WorkerStatus,
)
from schemas.limits import (
    MAX_BLOCK_HASH,
    MAX_DEAD_LETTER_RAW_BYTES,
    MAX_EPOCH_MS,
    MAX_REASON_CHARS,
    MAX_RECORD_BYTES,
    MAX_TOKEN_ID,
    MIN_BLOCK_HASH,
)
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicSpec

SINK_CONSUMER = "analytics-sink"
_COMMAND_COMMON = frozenset({"schema_version", "event_time_ms", "type", "command_id", "issued_by",
                             "reason"})
#: What pyarrow raises when a value does not fit its column.
_UNFIT = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)


class KafkaRecord(Protocol):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


# The frequent messages' columns come from their fields as a dict: the JSON object on the hot
# path, ``model_dump()`` of the validated message on the full path.

#: What the hot path writes for a field given as "" (or another empty value) whose None the
#: column stores as "": no check of ``analytics/bounds.py`` passes it, so such a record takes
#: the full path, which says why its model refuses it. (The full path never writes it.)
_GIVEN_EMPTY = "\x00"


def _or_empty(value: Any) -> Any:
    """An optional field's column: "" for None."""
    return "" if value is None else value or _GIVEN_EMPTY


#: A count the hot path gives a list or text sent as a JSON value of another type: it fits the
#: count columns (UInt32) and is over every bound they are checked to.
_UNCOUNTABLE = 2**32 - 1


_INTEGERS = frozenset({int})


def _count_of(least: int, most: int) -> Callable[[Any], int]:
    """The length of a JSON array of integers from ``least`` to ``most`` (token ids, block
    hashes), and ``_UNCOUNTABLE`` for one with another item, which the count's bound then
    sends down the full path (a pass in C over the items)."""
    def count(items: Any) -> int:
        if type(items) is not list:
            return _UNCOUNTABLE
        if items and not (_INTEGERS.issuperset(map(type, items))
                          and least <= min(items) and max(items) <= most):
            return _UNCOUNTABLE
        return len(items)
    return count


_token_ids, _block_hashes = _count_of(0, MAX_TOKEN_ID), _count_of(MIN_BLOCK_HASH, MAX_BLOCK_HASH)


def _flag(value: Any) -> int:
    """A boolean's column: 1 or 0, and 2 (out of its bounds) for anything but true or false,
    such as the 1 that ``int()`` would take."""
    return 1 if value is True else 0 if value is False else 2


def _request_event(f: dict[str, Any]) -> tuple:
    """A client's request or cancellation, or any lifecycle event: the fields it has, defaults
    elsewhere."""
    kind = f["type"]
    # (a failure or cancellation that names no attempt, from a writer older than the field,
    # has none: null, stored as 0, as a client's cancellation)
    attempt = f.get("attempt") if kind in ("failed", "cancelled") else f.get("attempt", 0)
    if kind in ("failed", "rejected"):
        reason, detail = f["reason"], f["detail"]
    elif kind in ("cancelled", "cancel_request"):
        reason, detail = "", f["reason"]  # free text: the client's own words
    else:
        reason, detail = "", f.get("detail", "")
    return (kind, f["request_id"], _or_empty(f.get("task_id")), f.get("tenant", ""),
            f.get("model", ""), _or_empty(f.get("worker_id")), attempt,
            f.get("priority", 0), f.get("step", 0), f.get("steps_total", 0),
            f.get("prompt_tokens", 0), f.get("max_tokens", 0), f.get("output_tokens", 0),
            f.get("cached_tokens", 0), f.get("tokens_done", 0), f.get("ttft_s"), f.get("e2e_s"),
            f.get("created_ms"), f.get("deadline_ms"), reason, f.get("finish_reason") or "",
            detail, f.get("retry_after_s"), f.get("ttft_slo_s"),
            _block_hashes(f.get("prefix_hashes", [])), f.get("block_size", 0))


def _dispatch(f: dict[str, Any]) -> tuple:
    r = f["request"]
    return ("dispatch", r["request_id"], _or_empty(r["task_id"]), r["tenant"], r["model"],
            f["worker_id"], f["slot"], f["attempt"], f["resume_from_token"], f["router_id"])


def _chunk(f: dict[str, Any]) -> tuple:
    text = f["text"]
    chars = 0 if text is None else len(text) if type(text) is str else _UNCOUNTABLE
    return (f["request_id"], f["worker_id"], f["attempt"], f["token_offset"],
            _token_ids(f["tokens"]), chars, _flag(f["final"]), _or_empty(f["finish_reason"]))


def _worker_status(f: dict[str, Any]) -> tuple:
    loaded = f["models_loaded"]  # (another JSON type: null, out of bounds)
    return (f["worker_id"], f["slot"], f["pool"], f["gpu_type"], f.get("gpus", 1),
            loaded if type(loaded) is list else None,
            f["state"], f["kv_blocks_used"], f["kv_blocks_free"], f["running"], f["waiting"],
            f["prefix_cache_queries"], f["prefix_cache_hits"], f["preemptions"],
            f["requests_completed"], f["started_ms"])


def _kv(m: KvBlocksStored | KvBlocksEvicted | KvCacheCleared) -> tuple:
    hashes = getattr(m, "block_hashes", ())
    return (m.type, m.worker_id, getattr(m, "block_size", 0), len(hashes))


def _signal(m: SignalSnapshot) -> tuple:
    return (m.scope, m.key, m.window_s, m.window_end_ms, list(m.values.items()))


def _command(m: Command) -> tuple:
    f = m.__dict__
    target = f.get("worker_id") or f.get("pool") or ""
    params = m.model_dump_json(exclude=set(_COMMAND_COMMON))
    return (m.type, m.command_id, m.issued_by, target, m.reason, params)


def _config(m: ConfigSet) -> tuple:
    value = json.dumps(m.value, sort_keys=True, separators=(",", ":"))
    return ("config_set", m.key, value, m.set_by, "", None, "")


def _config_outcome(m: ConfigApplied | ConfigRejected) -> tuple:
    return (m.type, m.key, "", "", m.component, m.config_offset, getattr(m, "reason", ""))


def _dead_letter(m: DeadLetter) -> tuple:
    return (m.source_topic, m.partition, m.offset, m.consumer, m.reason, m.error, m.key or b"",
            m.raw, m.raw_size)


def _cancel_on_dispatch(f: dict[str, Any]) -> tuple:
    return ("cancel_request", f["request_id"], "", "", "", "", 0, 0, 0, "")


@dataclass(frozen=True)
class Route:
    """Where a message class goes: its table, and its columns from the message (or, with
    ``from_fields``, from its fields as a dict). ``unread``: the fields those columns leave
    out (of whichever messages of the route have them), which the hot path cannot check on
    the columns."""

    table: str
    columns: Callable[[Any], tuple]
    from_fields: bool = False
    unread: tuple[str, ...] = ()


_ROUTES: tuple[tuple[type | tuple[type, ...], Route], ...] = (
    (ResponseChunk, Route("response_chunks", _chunk, from_fields=True)),
    (RequestEvent, Route("request_events", _request_event, from_fields=True,
                         unread=("engine_failed",))),
    (WorkerStatus, Route("worker_status", _worker_status, from_fields=True, unread=(
        "prefill_backlog_tokens", "prefill_context_tokens", "itl_ms", "steps",
        "prefilled_tokens", "generated_tokens", "max_model_len", "reply_progress"))),
    ((KvBlocksStored, KvBlocksEvicted, KvCacheCleared), Route("kv_events", _kv)),
    (Dispatch, Route("dispatches", _dispatch, from_fields=True,
                      unread=("request", "stream_partition"))),
    ((InferenceRequest, CancelRequest), Route("request_events", _request_event, from_fields=True,
                                              unread=("prompt_text", "prompt_token_ids",
                                                      "reply_to"))),
    (SignalSnapshot, Route("signals", _signal)),
    (Command, Route("control_commands", _command)),
    (ConfigSet, Route("config_changes", _config)),
    ((ConfigApplied, ConfigRejected), Route("config_changes", _config_outcome)),
    (DeadLetter, Route("dead_letters", _dead_letter)),
)
_CANCEL_ON_DISPATCH = Route("dispatches", _cancel_on_dispatch, from_fields=True,
                            unread=("attempt", "reason"))


def route(model: type, suffix: str) -> Route:
    """The route of a message class on a topic.

    ``suffix`` (the topic's catalog suffix) only matters for a cancellation, which the requests
    topic carries from the client and the dispatch topic forwards to a worker.
    """
    if issubclass(model, CancelRequest) and suffix == "dispatch":
        return _CANCEL_ON_DISPATCH
    for classes, found in _ROUTES:
        if issubclass(model, classes):
            return found
    raise TypeError(f"no analytics table for {model.__name__}")


def message_row(message: Message, suffix: str) -> tuple[str, tuple]:
    """The table and the columns after the coordinates for one decoded message."""
    found = route(type(message), suffix)
    return found.table, found.columns(message.model_dump() if found.from_fields else message)


#: What the error of a dead letter timed by the sink's clock says (``dead_letter_row``).
CLOCK_STAMPED = "stamped with the sink's clock"


def clock_stamped(table: str, data: pa.Table) -> bool:
    """Whether some rows of ``data`` (rows of ``table``) may have a time other than their
    records': a dead letter stamped with the sink's clock (``dead_letter_row``) has another
    time each time its record is read. (A dead letter another consumer wrote with these words
    in its error counts too: taken for one, it costs the journal a slower lookup, no more.)"""
    return table == "dead_letters" and data.num_rows > 0 and bool(
        pc.any(pc.match_substring(data["error"], CLOCK_STAMPED)).as_py())


def dead_letter_row(topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                    value: bytes | None, reason: str, detail: str) -> tuple[str, tuple]:
    """The ``dead_letters`` row that accounts for a record the sink cannot store as it is, at
    the record's timestamp; one out of the times messages accept (0 or before, past
    ``MAX_EPOCH_MS``: a producer may stamp any 64-bit time) at the sink's clock, its error
    saying so. (Before 7 Dec such a row expired at once, its TTL past or wrapped past 2106,
    or could not be read: int64's largest.)"""
    raw = value or b""
    if not 0 < timestamp_ms <= MAX_EPOCH_MS:
        said = f" (record timestamp {timestamp_ms} out of range: {CLOCK_STAMPED})"
        detail = detail[:MAX_REASON_CHARS - len(said)] + said
        timestamp_ms = wall_clock_ms()
    return "dead_letters", (topic, partition, offset, timestamp_ms, topic, partition,
                            offset, SINK_CONSUMER, reason, detail[:MAX_REASON_CHARS],
                            (key or b"")[:1024], raw[:MAX_DEAD_LETTER_RAW_BYTES], len(raw))


def record_row(spec: TopicSpec, topic: str, partition: int, offset: int, timestamp_ms: int,
               key: bytes | None, value: bytes | None) -> tuple[str, tuple]:
    """The table and full row for one Kafka record, validated by pydantic; an undecodable one
    becomes a dead letter."""
    try:
        message = decode(spec, value)
        table, columns = message_row(message, spec.suffix)
    except (DecodeError, TypeError) as exc:
        reason, detail = (exc.reason, exc.detail) if isinstance(exc, DecodeError) else (
            "no_analytics_table", str(exc))
        return dead_letter_row(topic, partition, offset, timestamp_ms, key, value, reason, detail)
    return table, (topic, partition, offset, message.event_time_ms, *columns)


def fitted_row(spec: TopicSpec, record: KafkaRecord) -> tuple[str, tuple]:
    """``record_row``, and a dead letter for a valid message whose values do not fit the table's
    columns (a count beyond the column's type), so that no record can stop a batch."""
    r = record
    table, row = record_row(spec, r.topic, r.partition, r.offset, r.timestamp, r.key, r.value)
    try:
        TABLES[table].to_arrow([row])
    except _UNFIT as exc:
        return dead_letter_row(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value,
                               "schema_violation", f"does not fit table {table}: {exc}")
    return table, row


def fast_routes(spec: TopicSpec) -> Iterator[tuple[type[Message], Route]]:
    """The messages of a topic whose rows the hot path builds from their fields, and their
    routes."""
    for model in spec.models:
        try:
            found = route(model, spec.suffix)
        except TypeError:
            continue
        if found.from_fields:
            yield model, found


@dataclass(frozen=True)
class _FastRoute:
    table: str
    columns: Callable[[dict[str, Any]], tuple]
    fields: frozenset[str]
    #: ``fields`` less those the encoder leaves out at their default (``exclude_if``), such as
    #: a request's first ``FirstToken`` without ``tokens_done``.
    lean: frozenset[str]
    #: The fields its row does not carry, and their defaults: a record that gives one of them
    #: otherwise is judged by its model before its row is taken (``TopicRows.row``).
    unread: tuple[tuple[str, Any], ...]
    #: Its model's validator, as ``decode`` runs it (strictly).
    judge: SchemaValidator


def _at_default(fields: dict[str, Any], unread: tuple[tuple[str, Any], ...]) -> bool:
    """Whether each field of ``unread`` is at its default in ``fields`` (of the same JSON type:
    ``0`` is no ``false``)."""
    for name, default in unread:
        value = fields[name]
        if value is not default and (type(value) is not type(default) or value != default):
            return False
    return True


def _unread(model: type[Message], found: Route) -> tuple[tuple[str, Any], ...]:
    fields = model.model_fields
    return tuple((name, fields[name].get_default(call_default_factory=True))
                 for name in found.unread if name in fields)


def _valid(fast: _FastRoute, value: bytes) -> bool:
    """Whether the model of ``value`` (a record whose row leaves out a field given otherwise
    than its default) takes it, as ``decode`` judges it."""
    try:
        fast.judge.validate_json(value, strict=True)
    except (ValueError, RecursionError):  # (pydantic's ValidationError is a ValueError)
        return False
    return True


class TopicRows:
    """The rows of one topic's records, fast: the sink's hot path (see the module doc)."""

    def __init__(self, spec: TopicSpec) -> None:
        self.spec = spec
        self._fast: dict[str, _FastRoute] = {}  # by the message's ``type``
        for model, found in fast_routes(spec):
            kind = get_args(model.model_fields["type"].annotation)[0]
            fields = model.model_fields
            self._fast[kind] = _FastRoute(
                found.table, found.columns, frozenset(fields),
                frozenset(n for n, f in fields.items() if f.exclude_if is None),
                _unread(model, found), model.__pydantic_validator__)

    def row(self, record: KafkaRecord) -> tuple[str, tuple]:
        """The table and row of one record: decoded by orjson when it is one of the frequent
        messages exactly as Governor writes it, by ``record_row`` otherwise."""
        value = record.value
        if value is not None and len(value) <= MAX_RECORD_BYTES:
            try:
                fields = orjson.loads(value)
                fast = self._fast[fields["type"]]
                version = fields["schema_version"]  # (true and 1.0 equal 1 too)
                if ((fields.keys() == fast.fields or fields.keys() == fast.lean)
                        and version == SCHEMA_VERSION and type(version) is int
                        and (not fast.unread or _at_default(fields, fast.unread)
                             or _valid(fast, value))):
                    return fast.table, (record.topic, record.partition, record.offset,
                                        fields["event_time_ms"], *fast.columns(fields))
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
                pass  # not a frequent message as Governor writes it: the full path says why
        return record_row(self.spec, record.topic, record.partition, record.offset,
                          record.timestamp, record.key, value)

    def tables(self, records: Sequence[KafkaRecord]) -> dict[str, pa.Table]:
        """The rows of consecutive records of one partition as Arrow tables, by table.

        Arrow checks each value against its column's type; if a table's rows do not all fit,
        each of its records takes the full path (``fitted_row``) instead, as does each row
        with a number of another JSON kind than its column's, or a value out of its field's
        bounds (``analytics/bounds.py``).
        """
        grouped: dict[str, tuple[list[tuple], list[KafkaRecord]]] = {}
        for record in records:
            table, row = self.row(record)
            group = grouped.get(table)
            if group is None:
                group = grouped[table] = ([], [])
            group[0].append(row)
            group[1].append(record)
        arrow: dict[str, pa.Table] = {}
        unfit: list[KafkaRecord] = []
        for table, (rows, originals) in grouped.items():
            spec = TABLES[table]
            try:
                columns = spec.columns_of(rows)
                wrong = mistyped(table, columns)
                if wrong:  # (as rare as bad input)
                    unfit.extend(originals[i] for i in wrong)
                    right = sorted(set(range(len(rows))).difference(wrong))
                    rows, originals = [rows[i] for i in right], [originals[i] for i in right]
                    if not rows:
                        continue
                    columns = spec.columns_of(rows)
                built = spec.from_columns(columns)
            except _UNFIT:
                unfit.extend(originals)
                continue
            suspects = out_of_bounds(table, built)
            if suspects:  # (as rare as bad input: the full path says which are valid)
                unfit.extend(originals[i] for i in suspects)
                if len(suspects) == built.num_rows:
                    continue
                kept = set(range(built.num_rows)).difference(suspects)
                built = built.take(sorted(kept))
            arrow[table] = built
        if unfit:
            unfit.sort(key=lambda r: r.offset)
            refitted: dict[str, list[tuple]] = {}
            for record in unfit:
                table, row = fitted_row(self.spec, record)
                refitted.setdefault(table, []).append(row)
            for table, rows in refitted.items():
                fitted = TABLES[table].to_arrow(rows)
                arrow[table] = (pa.concat_tables([arrow[table], fitted]).sort_by("kafka_offset")
                                if table in arrow else fitted)
        return arrow
