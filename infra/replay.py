"""Replay a trace: turn its requests into InferenceRequests and produce them on time."""

import asyncio
import bisect
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from infra.bus import Outbox, Undelivered, from_now, make_producer, now_ms, take_on_added
from infra.delivery import DELIVERY_S, stop_within
from pydantic import ValidationError

from infra.sim.arrivals import Arrivals
from infra.sim.requests import earliest_arrivals, in_arrival_order, previous_steps
from infra.sim.slo import SloRule
from infra.traces import TraceError, TraceRequest, request_row
from schemas.codec import DecodeError, decode
from schemas.config import SloConfig
from schemas.errors import GovernorError
from schemas.events import TERMINAL_EVENT_TYPES
from schemas.requests import InferenceRequest
from schemas.limits import MAX_ID_CHARS
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


def to_request(item: TraceRequest, request_id: str, created_ms: int,
               run_id: str | None = None) -> InferenceRequest:
    """The InferenceRequest a trace row stands for, created at ``created_ms``; its task id is
    ``<run_id>-<task id>`` given a ``run_id`` (a task of one run is not the same task's steps
    in another: the router fails a task's later steps once one is refused)."""
    deadline_ms = None
    if item.deadline_s is not None:
        deadline_ms = created_ms + int(item.deadline_s * 1000)
    return InferenceRequest(
        event_time_ms=created_ms,
        created_ms=created_ms,
        request_id=request_id,
        task_id=_run_task_id(run_id, item.task_id) if item.task_id and run_id else item.task_id,
        step=item.step,
        steps_total=item.steps_total,
        tenant=item.tenant,
        priority=item.priority,
        model=item.model,
        prompt_tokens=item.prompt_tokens,
        prefix_hashes=list(item.hash_ids),
        block_size=item.block_size,
        # Traces record what was generated; a few rows record 0 tokens, which we serve as 1.
        max_tokens=max(1, item.output_tokens),
        ttft_slo_s=item.ttft_slo_s,
        deadline_ms=deadline_ms,
    )


#: The hex digits of the digest that stands for a task id too long to join to its run id.
_TASK_DIGEST = 32


def _run_task_id(run_id: str, task_id: str) -> str:
    """``<run_id>-<task_id>``, or, where that is longer than an id may be, ``<run_id>-`` and a
    digest of the task id (the same for every step of the task); with a run id too long for
    that too (``--run-id`` takes up to 121 characters), as much of the run id as fits and a
    digest of the run and the task (a valid task id is not refused for its run id's length)."""
    joined = f"{run_id}-{task_id}"
    if len(joined) <= MAX_ID_CHARS or len(task_id) > MAX_ID_CHARS:  # (too long alone: refused)
        return joined
    keep = MAX_ID_CHARS - _TASK_DIGEST - 1
    if len(run_id) <= keep:
        return f"{run_id}-{hashlib.sha256(task_id.encode()).hexdigest()[:_TASK_DIGEST]}"
    digest = hashlib.sha256(f"{run_id}\0{task_id}".encode()).hexdigest()[:_TASK_DIGEST]
    return f"{run_id[:keep]}-{digest}"


def with_deadlines(items: Iterable[TraceRequest],
                   rule: SloRule | None = None) -> Iterator[TraceRequest]:
    """``items`` with the TTFT target and deadline ``rule`` gives (``governor sim``'s default
    rule: ``infra.sim.slo``) where a row states none, so that the router and the streams see
    the targets a simulated run gives them (without, the router sees no deadline: no deadline
    filter, no early rejection, and the streams judge success by ``slo.deadline_s`` and
    ``slo.ttft_slo_s``)."""
    rule = rule or SloRule()
    for item in items:
        ttft, deadline = rule.targets(item.prompt_tokens, max(item.output_tokens, 1),
                                      item.ttft_slo_s, item.deadline_s)
        yield dataclasses.replace(item, ttft_slo_s=ttft, deadline_s=deadline)


