"""A router that comes back under its id after the group has given its requests to another
router (gone past ``orphan_after_s``) takes them back from that one without both continuing one.

router-0 placed ``r`` on worker-0 and went away; router-b, alone in the group, is the adopter of
its requests. router-0 starts again; as it joins the group, worker-0 hands ``r`` back. Until the
rebalance router-0's join begins reaches router-b, router-b continues router-0's requests; a
router-0 that continued its own before it was assigned (and listed) its partitions continued
``r`` too: two continuations of one request on two workers, which both complete it. The broker
and the routers are real; the workers are their heartbeats."""

import asyncio
import contextlib
import logging

import pytest

from controllers.router.service import RouterService, _queued
from infra.bus import Outbox, now_ms, partitions, read_back, reading
from schemas.codec import decode
from schemas.events import Cancelled, Requeued, WorkerStatus, about
from schemas.requests import CancelRequest, Dispatch, InferenceRequest

pytestmark = pytest.mark.integration


def _status(slot: int) -> WorkerStatus:
    t = now_ms()
    return WorkerStatus(event_time_ms=t, worker_id=f"worker-{slot}", slot=slot,
                        pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                        kv_blocks_free=10_000, started_ms=t - 60_000)


class _Consuming(logging.Handler):
    """Set ``event`` once router-0 says it consumes the request topic (it has subscribed)."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == f"router router-0 consuming {self.topic}":
            self.event.set()


async def _about_r(typed, catalog) -> list:
    """The dispatches, cancels and ends of ``r`` on the broker now."""
    out = []
    for topic in (catalog.dispatch, catalog.telemetry):
        end = await typed.consumer.end_offsets(partitions(catalog, [topic]))
        out += [m for m in [decode(catalog.spec(topic), record.value)
                            async for record in read_back(typed.consumer, topic, 0, end)]
                if (isinstance(m, Dispatch) and m.request.request_id == "r")
                or (isinstance(m, Cancelled | CancelRequest) and m.request_id == "r")]
    return out


async def _rejoin(bootstrap, catalog, done, cancel: bool = False) -> list:
    """What the topics hold of ``r`` once the routers have run 6 s past its hand-back and
    ``done`` holds of it."""
    async with reading(bootstrap, catalog, [], "rejoin-test") as typed:
        outbox = Outbox(typed.producer)
        stop_workers = asyncio.Event()

        async def heartbeats():
            while not stop_workers.is_set():
                for slot in (0, 1):
                    outbox.emit(catalog.telemetry, _status(slot), f"worker-{slot}")
                await outbox.flush()
                await asyncio.sleep(0.3)  # a worker's heartbeat period

        t = now_ms()
        request = InferenceRequest(event_time_ms=t, created_ms=t, request_id="r", tenant="acme",
                                   prompt_tokens=64, max_tokens=100)
        outbox.emit(catalog.telemetry, _queued(request), "r")
        outbox.emit(catalog.dispatch, Dispatch(event_time_ms=t, request=request,
                                               worker_id="worker-0", slot=0,
                                               router_id="router-0"), "r", 0)
        await outbox.flush()
        workers = asyncio.create_task(heartbeats())
        stops = {name: asyncio.Event() for name in ("router-b", "router-0")}
        b = RouterService(bootstrap, catalog, router_id="router-b", orphan_after_s=1.0)
        running = {"router-b": asyncio.create_task(b.run(stops["router-b"]))}
        consuming = asyncio.Event()
        handler = _Consuming(consuming)
        handler.topic = catalog.requests
        logger = logging.getLogger("controllers.router.service")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            async with asyncio.timeout(60):
                while not (b._listed and b.assigned):
                    await asyncio.sleep(0.05)  # polls router-b's assignment and listing
            await asyncio.sleep(2.0)  # router-0 missing from the listing past orphan_after_s
            back = RouterService(bootstrap, catalog, router_id="router-0", orphan_after_s=1.0)
            running["router-0"] = asyncio.create_task(back.run(stops["router-0"]))
            async with asyncio.timeout(60):
                await consuming.wait()
            # worker-0 hands r back as router-0 joins the group
            outbox.emit(catalog.telemetry, Requeued(
                event_time_ms=now_ms(), **about(request), worker_id="worker-0", attempt=1,
                tokens_done=0, detail="worker stopped before the request finished"), "r")
            if cancel:  # and its client's cancel, forwarded to its slot by a router
                await outbox.flush()
                await asyncio.sleep(0.1)  # (read after the hand-back)
                outbox.emit(catalog.dispatch, CancelRequest(event_time_ms=now_ms(),
                                                            request_id="r"), "r", 0)
            await outbox.flush()
            await asyncio.sleep(6.0)  # the window in which both routers could continue r
            # r continued (or ended) by one of them: waited for, as routers stalled by a
            # loaded machine may settle after the window (60 s at most: what the topics hold
            # then is asserted)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60):
                    while not done(await _about_r(typed, catalog)):
                        await asyncio.sleep(0.1)  # (polling the topics: a condition)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            for name, task in running.items():
                stops[name].set()
            await asyncio.gather(*running.values())
            stop_workers.set()
            await workers
        return await _about_r(typed, catalog)


def _continued(out: list) -> list[Dispatch]:
    return [m for m in out if isinstance(m, Dispatch) and m.attempt > 1]


def _forwards(out: list) -> int:
    """The cancels of ``r`` sent to a slot: the test's, and a router's to a continuation's."""
    return sum(isinstance(m, CancelRequest) and m.attempt is None for m in out)


def test_a_router_back_under_its_id_and_the_adopter_of_its_requests_continue_one_once(
        kafka_bootstrap, catalog):
    out = asyncio.run(_rejoin(kafka_bootstrap, catalog, _continued))
    continuations = [(d.router_id, d.attempt, d.worker_id) for d in _continued(out)]
    assert len(continuations) == 1, continuations
    assert continuations[0][1:] == (2, "worker-1")


def test_a_router_back_under_its_id_and_the_adopter_of_its_requests_end_one_cancelled_once(
        kafka_bootstrap, catalog):
    """The same, with the client's cancel of ``r`` forwarded to its slot right after it is
    handed back: one ``Cancelled`` (a router-0 not yet assigned ended it as router-b did)."""
    def ended_or_forwarded(out: list) -> bool:
        return any(isinstance(m, Cancelled) for m in out) or (
            bool(_continued(out)) and _forwards(out) >= 2)

    out = asyncio.run(_rejoin(kafka_bootstrap, catalog, ended_or_forwarded, cancel=True))
    ended = [m for m in out if isinstance(m, Cancelled)]
    continued = _continued(out)
    # Ended here once; or continued (once) before the cancel was taken, and the cancel sent
    # on to the continuation's slot, whose worker ends it (these workers are heartbeats only).
    assert len(ended) + len(continued) == 1, out
    if continued:  # the test's forward, and the router's to the continuation's slot
        assert _forwards(out) == 2, out
