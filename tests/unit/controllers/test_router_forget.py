"""The router forgets workers that are gone (stopped or crashed for ``FORGET_STOPPED_S``, silent
for ``FORGET_AFTER_S``): worker ids that change at every restart, or forged heartbeats, must not
grow its fleet view, prefix index and accounting for good, which placement pays for at every
request. A request in flight keeps its worker; a worker heard after being forgotten is new."""

from __future__ import annotations

import sys

from controllers.router.core import (FORGET_AFTER_S, FORGET_STOPPED_S, NO_WORKER_GIVE_UP_S,
                                     RouterCore)
from router_factories import T0, request_factory, status_factory
from schemas import commands
from schemas.events import Failed, KvBlocksStored
from schemas.requests import Dispatch

STOPPED_MS, SILENT_MS = int(FORGET_STOPPED_S * 1000), int(FORGET_AFTER_S * 1000)


def _live(core: RouterCore, at: int) -> None:
    """w0 and w1 heart-beat at ``at``; the resumption tick runs."""
    for i in (0, 1):
        core.observe(status_factory(f"w{i}", i, at=at), at)
    core.resume(at)


def _heard_once(core: RouterCore, worker_id: str, at: int, state: str = "warm") -> None:
    """One heartbeat of ``worker_id`` and its KV blocks: the shared 1, 2 and one of its own."""
    core.observe(status_factory(worker_id, 5, at=at, state=state), at)
    core.observe(KvBlocksStored(event_time_ms=at, worker_id=worker_id, block_size=16,
                                block_hashes=[1, 2, 1_000 + at - T0]), at)


def _known(core: RouterCore) -> dict[str, int]:
    return {"fleet": len(core.fleet), "started": len(core._started),
            "prefix": len(core.prefix._exact) + len(core.prefix._estimated),
            "holders": len({w for ws in core.prefix._holders.values() for w in ws}),
            "breakers": len(core.breakers), "ledger": len(core.ledger._requests)}


def test_gone_workers_are_forgotten_and_live_ones_still_served() -> None:
    core = RouterCore()
    _live(core, T0)
    for n in range(2_000):  # pods restarted under new ids: each stops once, or goes silent
        _heard_once(core, f"pod-{n}", T0 + n, "stopped" if n % 2 else "warm")
        core.observe(commands.SetBreakerState(event_time_ms=T0 + n, worker_id=f"pod-{n}",
                                              state="open", command_id=f"c{n}"), T0 + n)
    assert len(core.fleet) == 2_002
    placed = core.route(request_factory("r0", prefix_hashes=[1, 2]), T0 + 2_000)
    core.observe(placed.dispatch, T0 + 2_000)
    t = T0 + 2_000
    for at in range(t, t + STOPPED_MS + 2_000, 1_000):
        _live(core, at)
    assert len(core.fleet) == 2 + 1_000  # the stopped ones went, the silent ones are kept
    for at in range(t + STOPPED_MS + 2_000, t + SILENT_MS + 2_000, 1_000):
        _live(core, at)
    assert _known(core) == {"fleet": 2, "started": 2, "prefix": 2, "holders": 2,
                            "breakers": 0, "ledger": 2}
    assert sys.getsizeof(core.fleet._workers) < 1_000  # (not the room of 2,002)
    now = t + SILENT_MS + 2_000
    routed = core.route(request_factory("r1", prefix_hashes=[1, 2], created_ms=now), now)
    assert routed.dispatch.worker_id in ("w0", "w1")
    assert routed.scores["prefix"] == 1.0  # the live workers' blocks are still known


def test_a_stopped_worker_is_kept_until_its_grace_is_over() -> None:
    core = RouterCore()
    _live(core, T0)
    _heard_once(core, "pod-a", T0, "stopped")
    _live(core, T0 + STOPPED_MS - 1)
    assert core.fleet.get("pod-a") is not None
    _live(core, T0 + STOPPED_MS)
    assert core.fleet.get("pod-a") is None


def test_a_request_in_flight_keeps_its_worker_until_it_ends() -> None:
    """Its own placement on a worker that went silent, with no other worker to take it: it
    waits for one, naming its worker, and fails ``worker_lost`` after NO_WORKER_GIVE_UP_S."""
    core = RouterCore()
    core.observe(status_factory("w0", 0, at=T0), T0)
    placed = core.route(request_factory("r1"), T0)
    assert placed.dispatch.worker_id == "w0"
    # (its wait for a worker starts once w0 is past its heartbeat timeout)
    give_up = T0 + core.fleet.heartbeat_timeout_ms + int(NO_WORKER_GIVE_UP_S * 1000)
    emits = []
    for at in range(T0 + 1_000, give_up + 3_000, 1_000):
        emits += core.resume(at)
        if at < give_up:
            assert core.fleet.get("w0") is not None and "r1" in core.in_flight
    failed = [e.message for e in emits if isinstance(e.message, Failed)]
    assert [f.reason for f in failed] == ["worker_lost"] and "w0 lost" in failed[0].detail
    assert core.fleet.get("w0") is None and len(core.fleet) == 0


def test_another_routers_request_keeps_its_worker() -> None:
    """A request another router placed (it resumes it, not this one) on a worker gone silent."""
    core = RouterCore()
    _live(core, T0)
    core.observe(status_factory("w2", 2, at=T0), T0)
    theirs = Dispatch(event_time_ms=T0, request=request_factory("r9"), worker_id="w2", slot=2,
                      router_id="router-other")
    core.observe(theirs, T0)
    for at in range(T0 + 1_000, T0 + SILENT_MS + 5_000, 1_000):
        _live(core, at)
    assert core.fleet.get("w2") is not None
    moved = theirs.model_copy(update={"worker_id": "w1", "slot": 1, "attempt": 2,
                                      "event_time_ms": at})
    core.observe(moved, at)  # its router continued it on w1
    _live(core, at + 1_000)
    assert core.fleet.get("w2") is None and core.in_flight["r9"].dispatch.worker_id == "w1"


def test_a_worker_heard_after_being_forgotten_is_new() -> None:
    core = RouterCore()
    _live(core, T0)
    _heard_once(core, "w7", T0, "stopped")
    for at in range(T0 + 1_000, T0 + STOPPED_MS + 1_000, 1_000):
        _live(core, at)
    assert core.fleet.get("w7") is None
    back = T0 + STOPPED_MS + 1_000
    core.observe(KvBlocksStored(event_time_ms=T0 - 5, worker_id="w7", block_size=16,
                                block_hashes=[40, 41]), back)  # its old blocks, read late
    assert core.prefix.overlap("w7", [40, 41]) == 0
    core.observe(status_factory("w7", 7, at=back, started_ms=back - 10), back)
    assert "w7" in [w.worker_id for w in core.fleet.live(back)]
    core.observe(KvBlocksStored(event_time_ms=back, worker_id="w7", block_size=16,
                                block_hashes=[40, 41]), back)
    routed = core.route(request_factory("r1", prefix_hashes=[40, 41], created_ms=back), back)
    assert routed.dispatch.worker_id == "w7"