def as_simulated(items: Iterable[TraceRequest], deadlines: str,
                 slo: SloConfig | None = None) -> Iterator[TraceRequest]:
    """``items`` with the targets ``governor sim --deadlines DEADLINES`` gives each, from the
    ``slo`` settings (default: the default configuration's, as ``sim`` without ``--set``;
    ``replay`` passes the live configuration's): what ``replay`` and ``demo`` send. Under
    ``"none"`` each as its row states it."""
    rule = SloRule.configured(slo or SloConfig(), deadlines)
    return iter(items) if rule.stated_only else with_deadlines(items, rule)


def check_requests(items: Iterable[TraceRequest], run_id: str,
                   trace: Path | None = None) -> int:
    """Raise ``TraceError`` naming the first trace row that is no valid ``InferenceRequest``
    (a tenant name with a space, a priority outside 0-9, an SLO over a day...); return how many
    rows there are. One row at a time (a trace streamed from its file is not held): callers
    run it over the whole trace before they replay it, so that a replay stops before producing
    anything rather than partway. ``trace``: the file ``items`` were loaded from, one request a
    row in its order (``load_trace``), for the error to name the row's line and the field as
    the file calls it."""
    return sum(1 for _ in checked(items, run_id, trace))


def checked(items: Iterable[TraceRequest], run_id: str,
            trace: Path | None = None) -> Iterator[TraceRequest]:
    """Each of ``items`` once ``check_requests`` finds it valid: for a caller that reads the
    rows for something else in the same pass (``governor replay``: when the last arrives)."""
    created = now_ms()
    for index, item in enumerate(items):
        request_id = _request_id(run_id, index)
        if len(request_id) > MAX_ID_CHARS:  # (the run id's fault, not the row's)
            suffix = len(request_id) - len(run_id)
            raise TraceError(f"request ids <run id>-{'N' * (suffix - 1)} pass {MAX_ID_CHARS} "
                             f"characters from request {index} on (a run id of {len(run_id)}): "
                             f"give a --run-id of at most {MAX_ID_CHARS - suffix} characters "
                             "for a trace this long")
        try:
            to_request(item, request_id, created, run_id)
        except ValidationError as exc:
            where, names = request_row(trace, index) if trace is not None else ("", {})
            problem = _invalid(index, item, exc, names)
            raise TraceError(f"{where}: {problem}" if where else problem) from None
        yield item


#: A request's fields named as the trace row names them.
_TRACE_FIELDS = {"max_tokens": "output_tokens", "prefix_hashes": "hash_ids",
                 "deadline_ms": "deadline_s"}


def _invalid(index: int, item: TraceRequest, exc: ValidationError,
             names: dict[str, str] | None = None) -> str:
    """What is wrong with trace request ``index``, its fields called by ``names`` (the file's
    names for them, ``loaders.FILE_FIELDS``) where it has one."""
    def field(error) -> str:
        name = ".".join(str(part) for part in error["loc"])
        name = _TRACE_FIELDS.get(name, name) or "request"
        return (names or {}).get(name, name)

    problems = "; ".join(f"{field(error)}: {error['msg']}" for error in exc.errors()[:3])
    return f"trace request {index} (arrival {item.arrival_s:g}s) is not a valid request: {problems}"


#: How long a closed-loop replay waits for the end of a step that a later step of its task
#: waits for, once nothing else is left to send (a router answers every request it accepts
#: within its deadline or, at the latest, 600 s after its worker is lost).
STEP_WAIT_S = 900.0


#: A replay flushes at least every this many requests: a flush the broker acknowledges well
#: within ``DELIVERY_S`` (a replay behind its schedule sends without pause, and flushed only
#: at its end: hundreds of thousands of requests, 15 s and more to acknowledge).
FLUSH_EVERY = 1_000


