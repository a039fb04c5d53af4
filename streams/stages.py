"""The signal pipeline's stages over keyed state, with the routing between them. Pure.

Four keyed stages, each over a mapping that is a Faust table in production and a dict in the
in-memory pipeline (``streams.pipeline``) that the tests use:

1. ``ingest`` reads the telemetry and requests topics (keyed by request_id, or worker_id for
   WorkerStatus) and the ``by-worker`` repartition topic. It keeps the request book (keyed
   request_id) and the worker book (keyed worker_id).
2. ``by-worker`` carries what a request's events mean for its worker (observations for the
   worker's ``worker:`` and ``pool:`` scopes, attempt ends to be costed), keyed by worker_id, so
   it is co-partitioned with that worker's heartbeats.
3. ``by-task`` carries step outcomes and attempt costs keyed by task_id: the task book's input.
4. ``by-scope`` carries observations keyed by scope key (``tenant:acme``): the window book's input.

Every observation carries the identity of the record it came from: ``(source, offset, index)``
where source is the topic code and partition (``t2``: telemetry partition 2; ``r2:worker-1``:
relayed from telemetry partition 2 through worker-1's by-worker partition). Replays and re-sends
keep their identity, which is how the window book counts each observation once: it drops one at
or below the highest identity it has applied from that source.

An observation's index is its place among the record's outputs to the same key (its scope key;
its worker, relayed), not among all the record's outputs: those before it depend on what the
books held (a request forgotten since has no attempt to end, so a crash's replay of its
completion sends no attempt end before it; a worker's first heartbeat sends on what was relayed
to it before, and a replay may read the relay after it). Before 7 Dec it was its place among all
of them (a relayed one's until earlier that day), and a replay sent it under another identity:
a higher one was counted twice (a heartbeat's ``model:`` observation), and a relayed one was
held twice for a worker not heard from yet, and counted twice in ``pool_observations_dropped``.

A sweep's outputs have a source of their own (``t2:sweep``, ``k2:sweep``), so no index a record
used (up to ``j * SUB_INDEX`` and more for its ``j``-th payload) can be theirs. A sweep is no
record, and when it runs depends on where the batches split, which a replay does differently:

* a task's close (``k2:sweep``) has the identity of the task: its close time for offset, a
  digest of its key for index, so a task closed again in a replay (the close was sent, the
  worker crashed before it wrote the task back) counts once. A sweep closes its tasks earliest
  first, and the next closes only tasks due after it, so the identities grow. A task due before
  the sweep before it (first heard of more than ``task_idle_timeout_s`` behind its partition's
  event time) would close below closes counted already, and be dropped as seen: its close has
  the source ``k2:late`` and the sweep's event time for offset;
* the workers' sweep (``t2:sweep``) has its partition's event time for offset: a partition's
  sweeps run at increasing event times.
"""

import hashlib
from collections import Counter
from collections.abc import Iterable, MutableMapping
from functools import lru_cache
from typing import Any, NamedTuple

from aiokafka.partitioner import murmur2

from schemas.errors import TerminalError
from schemas.events import SignalSnapshot, WorkerStatus
from schemas.requests import InferenceRequest
from schemas.topics import LIFECYCLE_EVENTS
from streams.settings import StreamsSettings, Taken
from streams.signals.book import TOTAL, WindowBook
from streams.signals.outputs import Out, split_scope_key
from streams.signals.requests import RequestBook
from streams.signals.tasks import TaskBook
from streams.signals.workers import EXACT_S, WorkerBook

_REQUEST_EVENTS = (*LIFECYCLE_EVENTS, InferenceRequest)
#: Indices of a repartition record's ``j``-th payload's outputs start at ``j * SUB_INDEX``.
SUB_INDEX = 1000
#: The indices of a task's close observations are ``digest * _CLOSE_OUTS + j``.
_CLOSE_OUTS = 16
_WATERMARK = "~wm|"
#: How often (event time, per partition) the window stage looks for idle scope keys to forget:
#: it reads every key of the table, and keys are kept for an hour by default.
_FORGET_EVERY_MS = 60_000


def _task_digest(key: str) -> int:
    """40 bits of a task key's hash: stable from one process to the next, unlike ``hash``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=5).digest(), "big")


@lru_cache(maxsize=65_536)
def partition_of(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as aiokafka and Java) gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def time_key(source: tuple[str, int]) -> str:
    """The key of a source partition's event time (``("t", 2)``: ``t|2``)."""
    code, partition = source
    return f"{code}|{partition}"


class FutureEvent(TerminalError):
    """A source event stamped further ahead of the streams' clock than they accept."""


