"""Tests of controllers.router.round_robin.RoundRobin."""

from __future__ import annotations

from controllers.router.fleet import FleetView
from controllers.router.round_robin import RoundRobin
from schemas.events import WorkerStatus
from schemas.requests import InferenceRequest

T0 = 1_700_000_000_000


def fleet_of(*workers: tuple[str, int, int], timeout_ms: int = 3_000, model: str = "llama-3-8b"
             ) -> FleetView:
    """Workers as (worker_id, slot, last heartbeat ms)."""
    fleet = FleetView(heartbeat_timeout_ms=timeout_ms)
    for worker_id, slot, at in workers:
        fleet.observe(WorkerStatus(event_time_ms=at, worker_id=worker_id, slot=slot, pool="p",
                                   gpu_type="h100", models_loaded=[model], started_ms=0))
    return fleet


def request(model: str = "llama-3-8b") -> InferenceRequest:
    return InferenceRequest(event_time_ms=T0, created_ms=T0, request_id="r", prompt_tokens=1,
                            max_tokens=1, model=model)


def test_cycles_through_live_workers_in_slot_order() -> None:
    fleet = fleet_of(("w2", 2, T0), ("w0", 0, T0), ("w1", 1, T0))
    rr = RoundRobin()
    picks = [rr.place(fleet, request(), T0).worker_id for _ in range(7)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2", "w0"]


def test_skips_dead_workers() -> None:
    fleet = fleet_of(("w0", 0, T0), ("w1", 1, T0 - 10_000), ("w2", 2, T0))
    rr = RoundRobin()
    picks = [rr.place(fleet, request(), T0).worker_id for _ in range(4)]
    assert picks == ["w0", "w2", "w0", "w2"]


def test_skips_workers_not_serving_the_model() -> None:
    fleet = fleet_of(("w0", 0, T0), ("w1", 1, T0))
    fleet.observe(WorkerStatus(event_time_ms=T0, worker_id="big", slot=5, pool="p",
                               gpu_type="h100", models_loaded=["llama-3-70b"], started_ms=0))
    rr = RoundRobin()
    assert [rr.place(fleet, request("llama-3-70b"), T0).worker_id for _ in range(3)] == ["big"] * 3
    assert rr.place(fleet, request("mistral"), T0) is None


def test_no_live_worker_gives_none() -> None:
    rr = RoundRobin()
    assert rr.place(FleetView(), request(), T0) is None
    assert rr.place(fleet_of(("w0", 0, T0)), request(), T0 + 3_001) is None


def test_spreads_evenly_over_many_requests() -> None:
    fleet = fleet_of(*((f"w{i}", i, T0) for i in range(5)))
    rr = RoundRobin()
    counts: dict[str, int] = {}
    for _ in range(100):
        chosen = rr.place(fleet, request(), T0).worker_id
        counts[chosen] = counts.get(chosen, 0) + 1
    assert counts == {f"w{i}": 20 for i in range(5)}


def test_name() -> None:
    assert RoundRobin.name == "round_robin"