class NotDelivered(GovernorError):
    """The broker did not acknowledge requests of a replay within ``DELIVERY_S``: ``delivered``
    of them it did, ``unconfirmed`` (their ids) it did not (each may be on the broker or not)."""

    def __init__(self, bootstrap: str, delivered: int, unconfirmed: list[str], why: str) -> None:
        self.bootstrap, self.delivered, self.unconfirmed = bootstrap, delivered, unconfirmed
        super().__init__(f"the broker at {bootstrap} did not acknowledge "
                         f"{len(unconfirmed):,} request{'s' if len(unconfirmed) != 1 else ''} "
                         f"({_ids(unconfirmed)}): {why}")


def _ids(ids: list[str]) -> str:
    return ids[0] if len(ids) == 1 else f"{ids[0]} and {len(ids) - 1:,} more"


class Deliveries:
    """An outbox of a replay's requests that counts those the broker acknowledged: a flush that
    fails, or waits longer than ``DELIVERY_S``, raises ``NotDelivered``."""

    def __init__(self, outbox: Outbox, bootstrap: str) -> None:
        self.outbox, self.bootstrap = outbox, bootstrap
        self.delivered = 0
        self.unconfirmed: list[str] = []  # ids sent since the last flush

    async def emit(self, topic: str, request: InferenceRequest, key: str) -> None:
        """Emit ``request``; flushed once ``FLUSH_EVERY`` are unconfirmed."""
        self.outbox.emit(topic, request, key)
        self.unconfirmed.append(key)
        if len(self.unconfirmed) >= FLUSH_EVERY:
            await self.flush()

    async def flush(self) -> None:
        try:
            await asyncio.wait_for(self.outbox.flush(), DELIVERY_S)
        except Undelivered as exc:
            refused = {key for _, key, _ in exc.failed}
            self.delivered += sum(key not in refused for key in self.unconfirmed)
            raise NotDelivered(self.bootstrap, self.delivered,
                               [key for key in self.unconfirmed if key in refused],
                               repr(exc.failed[0][2])) from None
        except (KafkaError, TimeoutError) as exc:
            why = f"none within {DELIVERY_S:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            raise NotDelivered(self.bootstrap, self.delivered, self.unconfirmed, why) from None
        self.delivered += len(self.unconfirmed)
        self.unconfirmed = []


async def replay(
    items: Iterable[TraceRequest],
    bootstrap: str,
    catalog: TopicCatalog,
    *,
    run_id: str,
    speedup: float = 1.0,
    on_sent: Callable[[InferenceRequest], None] = lambda _r: None,
    stop: asyncio.Event | None = None,
    closed_loop: bool = False,
    step_wait_s: float = STEP_WAIT_S,
    rate_scale: float = 1.0,
) -> int:
    """Produce each request at its arrival time (divided by ``speedup``); return how many were sent.

    ``rate_scale``: arrivals this many times faster, as ``governor sim --rate-scale`` makes
    them (``infra.sim.requests.with_earliest``: the start of each task, and every request
    without a task id; a later step keeps its offset from its task's start), before
    ``speedup``, which plays the whole run faster.

    Request ids are ``<run_id>-<index>`` (a router serves one request per request id: give
    each run its own ``run_id``). Check the rows first with ``check_requests``: a row found invalid
    here stops the replay partway. Returns early when ``stop`` is set. Raises ``NotDelivered``
    where the broker does not acknowledge what was sent within ``DELIVERY_S`` (gone away).

    ``closed_loop``: a task's later step is sent only once the step before it has ended (its
    terminal event on the telemetry topic), at its own time at the earliest, as ``governor sim``
    sends it (``infra.sim.arrivals``, the same rule); the steps still waiting once nothing is
    left to send and nothing was sent or heard to end for ``step_wait_s`` are not sent.
    """
    if speedup <= 0 or rate_scale <= 0:
        raise ValueError("speedup and rate_scale must be positive")
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Deliveries(Outbox(producer), bootstrap)
    try:
        if closed_loop:
            items = list(items)
            steps = _TaskSteps(items, speedup, rate_scale, run_id, catalog, bootstrap)
            sent = await steps.replay(outbox, run_id, on_sent, stop, step_wait_s)
        else:
            sent = await _open_loop(in_arrival_order(items, rate_scale), outbox, catalog,
                                    run_id, speedup, on_sent, stop)
        await outbox.flush()
    finally:
        await stop_within(producer)
    logger.info("replayed %d requests", sent)
    return sent


