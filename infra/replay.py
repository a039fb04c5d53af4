"""Replay a trace: turn its requests into InferenceRequests and produce them on time."""

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from infra.bus import Outbox, make_producer, now_ms
from pydantic import ValidationError

from infra.sim.slo import SloRule
from infra.traces import TraceError, TraceRequest
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
    rule: ``infra.sim.slo``) where a row states none, so that a live run meets the targets a
    simulated one does (without, the router sees no deadline and the streams judge success by
    ``slo.deadline_s``)."""
    rule = rule or SloRule()
    for item in items:
        ttft, deadline = rule.targets(item.prompt_tokens, max(item.output_tokens, 1),
                                      item.ttft_slo_s, item.deadline_s)
        yield dataclasses.replace(item, ttft_slo_s=ttft, deadline_s=deadline)


def check_requests(items: Iterable[TraceRequest], run_id: str) -> int:
    """Raise ``TraceError`` naming the first trace row that is no valid ``InferenceRequest``
    (a tenant name with a space, a priority outside 0-9, an SLO over a day...); return how many
    rows there are. One row at a time (a trace streamed from its file is not held): callers
    run it over the whole trace before they replay it, so that a replay stops before producing
    anything rather than partway."""
    created, count = now_ms(), 0
    for index, item in enumerate(items):
        try:
            to_request(item, f"{run_id}-{index:06d}", created, run_id)
        except ValidationError as exc:
            raise TraceError(_invalid(index, item, exc)) from None
        count = index + 1
    return count


#: A request's fields named as the trace row names them.
_TRACE_FIELDS = {"max_tokens": "output_tokens", "prefix_hashes": "hash_ids",
                 "deadline_ms": "deadline_s"}


def _invalid(index: int, item: TraceRequest, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{_TRACE_FIELDS.get(field := '.'.join(str(part) for part in error['loc']), field) or 'request'}"
        f": {error['msg']}" for error in exc.errors()[:3])
    return f"trace request {index} (arrival {item.arrival_s:g}s) is not a valid request: {problems}"


async def replay(
    items: Iterable[TraceRequest],
    bootstrap: str,
    catalog: TopicCatalog,
    *,
    run_id: str,
    speedup: float = 1.0,
    on_sent: Callable[[InferenceRequest], None] = lambda _r: None,
    stop: asyncio.Event | None = None,
) -> int:
    """Produce each request at its arrival time (divided by ``speedup``); return how many were sent.

    Request ids are ``<run_id>-<index>`` (a router serves one request per request id: give
    each run its own ``run_id``). Check the rows first with ``check_requests``: a row found invalid
    here stops the replay partway. Returns early when ``stop`` is set.
    """
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)
    sent = 0
    start = time.monotonic()
    try:
        for index, item in enumerate(items):
            due = start + item.arrival_s / speedup
            if due - time.monotonic() > 0.005:
                await outbox.flush()
                await _sleep_until(due, stop)
            if stop is not None and stop.is_set():
                break
            try:
                request = to_request(item, f"{run_id}-{index:06d}", now_ms(), run_id)
            except ValidationError as exc:  # (checked before, against the time then)
                raise TraceError(_invalid(index, item, exc)) from None
            outbox.emit(catalog.requests, request, request.request_id)
            on_sent(request)
            sent += 1
        await outbox.flush()
    finally:
        await producer.stop()
    logger.info("replayed %d requests", sent)
    return sent


async def _sleep_until(due: float, stop: asyncio.Event | None) -> None:
    """Until ``due`` (monotonic), or until ``stop`` is set."""
    # Pacing an open-loop arrival process: waiting for the clock is the point here.
    delay = max(0.0, due - time.monotonic())
    if stop is None:
        await asyncio.sleep(delay)
        return
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
