"""A router that crashed after its ``Dispatch`` of a request reached the broker and before the
request's ``Queued`` did sends that ``Queued`` when it restarts (read back, the request counts as
answered and its redelivery is not placed again, so nothing else would): without it the audit
counts the request's end a violation, and the streams never see it accepted."""

import asyncio

import pytest

from controllers.router.service import RouterService, _queued
from infra.bus import Outbox, now_ms, reading
from schemas.events import Queued
from schemas.requests import Dispatch, InferenceRequest

pytestmark = pytest.mark.integration

ROUTER = "router-0"


def _request(rid: str, at_ms: int) -> InferenceRequest:
    return InferenceRequest(event_time_ms=at_ms, created_ms=at_ms, request_id=rid, tenant="acme",
                            prompt_tokens=64, max_tokens=100)


async def _scenario(bootstrap, catalog) -> tuple[list[Queued], int]:
    async with reading(bootstrap, catalog, [catalog.telemetry], "lost-queued-test",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        placed_at = now_ms() - 5_000
        for rid in ("unqueued", "queued"):
            request = _request(rid, placed_at)
            outbox.emit(catalog.dispatch, Dispatch(event_time_ms=placed_at, request=request,
                                                   worker_id="worker-0", slot=0,
                                                   router_id=ROUTER), rid, 0)
        outbox.emit(catalog.telemetry, _queued(_request("queued", placed_at), placed_at), "queued")
        await outbox.flush()
        stop = asyncio.Event()
        service = RouterService(bootstrap, catalog, router_id=ROUTER)
        router = asyncio.create_task(service.run(stop))
        seen: list[Queued] = []
        try:
            async with asyncio.timeout(60):
                while not any(q.request_id == "unqueued" for q in seen):
                    seen += [item.message for item in await typed.fetch(200)
                             if isinstance(item.message, Queued)]
            # the restarted router has read its window back and serves: what it sent, it sent
            async with asyncio.timeout(60):
                while service.assigned == frozenset():
                    seen += [item.message for item in await typed.fetch(200)
                             if isinstance(item.message, Queued)]
        finally:
            stop.set()
            await router
        seen += [item.message for item in await typed.fetch(500) if isinstance(item.message, Queued)]
        return seen, placed_at


def test_a_dispatch_whose_queued_was_lost_gets_it_at_the_restart(kafka_bootstrap, catalog):
    seen, placed_at = asyncio.run(_scenario(kafka_bootstrap, catalog))
    unqueued = [q for q in seen if q.request_id == "unqueued"]
    assert len(unqueued) == 1 and unqueued[0].event_time_ms == placed_at  # as of its placement
    assert unqueued[0].tenant == "acme" and unqueued[0].max_tokens == 100
    assert [q.request_id for q in seen].count("queued") == 1  # its own, not sent again
