"""A request read under an id the router already has: the same request read again (redelivered,
or sent again by its client) is dropped; another request under that id is dead-lettered,
saying which fields differ where the first is at hand (the adapter's rule; no broker)."""

import asyncio

from controllers.router.admission import Denial
from controllers.router.service import RouterService, _rejected
from schemas.commands import TenantLimit
from infra.bus import Outbox, now_ms
from schemas.events import WorkerStatus
from schemas.requests import InferenceRequest
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("unit")
T = now_ms()  # when every request here was created


def _request(request_id: str, model: str = "llama-3-8b", **fields) -> InferenceRequest:
    return InferenceRequest(**{"event_time_ms": T, "created_ms": T, "request_id": request_id,
                               "model": model, "prompt_tokens": 32, "max_tokens": 4, **fields})


def _router(**options) -> RouterService:
    """A router hearing a warm worker of llama-3-8b and one of llama-2-7b still loading."""
    router = RouterService("127.0.0.1:1", CATALOG, **options)
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    t = now_ms()
    for worker, slot, model, state in (("w0", 0, "llama-3-8b", "warm"),
                                       ("w1", 1, "llama-2-7b", "loading")):
        router._followed(WorkerStatus(
            event_time_ms=t, worker_id=worker, slot=slot, pool=f"h100@{model}", gpu_type="h100",
            models_loaded=[model] if state == "warm" else [], state=state, kv_blocks_free=10_000,
            started_ms=t - 1), 0)
    return router


def _read(router: RouterService, request: InferenceRequest):
    """What the router makes of ``request``: None, or why its record is dead-lettered."""
    return asyncio.run(router._on_request(request, 0, 0))


def test_a_request_read_again_is_dropped_whether_in_flight_or_waiting():
    router = _router()
    placed, waiting = _request("placed"), _request("waits", "llama-2-7b")
    assert _read(router, placed) is None and _read(router, waiting) is None
    assert "placed" in router.core.in_flight and router.waiting.get("waits") is not None
    sent = len(router.outbox._queue)
    for request in (placed, waiting):  # redelivered, then resent later by its client
        assert _read(router, request) is None
        assert _read(router, request.model_copy(update={"event_time_ms": now_ms() + 5})) is None
    assert len(router.outbox._queue) == sent  # nothing answered twice


def test_another_request_under_an_id_in_use_is_dead_lettered_naming_what_differs():
    router = _router()
    _read(router, _request("placed"))
    _read(router, _request("waits", "llama-2-7b"))
    sent = len(router.outbox._queue)
    in_flight = _read(router, _request("placed", max_tokens=8, tenant="other"))
    assert in_flight.reason == "duplicate_request_id"
    assert "request_id 'placed' is already in use by another request (tenant, max_tokens " \
           "differ)" in in_flight.detail
    waits = _read(router, _request("waits", "llama-3-8b"))
    assert waits.reason == "duplicate_request_id" and "(model differ)" in waits.detail
    assert len(router.outbox._queue) == sent  # neither answered: the first ones stand
    assert router.core.in_flight["placed"].dispatch.request.max_tokens == 4
    assert router.waiting.get("waits").request.model == "llama-2-7b"


def _gold(router: RouterService) -> RouterService:
    """Tenant "gold" configured at priority 5: the request placed carries it, not the client's."""
    router.core.admission.set_limits({"gold": TenantLimit(requests_per_s=100, tokens_per_s=1e6,
                                                          priority=5)})
    return router


def test_a_request_read_again_is_dropped_though_its_tenants_priority_replaced_its_own():
    router = _gold(_router())
    request = _request("gold-1", tenant="gold")
    assert _read(router, request) is None
    assert router.core.in_flight["gold-1"].dispatch.request.priority == 5  # (the client sent 0)
    assert _read(router, request) is None
    # the router restarted reads its Dispatch back (and the request ended since): the uncommitted
    # request, redelivered, is the same one
    dispatch = router.core.in_flight["gold-1"].dispatch
    restarted = _gold(_router())
    restarted._recovered(dispatch, 0)
    assert _read(restarted, request) is None
    restarted.core.in_flight.pop("gold-1")
    assert _read(restarted, request) is None
    assert _read(restarted, _request("gold-1", tenant="gold", max_tokens=9)).reason == \
        "duplicate_request_id"
    # one placed by another router (followed live, a rebalance): the same
    other = _gold(_router(router_id="router-1"))
    other._followed(dispatch, 0)
    assert "gold-1" in other.core.in_flight
    assert _read(other, request) is None
    assert "(max_tokens differ)" in _read(other, _request("gold-1", tenant="gold",
                                                        max_tokens=9)).detail


def test_an_id_answered_and_gone_is_still_known_by_its_body():
    """A request refused (or ended) is neither in flight nor waiting: what it asked for is
    remembered with its id, so another request under it is told apart, without field names."""
    router = RouterService("127.0.0.1:1", CATALOG, no_worker_wait_s=0)
    router.outbox = Outbox(producer=None)
    refused = _request("refused")
    assert _read(router, refused) is None  # no worker: refused at once
    assert _read(router, refused) is None
    other = _read(router, _request("refused", prompt_tokens=64))
    assert other.reason == "duplicate_request_id"
    assert "already in use by another request; a request id names one request" in other.detail


def test_an_id_read_back_from_its_rejected_alone_is_taken_for_a_redelivery():
    """The documented limit: an id known from a ``Rejected`` read back (a router before this
    one's start refused it) has no body here, so whatever comes under it is dropped."""
    router = _router()
    router._recovered(_rejected(_request("before"), Denial("no_capacity", "none")), 0)
    assert _read(router, _request("before", max_tokens=9)) is None
    assert router.outbox._queue == []