def _request_id(run_id: str, index: int) -> str:
    return f"{run_id}-{index:06d}"


class SentRows:
    """The trace rows a replay sent (each once), as runs of consecutive rows: a replay sends
    rows out of their order (a task's later step after rows below it), so those it sent are not
    always the trace's first; and a replay of millions holds a few runs, not each row."""

    #: The runs ``said`` names, at most.
    SHOWN_RUNS = 5

    def __init__(self) -> None:
        self.firsts: list[int] = []  # each run's first row, rising
        self.lasts: list[int] = []  # and its last
        self.count = 0

    def add(self, index: int) -> None:
        at = bisect.bisect_right(self.firsts, index)  # (the runs before it)
        after = at > 0 and self.lasts[at - 1] + 1 == index
        before = at < len(self.firsts) and self.firsts[at] - 1 == index
        if after and before:  # (it joins two runs)
            self.lasts[at - 1] = self.lasts.pop(at)
            del self.firsts[at]
        elif after:
            self.lasts[at - 1] = index
        elif before:
            self.firsts[at] = index
        else:
            self.firsts.insert(at, index)
            self.lasts.insert(at, index)
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def said(self, run_id: str) -> str:
        """Their request ids, a run as ``r-000000 to r-000002``, the first ``SHOWN_RUNS``
        runs, then how many more; ``none`` for none."""
        runs = list(zip(self.firsts, self.lasts))
        said = [_request_id(run_id, first) + (f" to {_request_id(run_id, last)}"
                                              if last > first else "")
                for first, last in runs[:self.SHOWN_RUNS]]
        more = len(runs) - self.SHOWN_RUNS
        return ", ".join(said) + (f" and {more:,} more runs" if more > 0 else "") or "none"


def request_index(request_id: str) -> int:
    """The trace row of a replay's request id (``_request_id``)."""
    return int(request_id.rpartition("-")[2])


async def _send(outbox: Deliveries, catalog: TopicCatalog, item: TraceRequest, index: int,
          run_id: str) -> InferenceRequest:
    try:
        request = to_request(item, _request_id(run_id, index), now_ms(), run_id)
    except ValidationError as exc:  # (checked before, against the time then)
        raise TraceError(_invalid(index, item, exc)) from None
    await outbox.emit(catalog.requests, request, request.request_id)
    return request


async def _open_loop(items: Iterable[tuple[float, int, TraceRequest]], outbox: Deliveries,
                     catalog: TopicCatalog, run_id: str, speedup: float,
                     on_sent: Callable[[InferenceRequest], None],
                     stop: asyncio.Event | None) -> int:
    """Every request at its time, whatever became of the others; ``items``: (arrival, index in
    the trace, row) in the order of arrival (``in_arrival_order``)."""
    sent = 0
    start = time.monotonic()
    for arrival_s, index, item in items:
        due = start + arrival_s / speedup
        if due - time.monotonic() > 0.005:
            await outbox.flush()
            await _sleep_until(due, stop)
        if stop is not None and stop.is_set():
            break
        on_sent(await _send(outbox, catalog, item, index, run_id))
        sent += 1
    return sent


@dataclasses.dataclass(slots=True)
class _Due:
    arrival_s: float  # after the replay's start: its trace time over the speedup, or later


