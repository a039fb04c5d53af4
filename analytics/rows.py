"""From a Kafka record to one row of one base table. Pure: no I/O, no clock.

Each record becomes exactly one row, so "every record landed once" is a row count. The row starts
with the record's coordinates (topic, partition, offset: the event's identity) and its event time;
what follows depends on the message (see ``analytics/schema.py`` for the columns).

A record the sink cannot decode does not stop it: it becomes a ``dead_letters`` row with
``consumer = 'analytics-sink'``. The sink does not produce it to the dead-letter topic, since the
topic's own consumers already do; its row only keeps the record accounted for. Its time is the
Kafka record's timestamp, so reading the record again gives the same row.
"""

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from schemas.base import Message
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
from schemas.limits import MAX_DEAD_LETTER_RAW_BYTES, MAX_RECORD_BYTES
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicSpec

SINK_CONSUMER = "analytics-sink"
_COMMAND_COMMON = frozenset({"schema_version", "event_time_ms", "type", "command_id", "issued_by",
                             "reason"})


def _request_event(m: Message) -> tuple:
    """A client's request or cancellation, or any lifecycle event: the fields it has, defaults
    elsewhere."""
    f: dict[str, Any] = m.__dict__
    if m.type in ("failed", "rejected"):
        reason, detail = f["reason"], f["detail"]
    elif m.type in ("cancelled", "cancel_request"):
        reason, detail = "", f["reason"]  # free text: the client's own words
    else:
        reason, detail = "", f.get("detail", "")
    return (m.type, f["request_id"], f.get("task_id") or "", f.get("tenant", ""),
            f.get("model", ""), f.get("worker_id") or "", f.get("attempt", 0),
            f.get("priority", 0), f.get("step", 0), f.get("steps_total", 0),
            f.get("prompt_tokens", 0), f.get("max_tokens", 0), f.get("output_tokens", 0),
            f.get("cached_tokens", 0), f.get("tokens_done", 0), f.get("ttft_s"), f.get("e2e_s"),
            f.get("created_ms"), f.get("deadline_ms"), reason, f.get("finish_reason") or "",
            detail, f.get("retry_after_s"), f.get("ttft_slo_s"), len(f.get("prefix_hashes", ())),
            f.get("block_size", 0))


def _dispatch(m: Dispatch) -> tuple:
    r = m.request
    return ("dispatch", r.request_id, r.task_id or "", r.tenant, r.model, m.worker_id, m.slot,
            m.attempt, m.resume_from_token, m.router_id)


def _chunk(m: ResponseChunk) -> tuple:
    return (m.request_id, m.worker_id, m.attempt, m.token_offset, len(m.tokens),
            len(m.text) if m.text else 0, int(m.final), m.finish_reason or "")


def _worker_status(m: WorkerStatus) -> tuple:
    return (m.worker_id, m.slot, m.pool, m.gpu_type, list(m.models_loaded), m.state,
            m.kv_blocks_used, m.kv_blocks_free, m.running, m.waiting, m.prefix_cache_queries,
            m.prefix_cache_hits, m.preemptions, m.requests_completed, m.started_ms)


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


def _cancel_on_dispatch(m: CancelRequest) -> tuple:
    return ("cancel_request", m.request_id, "", "", "", "", 0, 0, 0, "")


_ROUTES: tuple[tuple[type | tuple[type, ...], str, Callable[..., tuple]], ...] = (
    (ResponseChunk, "response_chunks", _chunk),
    (RequestEvent, "request_events", _request_event),
    (WorkerStatus, "worker_status", _worker_status),
    ((KvBlocksStored, KvBlocksEvicted, KvCacheCleared), "kv_events", _kv),
    (Dispatch, "dispatches", _dispatch),
    ((InferenceRequest, CancelRequest), "request_events", _request_event),
    (SignalSnapshot, "signals", _signal),
    (Command, "control_commands", _command),
    (ConfigSet, "config_changes", _config),
    ((ConfigApplied, ConfigRejected), "config_changes", _config_outcome),
    (DeadLetter, "dead_letters", _dead_letter),
)


def route(model: type, suffix: str) -> tuple[str, Callable[..., tuple]]:
    """The table of a message class on a topic, and the function giving the row's columns.

    ``suffix`` (the topic's catalog suffix) only matters for a cancellation, which the requests
    topic carries from the client and the dispatch topic forwards to a worker.
    """
    if issubclass(model, CancelRequest) and suffix == "dispatch":
        return "dispatches", _cancel_on_dispatch
    for classes, table, columns in _ROUTES:
        if issubclass(model, classes):
            return table, columns
    raise TypeError(f"no analytics table for {model.__name__}")


def message_row(message: Message, suffix: str) -> tuple[str, tuple]:
    """The table and the columns after the coordinates for one decoded message."""
    table, columns = route(type(message), suffix)
    return table, columns(message)


def record_row(spec: TopicSpec, topic: str, partition: int, offset: int, timestamp_ms: int,
               key: bytes | None, value: bytes | None) -> tuple[str, tuple]:
    """The table and full row for one Kafka record; an undecodable one becomes a dead letter."""
    try:
        message = decode(spec, value)
        table, columns = message_row(message, spec.suffix)
    except (DecodeError, TypeError) as exc:
        reason, detail = (exc.reason, exc.detail) if isinstance(exc, DecodeError) else (
            "no_analytics_table", str(exc))
        raw = value or b""
        return "dead_letters", (topic, partition, offset, max(timestamp_ms, 0), topic, partition,
                                offset, SINK_CONSUMER, reason, detail, (key or b"")[:1024],
                                raw[:MAX_DEAD_LETTER_RAW_BYTES], len(raw))
    return table, (topic, partition, offset, message.event_time_ms, *columns)


class TopicRows:
    """``record_row`` for the records of one topic, fast: the sink's hot path.

    It validates with the topic's adapter directly and remembers each message class's route;
    anything unusual (no value, too large, invalid, unmapped) takes ``record_row``'s path, so the
    rows are the same either way.
    """

    def __init__(self, spec: TopicSpec) -> None:
        self.spec = spec
        self._validate = spec.adapter.validate_json
        self._routes: dict[type, tuple[str, Callable[..., tuple]]] = {}

    def row(self, topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
            value: bytes | None) -> tuple[str, tuple]:
        if value is None or len(value) > MAX_RECORD_BYTES:
            return record_row(self.spec, topic, partition, offset, timestamp_ms, key, value)
        try:
            message = self._validate(value)
            table, columns = self._routes[type(message)]
        except KeyError:
            try:
                table, columns = route(type(message), self.spec.suffix)
                self._routes[type(message)] = (table, columns)
            except TypeError:
                return record_row(self.spec, topic, partition, offset, timestamp_ms, key, value)
        except (ValidationError, ValueError, RecursionError):
            return record_row(self.spec, topic, partition, offset, timestamp_ms, key, value)
        return table, (topic, partition, offset, message.event_time_ms, *columns(message))
