"""The stages wired in memory: the same routing as on Kafka, with dicts for tables. Pure.

Records get a partition from the same murmur2 partitioner and an offset per partition, and flow
through the same repartition steps (by-worker, by-task, by-scope) in order, so the tests see
exactly the signals the Faust workers compute. ``replay`` processes records
again under their original offsets, as a Faust worker does after a crash. Given a ``clock``
(epoch milliseconds), it refuses source events stamped more than ``max_event_ahead_s`` ahead of
it as the Faust workers do, into ``dead_letters``; without one it takes every event.
"""

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.base import Message
from schemas.events import SignalSnapshot, WorkerStatus
from streams.settings import StreamsSettings
from streams.stages import FutureEvent, Stages, partition_of

_CODES = {"worker": "w", "task": "k", "scope": "s"}


@dataclass(frozen=True, slots=True)
class Record:
    code: str
    partition: int
    offset: int
    key: str
    value: Any


class Pipeline:
    def __init__(self, settings: StreamsSettings | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self.settings = settings or StreamsSettings()
        self.clock = clock
        #: Source records refused, with why (the Faust workers' dead letters).
        self.dead_letters: list[tuple[Record, str]] = []
        self.tables: dict[str, dict] = {n: {} for n in ("requests", "workers", "tasks", "windows")}
        self.stages = Stages(self.settings, **self.tables)
        self.log: list[Record] = []
        self._offsets: dict[tuple[str, int], int] = defaultdict(int)
        self._queue: deque[Record] = deque()
        self._swept: dict[int, int] = {}  # partition -> watermark of its last sweep

    def send(self, *messages: Message, topic: str = "telemetry") -> None:
        """Produce source messages (telemetry or requests) and process everything they cause."""
        for message in messages:
            key = (message.worker_id if isinstance(message, WorkerStatus)
                   else getattr(message, "request_id", None) or getattr(message, "key", ""))
            self._append("t" if topic == "telemetry" else "q", key, message)
        self.drain()

    def _append(self, code: str, key: str, value: Any) -> None:
        partition = partition_of(key, self.settings.partitions)
        offset = self._offsets[(code, partition)]
        self._offsets[(code, partition)] += 1
        record = Record(code, partition, offset, key, value)
        self.log.append(record)
        self._queue.append(record)

    def drain(self) -> None:
        while self._queue:
            self._process(self._queue.popleft())

    def _process(self, record: Record) -> None:
        if record.code == "s":
            self.stages.observe(record.partition, record.key, [record.value])
            return
        now_ms = self.clock() if self.clock is not None else None
        try:
            sends = self.stages.ingest(record.code, record.partition, record.offset, record.key,
                                       record.value, now_ms=now_ms)
        except FutureEvent as exc:
            self.dead_letters.append((record, str(exc)))
            return
        for send in sends:
            self._append(_CODES[send.route], send.key, send.value)

    def replay(self, records: list[Record]) -> None:
        """Process records again with their original partitions and offsets (a crash replay)."""
        self._queue.extend(records)
        self.drain()

    def sweep(self, watermark_ms: int) -> None:
        """Time out idle tasks, charge silent workers and forget old requests, in every
        partition, as if each partition's newest event were at ``watermark_ms``."""
        for partition in range(self.settings.partitions):
            keys = [k for k in self.tables["tasks"]
                    if partition_of(k, self.settings.partitions) == partition]
            before = self._swept.get(partition, 0)
            self._swept[partition] = max(before, watermark_ms)
            for send in self.stages.sweep_tasks(keys, watermark_ms, partition, before):
                self._append(_CODES[send.route], send.key, send.value)
            self.stages.sweep_requests(
                [k for k in self.tables["requests"]
                 if partition_of(k, self.settings.partitions) == partition], watermark_ms)
            workers = [k for k in self.tables["workers"]
                       if partition_of(k, self.settings.partitions) == partition]
            for send in self.stages.sweep_workers(workers, watermark_ms, partition):
                self._append(_CODES[send.route], send.key, send.value)
        self.drain()

    def snapshots(self, now_ms: int = 0) -> list[SignalSnapshot]:
        return self.stages.snapshots(None, now_ms)

    def values(self, scope_key: str, window_s: float | None = None) -> dict[str, float]:
        """The values of one scope key's window (``None``: the running total)."""
        scope, _, name = scope_key.partition(":")
        found = [s for s in self.snapshots() if s.scope == scope and s.key == name]
        if not found:
            return {}
        if window_s is None:
            return found[-1].values
        return next(s.values for s in found if s.window_s == window_s)