class _TaskSteps:
    """A closed-loop replay: the requests' arrivals (``infra.sim.arrivals.Arrivals``, as the
    simulator releases them) and the terminal events on the telemetry topic that release a
    task's next step."""

    def __init__(self, items: list[TraceRequest], speedup: float, rate_scale: float,
                 run_id: str, catalog: TopicCatalog, bootstrap: str) -> None:
        self.items = items
        self.arrivals = Arrivals([_Due(due / speedup)
                                  for due in earliest_arrivals(items, rate_scale)],
                                 previous_steps(items))
        self.index = {_request_id(run_id, i).encode(): i for i in range(len(items))}
        self.catalog = catalog
        self.bootstrap = bootstrap
        self.ended = asyncio.Event()  # set when a step ended (a later one may be due)
        self.progress = time.monotonic()  # when a request was last sent or heard to end

    async def replay(self, outbox: Deliveries, run_id: str,
                     on_sent: Callable[[InferenceRequest], None], stop: asyncio.Event | None,
                     step_wait_s: float) -> int:
        # (from its end now: no end of a request sent below is missed)
        async with from_now(self.bootstrap, self.catalog, self.catalog.telemetry) as watcher:
            start = self.progress = time.monotonic()
            watching = asyncio.ensure_future(self._watch(watcher, start))
            try:
                return await self._send_all(outbox, run_id, on_sent, stop, start, step_wait_s,
                                            watching)
            finally:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)

    async def _send_all(self, outbox: Deliveries, run_id: str,
                        on_sent: Callable[[InferenceRequest], None], stop: asyncio.Event | None,
                        start: float, step_wait_s: float, watching: asyncio.Future) -> int:
        sent = 0
        while not (stop is not None and stop.is_set()):
            self.ended.clear()  # (before looking: an end heard from here on wakes the wait)
            upcoming = self.arrivals.next()
            if upcoming is None and not self.arrivals.waiting:
                break  # every step sent
            wait_s = (start + upcoming[0] - time.monotonic() if upcoming is not None
                      else self.progress + step_wait_s - time.monotonic())
            if upcoming is None and wait_s <= 0:
                waiting = sum(len(steps) for steps in self.arrivals.waiting.values())
                logger.warning("%d steps not sent: the steps before them did not end within "
                               "%g s", waiting, step_wait_s)
                break
            if upcoming is None or wait_s > 0.005:  # (none due: only an end can free one)
                await outbox.flush()
                await _first_of(wait_s, self.ended, stop, watching)
                if watching.done():
                    watching.result()  # (raises what stopped it)
                continue
            index = self.arrivals.pop()
            on_sent(await _send(outbox, self.catalog, self.items[index], index, run_id))
            sent += 1
            self.progress = time.monotonic()
        return sent

    async def _watch(self, watcher: AIOKafkaConsumer, start: float) -> None:
        """Release the steps waiting for each request of this replay that ends."""
        spec = self.catalog.spec(self.catalog.telemetry)
        while True:
            await take_on_added(watcher)  # (an end sent to a partition added since is heard)
            fetched = await watcher.getmany(timeout_ms=500)
            for record in (r for records in fetched.values() for r in records):
                index = self.index.get(record.key)
                if index is None or index not in self.arrivals.waiting:
                    continue
                try:
                    event = decode(spec, record.value)
                except DecodeError:
                    continue
                if event.type in TERMINAL_EVENT_TYPES:
                    self.progress = time.monotonic()
                    self.arrivals.ended(index, self.progress - start)
                    self.ended.set()


async def _first_of(timeout_s: float, *events: asyncio.Event | asyncio.Future | None) -> None:
    """Until the first of ``events`` (an event set, a future done) or ``timeout_s``."""
    created = [asyncio.ensure_future(e.wait()) for e in events if isinstance(e, asyncio.Event)]
    given = [e for e in events if isinstance(e, asyncio.Future)]
    if not created and not given:
        await asyncio.sleep(timeout_s)
        return
    try:
        await asyncio.wait([*created, *given], timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in created:
            wait.cancel()


async def _sleep_until(due: float, stop: asyncio.Event | None) -> None:
    """Until ``due`` (monotonic), or until ``stop`` is set."""
    # Pacing an open-loop arrival process: waiting for the clock is the point here.
    await _first_of(max(0.0, due - time.monotonic()), stop)