class Send(NamedTuple):
    """A record for a repartition topic: ``by-worker``, ``by-task`` or ``by-scope``."""

    route: str
    key: str
    value: Any  # by-worker, by-task: a payload dict; by-scope: [source, offset, index, obs]


class Stages:
    def __init__(self, settings: StreamsSettings, requests: MutableMapping, workers: MutableMapping,
                 tasks: MutableMapping, windows: MutableMapping,
                 times: MutableMapping | None = None) -> None:
        self.settings = settings
        self.request_book = RequestBook(requests, settings.slo, settings.request_retention_s)
        # a worker is kept while an attempt may still end on it (its request kept open, the
        # end relayed behind), and while the fleet view still shows it
        idle_s = max(settings.scope_retention_s, self.request_book.idle_retention_ms / 1000)
        self.worker_book = WorkerBook(workers, settings.gpu_prices_usd_per_hour,
                                      settings.max_heartbeat_gap_s, idle_s + EXACT_S,
                                      settings.replay_s)
        self.task_book = TaskBook(tasks, settings.task_idle_timeout_s, settings.task_retention_s)
        self.window_book = WindowBook(windows, settings.policy)
        self._forgot: dict[int, int] = {}  # partition -> watermark of its last look for idle keys
        #: Each telemetry and by-task partition's event time (its records, its sweeps, and the
        #: clock's moves of it while idle: ``move_on``): the books apply a record to an entry
        #: as the partition's sweep would leave it at that time. The one copy of it: the app's
        #: sweeps follow it too. Keyed ``t|2``, ``k|2`` (``time_key``) in ``times``, the app's
        #: table of them, so that a new worker restores them with the entries they cover, and a
        #: record the stages fail on is undone there with its other writes (``streams.app``).
        self._times: MutableMapping[str, int] = {} if times is None else times
        self.heartbeat_timeout_s = settings.heartbeat_timeout_s

    def use_config(self, taken: Taken) -> None:
        """GPU prices, the SLO of requests that state none and the heartbeat timeout, from now
        on (``streams.config_feed``)."""
        self.worker_book.prices = dict(taken.prices_usd_per_hour)
        self.request_book.slo = taken.slo
        self.heartbeat_timeout_s = taken.heartbeat_timeout_s

    # -- ingest, by-worker, by-task ------------------------------------------------------------

    def ingest(self, code: str, partition: int, offset: int, key: str | None, value: Any,
               first_index: int = 0, now_ms: int | None = None) -> list[Send]:
        """One record of telemetry (``t``), requests (``q``), by-worker (``w``) or by-task
        (``k``); returns what to send on. A repartition record carries several payloads: the
        ``j``-th is ingested with ``first_index = j * SUB_INDEX`` so their outputs' identities
        differ (one payload makes at most four observations).

        ``now_ms``: the streams' clock. A telemetry or requests event stamped more than
        ``max_event_ahead_s`` after it raises ``FutureEvent`` and changes nothing (the caller
        dead-letters it); repartition records carry only times of events already accepted."""
        if code in ("t", "q"):
            ahead_ms = value.event_time_ms - now_ms if now_ms is not None else 0
            if ahead_ms > self.settings.max_event_ahead_s * 1000:
                raise FutureEvent(
                    f"event_time_ms {value.event_time_ms} is {ahead_ms:,} ms ahead of the "
                    f"streams' clock ({now_ms}); at most max_event_ahead_s = "
                    f"{self.settings.max_event_ahead_s:g} s is accepted")
            if code == "t":
                self.move_on(("t", partition), value.event_time_ms)
            if isinstance(value, WorkerStatus):
                outs = self.worker_book.heartbeat(value,
                                                  self._times.get(time_key(("t", partition))))
            elif isinstance(value, _REQUEST_EVENTS):
                outs = self.request_book.apply(value)
            else:  # a cancellation (the router's business), a configuration applied or
                return []  # rejected: no signal of their own
        elif code == "w":
            outs = self.worker_book.relay(key, value,
                                          self._times.get(time_key(("t", partition))))
        elif code == "k":
            outs = self.task_book.apply(key, value, self.move_on(("k", partition), value["t"]))
        else:
            raise ValueError(f"unknown source code {code!r}")
        return self._route(outs, f"{code}{partition}", offset, partition, first_index)

    def _route(self, outs: list[Out], source: str, offset: int, partition: int,
               first_index: int = 0) -> list[Send]:
        sends, places = [], Counter()  # (route, key) -> the record's outputs to it so far

        def index(out: Out) -> int:
            """``out``'s place among the record's outputs to its key (see the module's doc)."""
            places[out.route, out.key] += 1
            return first_index + places[out.route, out.key] - 1

        for out in outs:
            if out.route == "scope":
                src, off, idx = out.origin or (source, offset, index(out))
                sends.append(Send("scope", out.key, [src, off, idx, out.payload]))
            elif out.route == "worker" and out.payload["k"] == "obs":
                origin = [f"r{partition}:{out.key}", offset, index(out)]
                sends.append(Send("worker", out.key, {**out.payload, "org": origin}))
            else:
                sends.append(Send(out.route, out.key, out.payload))
        return sends

    def sweep_requests(self, keys: Iterable[str], watermark_ms: int) -> list[str]:
        return self.request_book.sweep(keys, watermark_ms)

    def sweep_workers(self, keys: Iterable[str], watermark_ms: int, partition: int) -> list[Send]:
        """Charge what waits on workers gone silent (``watermark_ms``: their partition's, at
        which its sweeps run in increasing order: it is their outputs' offset)."""
        self.move_on(("t", partition), watermark_ms)
        outs = self.worker_book.sweep(keys, watermark_ms)
        return self._route(outs, f"t{partition}:sweep", watermark_ms, partition)

    def sweep_tasks(self, keys: Iterable[str], watermark_ms: int, partition: int,
                    after_ms: int = 0) -> list[Send]:
        """Time out idle tasks (and forget closed ones), earliest close first, each close with
        the identity of its task and close time. ``after_ms``: the watermark of the partition's
        sweep before (0: none known); a close before it is late (see the module's doc)."""
        self.move_on(("k", partition), watermark_ms)
        closes, late = [], []
        for key in keys:
            outs, _gone = self.task_book.sweep([key], watermark_ms)
            if outs:
                t = outs[0].payload["t"]
                (closes if t >= after_ms else late).append((t, _task_digest(key), outs))
        closes.sort(key=lambda close: close[:2])
        source = f"k{partition}:sweep"
        routed = [out._replace(origin=(source, t, digest * _CLOSE_OUTS + j))
                  for t, digest, outs in closes for j, out in enumerate(outs)]
        sends = self._route(routed, source, 0, partition)
        late_outs = [out for _t, _digest, outs in sorted(late, key=lambda c: c[:2]) for out in outs]
        return sends + self._route(late_outs, f"k{partition}:late", watermark_ms, partition)

    def event_time(self, source: tuple[str, int]) -> int:
        """The event time of ``source`` (``("t", 2)``: telemetry partition 2; ``("k", 2)``:
        by-task), 0 before its first record: what its sweeps run at."""
        return self._times.get(time_key(source), 0)

    def move_on(self, source: tuple[str, int], t: int) -> int:
        """Move the event time of ``source`` on to ``t`` (a record's, a sweep's, or the clock's
        for a partition gone idle); return it. Written only when it moves: each write is a
        changelog record."""
        before = self.event_time(source)
        if t <= before:
            return before
        self._times[time_key(source)] = t
        return t

    # -- by-scope ------------------------------------------------------------------------------

    @staticmethod
    def is_watermark(table_key: Any) -> bool:
        """Whether a windows table key is a partition's watermark, which covers its keys'
        entries: written back after them (``StagedTable.written_last``)."""
        return isinstance(table_key, str) and table_key.startswith(_WATERMARK)

    def watermark(self, partition: int) -> int:
        return self.window_book.table.get(f"{_WATERMARK}{partition}", 0)

    def observe(self, partition: int, scope_key: str, items: list[list],
                arrivals: list[int] | None = None) -> int:
        """Apply one record's observations of ``scope_key`` (``observe_key``), then forget the
        partition's idle keys if due (``forget_due``); return how many were new."""
        applied = self.observe_key(partition, scope_key, items, arrivals)
        self.forget_due(partition)
        return applied

    def observe_key(self, partition: int, scope_key: str, items: list[list],
                    arrivals: list[int] | None = None) -> int:
        """Apply observations of ``scope_key``, forgetting no key; return how many were new.
        ``arrivals``: the partition's event time as each arrived, its own included (a batch's,
        ``arrivals``); default: they are the partition's next items, in order. A batch applies
        its keys' groups with this, then ``forget_due`` once: before 7 Dec each group forgot
        the keys idle at its newest, and a key whose observation came earlier in the batch,
        grouped later, was forgotten before it was applied (its total started anew)."""
        if arrivals is None:
            arrivals = self.arrivals(partition, items)
        watermark = max(self.watermark(partition), arrivals[-1])
        self.window_book.table[f"{_WATERMARK}{partition}"] = watermark
        applied = self.window_book.observe_many(scope_key, items, watermark, arrivals)
        self.window_book.expire(scope_key, watermark)
        return applied

    def forget_due(self, partition: int) -> list[str]:
        """Forget the idle keys of ``partition`` (``forget_idle``) if its watermark has moved
        ``_FORGET_EVERY_MS`` since the last look; return them."""
        watermark = self.watermark(partition)
        if watermark < self._forgot.get(partition, 0) + _FORGET_EVERY_MS:
            return []
        self._forgot[partition] = watermark
        return self.forget_idle(partition, watermark)

    def arrivals(self, partition: int, items: Iterable[list]) -> list[int]:
        """The event time of ``partition`` as each of ``items``, its next, arrives: an item is
        judged late against the items read before it, not those read after it in its batch."""
        out, watermark = [], self.watermark(partition)
        for item in items:
            watermark = max(watermark, item[3]["t"])
            out.append(watermark)
        return out

    def advance(self, partition: int, watermark_ms: int) -> None:
        """Move the event time of ``partition``, gone idle, on to ``watermark_ms`` (with the
        clock, ``streams.app``'s idle sweep): its keys' windows empty as time passes, as they
        would had records kept coming, instead of repeating their last values."""
        if watermark_ms > self.watermark(partition):
            self.window_book.table[f"{_WATERMARK}{partition}"] = watermark_ms
            self.forget_due(partition)

    def forget_idle(self, partition: int, watermark_ms: int) -> list[str]:
        """Forget the scope keys of ``partition`` idle for ``scope_retention_s`` at the oldest
        time an observation may still have and be on time, the allowed lateness before its
        watermark (their windows and running totals); return them.

        An observation on time can then only start a new running total (``observe_many``)
        whether or not its key was forgotten, so forgetting, which runs whenever a batch ends
        past a minute of event time, decides nothing. Judged at the watermark itself, a key
        forgotten there kept or lost what came before its next observation, less than
        ``scope_retention_s`` after its last but arriving behind another key's that moved the
        watermark on, by where the batches ended (before 7 Dec). A late observation still may:
        less than ``scope_retention_s`` after its key's last, it continues the total if the key
        was not forgotten yet, and starts a new one if it was (and one replayed after a crash
        counts again if it was: the identities went with the key). That is left to the
        batching, as its windows are to lateness: deciding it exactly would keep a trace of
        every key forgotten, which forgetting is there to drop."""
        book, suffix, n = self.window_book, f"|{TOTAL}", self.settings.partitions
        horizon = watermark_ms - int(self.settings.allowed_lateness_s * 1000)
        idle = []
        for key in (k[: -len(suffix)] for k in list(book.table) if k.endswith(suffix)):
            if partition_of(key, n) != partition:
                continue
            if book.idle(key, horizon):
                book.forget(key)
                idle.append(key)
            else:  # (and of a key kept, the sources it has heard nothing from as long)
                book.forget_sources(key, horizon)
        return idle

    # -- publication ---------------------------------------------------------------------------

    def snapshots(self, partitions: set[int] | None, now_ms: int) -> list[SignalSnapshot]:
        """Every window of every scope key in ``partitions`` (all when None) at its partition's
        watermark, but those idle for ``scope_retention_s`` at the newest watermark of them: a
        key of a partition that no longer receives anything is not forgotten (``forget_idle``
        runs as a partition's event time passes), but its series must still make room."""
        out = []
        suffix = f"|{TOTAL}"
        n = self.settings.partitions
        newest = max((self.watermark(p) for p in (range(n) if partitions is None else partitions)),
                     default=0)
        for table_key in list(self.window_book.table):
            if not table_key.endswith(suffix):
                continue
            key = table_key[: -len(suffix)]
            partition = partition_of(key, n)
            if partitions is not None and partition not in partitions:
                continue
            if self.window_book.idle(key, newest):
                continue
            scope, name = split_scope_key(key)
            watermark = self.watermark(partition)
            for window_s, end_ms, values in self.window_book.snapshots(key, watermark):
                out.append(SignalSnapshot(event_time_ms=now_ms, scope=scope, key=name,
                                          window_s=window_s, window_end_ms=end_ms, values=values))
        return out

    def fleet_view(self, partitions: set[int] | None, now_ms: int) -> list[SignalSnapshot]:
        """Each worker's last status and its age, as ``fleet`` snapshots keyed by worker id; a
        worker silent for ``scope_retention_s`` no longer (gone for good, as an idle key)."""
        out = []
        timeout_ms = int(self.heartbeat_timeout_s * 1000)
        for worker_id in list(self.worker_book.table):
            if partitions is not None and partition_of(
                    worker_id, self.settings.partitions) not in partitions:
                continue
            values = self.worker_book.fleet_view(worker_id, now_ms, timeout_ms)
            if values is not None and values["age_s"] <= self.settings.scope_retention_s:
                out.append(SignalSnapshot(event_time_ms=now_ms, scope="fleet", key=worker_id,
                                          window_s=self.settings.tick_s, window_end_ms=now_ms,
                                          values=values))
        return out

