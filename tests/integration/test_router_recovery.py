"""A router restarted after a crash takes over the requests it had placed: it reads back what the
topics hold, resumes a request whose worker died before the restart from the client's last token,
leaves a finished one alone, and does not place twice a request redelivered because its commit
was lost. A router gone from the group for good (removed, or replaced under another id) has its
requests resumed by one that is there. The broker is real; the workers are represented by the
heartbeats they would send."""

import asyncio

import pytest

from controllers.router.service import RouterService, _queued
from infra.bus import Outbox, now_ms, partitions, read_back, reading
from schemas.codec import decode
from schemas.events import Completed, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk

pytestmark = pytest.mark.integration

ROUTER = "router-0"


def _status(slot: int, at_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id=f"worker-{slot}", slot=slot,
                        pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                        kv_blocks_free=10_000, started_ms=at_ms - 60_000)


def _request(rid: str) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid, tenant="acme",
                            prompt_tokens=64, max_tokens=100)


async def _before_the_restart(outbox: Outbox, catalog) -> None:
    """What the crashed router left behind: ``lost`` placed on worker-0, ten tokens streamed,
    then worker-0 fell silent; ``done`` placed and completed; ``lost`` still uncommitted on the
    requests topic (so it is delivered again), ahead of a new request ``fresh``."""
    t = now_ms()
    outbox.emit(catalog.telemetry, _status(0, t - 10_000), "worker-0")
    for rid in ("lost", "done"):
        request = _request(rid)
        outbox.emit(catalog.telemetry, _queued(request), rid)
        outbox.emit(catalog.dispatch, Dispatch(event_time_ms=t, request=request,
                                               worker_id="worker-0", slot=0, router_id=ROUTER),
                    rid, 0)
    outbox.emit(catalog.responses, ResponseChunk(event_time_ms=t, request_id="lost",
                                                 worker_id="worker-0", token_offset=0,
                                                 tokens=list(range(10))), "lost")
    outbox.emit(catalog.telemetry, Completed(
        event_time_ms=t, request_id="done", tenant="acme", model="llama-3-8b",
        worker_id="worker-0", prompt_tokens=64, output_tokens=100, e2e_s=1.0), "done")
    for rid in ("lost", "fresh"):  # one partition, read in this order
        outbox.emit(catalog.requests, _request(rid), rid, 0)
    await outbox.flush()


async def _after(bootstrap, catalog, service: RouterService, enough) -> list[Dispatch]:
    """What ``service`` puts on the dispatch topic, started after ``_before_the_restart`` with
    worker-1 heart-beating, until ``enough(what it put there)``."""
    async with reading(bootstrap, catalog, [catalog.dispatch], "recovery-test",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        await _before_the_restart(outbox, catalog)
        stop = asyncio.Event()

        async def worker_1_heartbeats():
            while not stop.is_set():
                outbox.emit(catalog.telemetry, _status(1, now_ms()), "worker-1")
                await outbox.flush()
                await asyncio.sleep(0.5)  # a worker's heartbeat period

        started = now_ms()  # what the router places from here on is stamped after this
        heartbeats = asyncio.create_task(worker_1_heartbeats())
        router = asyncio.create_task(service.run(stop))
        placed: list[Dispatch | CancelRequest] = []

        def since_start() -> list[Dispatch | CancelRequest]:
            return [d for d in placed if d.event_time_ms >= started]

        try:
            async with asyncio.timeout(60):
                while not enough(since_start()):
                    placed.extend(item.message for item in await typed.fetch(200))
                    assert not router.done(), router.exception()
        finally:
            stop.set()
            await asyncio.gather(router, heartbeats)
    # The router is stopped: all it placed is read, to the topic's end (one fetch may stop short).
    async with reading(bootstrap, catalog, [], "recovery-count") as typed:
        end = await typed.consumer.end_offsets(partitions(catalog, [catalog.dispatch]))
        placed = [decode(catalog.spec(catalog.dispatch), record.value)
                  async for record in read_back(typed.consumer, catalog.dispatch, 0, end)]
    return since_start()


def _placed(dispatches: list, router_id: str | None = None) -> set[str]:
    return {d.request.request_id for d in dispatches if isinstance(d, Dispatch)
            and router_id in (None, d.router_id)}


def test_a_restarted_router_resumes_what_it_had_placed_and_places_nothing_twice(
        kafka_bootstrap, catalog):
    service = RouterService(kafka_bootstrap, catalog, router_id=ROUTER)
    after_restart = asyncio.run(_after(kafka_bootstrap, catalog, service,
                                       lambda out: {"lost", "fresh"} <= _placed(out)))
    by_request = {}
    for d in after_restart:
        if isinstance(d, Dispatch):
            by_request.setdefault(d.request.request_id, []).append(d)
    # worker-0's slot is told that the lost request's first attempt is superseded.
    assert [(c.request_id, c.attempt) for c in after_restart
            if isinstance(c, CancelRequest)] == [("lost", 1)]
    # The request of the dead worker continues on the live one after the tokens already sent.
    [resumed] = by_request["lost"]
    assert (resumed.attempt, resumed.worker_id, resumed.resume_from_token) == (2, "worker-1", 10)
    assert resumed.router_id == ROUTER
    # The finished request is left alone; the new one is placed once, as a first attempt.
    assert "done" not in by_request
    [fresh] = by_request["fresh"]
    assert fresh.attempt == 1 and fresh.worker_id == "worker-1"


def test_a_router_resumes_the_requests_of_a_router_gone_from_the_group(kafka_bootstrap, catalog):
    """router-0 placed ``lost`` and is gone for good; router-new, under an id of its own, runs."""
    service = RouterService(kafka_bootstrap, catalog, router_id="router-new", orphan_after_s=2.0)
    out = asyncio.run(_after(kafka_bootstrap, catalog, service,
                             lambda out: "lost" in _placed(out, "router-new")))
    # Resumed once, by the router that is there, on the live worker after the tokens sent.
    [resumed] = [d for d in out if isinstance(d, Dispatch) and d.request.request_id == "lost"]
    assert (resumed.router_id, resumed.attempt, resumed.worker_id, resumed.resume_from_token) \
        == ("router-new", 2, "worker-1", 10)
