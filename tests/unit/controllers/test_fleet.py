"""Tests of controllers.router.fleet.FleetView: liveness from heartbeats, with time passed in."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from controllers.router.fleet import MAX_AHEAD_MS, FleetView
from schemas.events import WorkerStatus

T0 = 1_700_000_000_000
HOUR = 3_600_000


def status(worker_id: str = "w0", at: int = T0, **fields: Any) -> WorkerStatus:
    base: dict[str, Any] = dict(event_time_ms=at, worker_id=worker_id, slot=0, pool="h100@m",
                                gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=T0 - 1)
    base.update(fields)
    return WorkerStatus(**base)


def test_observed_worker_is_live_with_its_fields() -> None:
    fleet = FleetView()
    fleet.observe(status("w7", slot=7, running=3, waiting=2, models_loaded=["a", "b"]))
    [view] = fleet.live(T0)
    assert (view.worker_id, view.slot, view.pool, view.gpu_type) == ("w7", 7, "h100@m", "h100")
    assert (view.models, view.running, view.waiting, view.last_seen_ms) == (("a", "b"), 3, 2, T0)
    assert len(fleet) == 1


@pytest.mark.parametrize(
    ("now_ms", "alive"),
    [(T0, True), (T0 + 2_999, True), (T0 + 3_000, True), (T0 + 3_001, False), (T0 + 60_000, False)],
)
def test_liveness_by_heartbeat_timeout(now_ms: int, alive: bool) -> None:
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    fleet.observe(status())
    assert bool(fleet.live(now_ms)) is alive
    assert len(fleet) == 1  # a silent worker is not forgotten, only not live


def test_a_new_heartbeat_revives_a_silent_worker() -> None:
    fleet = FleetView(heartbeat_timeout_ms=1_000)
    fleet.observe(status())
    assert fleet.live(T0 + 5_000) == []
    fleet.observe(status(at=T0 + 4_500, running=9))
    [view] = fleet.live(T0 + 5_000)
    assert view.running == 9


def test_a_late_older_heartbeat_is_ignored() -> None:
    fleet = FleetView()
    fleet.observe(status(at=T0 + 1_000, running=5))
    fleet.observe(status(at=T0, running=1))
    [view] = fleet.live(T0 + 1_000)
    assert (view.running, view.last_seen_ms) == (5, T0 + 1_000)


def test_a_heartbeat_with_the_same_time_replaces_the_view() -> None:
    fleet = FleetView()
    fleet.observe(status(running=1))
    fleet.observe(status(running=2))
    assert fleet.live(T0)[0].running == 2


def test_stopped_state_takes_the_worker_out_of_placement() -> None:
    fleet = FleetView()
    fleet.observe(status("w0", slot=0))
    fleet.observe(status("w1", slot=1))
    fleet.observe(status("w0", at=T0 + 10, state="stopped"))
    assert [w.worker_id for w in fleet.live(T0 + 10)] == ["w1"]


def test_a_late_heartbeat_does_not_revive_a_stopped_worker() -> None:
    fleet = FleetView()
    fleet.observe(status("w0", at=T0 + 10, state="stopped"))
    fleet.observe(status("w0", at=T0 + 5))  # sent before the stop, delivered after it
    assert fleet.live(T0 + 10) == []


def test_an_older_stopped_status_does_not_remove_a_newer_worker() -> None:
    fleet = FleetView()
    fleet.observe(status(at=T0 + 100))
    fleet.observe(status(at=T0, state="stopped"))
    assert len(fleet.live(T0 + 100)) == 1


def test_stopped_status_of_an_unknown_worker_is_harmless() -> None:
    fleet = FleetView()
    fleet.observe(status("ghost", state="stopped"))
    assert fleet.live(T0) == []


@pytest.mark.parametrize(
    ("state", "takes_work"),
    [("warm", True), ("starting", False), ("loading", False), ("draining", False),
     ("sleeping", False), ("crashed", False)],
)
def test_states_other_than_stopped_keep_the_worker(state: str, takes_work: bool) -> None:
    """Only a warm worker is offered new work; the others stay known until they stop."""
    fleet = FleetView()
    fleet.observe(status(state=state))
    assert len(fleet) == 1
    assert bool(fleet.live(T0)) is takes_work


def test_model_filter_and_slot_order() -> None:
    fleet = FleetView()
    fleet.observe(status("w-b", slot=5, models_loaded=["llama-3-8b"]))
    fleet.observe(status("w-a", slot=2, models_loaded=["llama-3-70b", "llama-3-8b"]))
    fleet.observe(status("w-c", slot=9, models_loaded=["llama-3-70b"]))
    fleet.observe(status("w-d", slot=1, models_loaded=[]))
    assert [w.slot for w in fleet.live(T0)] == [1, 2, 5, 9]
    assert [w.worker_id for w in fleet.live(T0, "llama-3-8b")] == ["w-a", "w-b"]
    assert [w.worker_id for w in fleet.live(T0, "llama-3-70b")] == ["w-a", "w-c"]
    assert fleet.live(T0, "mistral") == []


def test_each_heartbeat_is_viewed_as_it_says_when_two_fleets_see_it() -> None:
    router, controllers = FleetView(), FleetView()
    first, second = status("w0", running=1), status("w1", at=T0 + 500, running=4)
    for beat in (first, second):
        router.observe(beat)
        controllers.observe(beat)
    router.observe(status("w0", at=T0 + 600, running=2))
    assert controllers.get("w1") is router.get("w1")  # one view of one heartbeat
    assert (controllers.get("w0").running, router.get("w0").running) == (1, 2)
    assert (controllers.get("w1").running, controllers.get("w1").last_seen_ms) == (4, T0 + 500)


def test_a_heartbeat_stamped_far_ahead_counts_as_heard_at_most_max_ahead_ms_ahead() -> None:
    """Its host's clock stepped an hour ahead, then NTP set it right: taken at its own time, the
    heartbeat made every later one look old for the hour (``stopped`` too), and the worker
    stayed live as it was. Counted as heard ``MAX_AHEAD_MS`` ahead of the receiver's clock, it
    freezes the view that long at most."""
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    fleet.observe(status(), T0)
    assert fleet.observe(status(at=T0 + HOUR, running=5), T0)
    assert fleet.get("w0").last_seen_ms == T0 + MAX_AHEAD_MS
    assert not fleet.observe(status(at=T0 + 1_000, state="stopped"), T0 + 1_000)  # still older
    assert [w.worker_id for w in fleet.live(T0 + MAX_AHEAD_MS)] == ["w0"]
    # silent once the bound and the heartbeat timeout have passed, not an hour later
    assert fleet.silent(T0 + MAX_AHEAD_MS + 3_001) == {"w0"}
    assert fleet.live(T0 + MAX_AHEAD_MS + 3_001) == []
    # heard again on the right clock past the bound: taken (a restart too)
    assert fleet.observe(status(at=T0 + MAX_AHEAD_MS, state="stopped"), T0 + MAX_AHEAD_MS)
    assert fleet.get("w0").state == "stopped" and fleet.alive(T0 + MAX_AHEAD_MS) == []


def test_a_heartbeat_within_the_bound_or_without_a_clock_keeps_its_own_time() -> None:
    fleet = FleetView()
    fleet.observe(status(at=T0 + MAX_AHEAD_MS), T0)
    assert fleet.get("w0").last_seen_ms == T0 + MAX_AHEAD_MS
    fleet.observe(status(at=T0 + HOUR))  # no receiver's clock given: its own time (a replay)
    assert fleet.get("w0").last_seen_ms == T0 + HOUR


def test_a_worker_whose_clock_runs_far_ahead_is_still_heard_and_live() -> None:
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    for k in range(10):
        now = T0 + k * 500
        assert fleet.observe(status(at=now + HOUR, running=k), now)
        [view] = fleet.live(now)
        assert (view.running, view.last_seen_ms) == (k, now + MAX_AHEAD_MS)


def test_liveness_is_judged_as_of_what_the_receiver_has_heard_until() -> None:
    """A receiver reading behind (its heartbeats not read yet) judges as of when it had read
    everything: a worker heard 5 s before that is silent, one heard since is not, whatever
    ``now`` says."""
    fleet = FleetView(heartbeat_timeout_ms=3_000)
    fleet.observe(status("old", at=T0))
    fleet.observe(status("recent", at=T0 + 4_000))
    assert fleet.silent(T0 + 9_000) == {"old", "recent"}  # (reading as fast as they come)
    fleet.heard_until_ms = T0 + 5_000                      # 4 s behind
    assert fleet.judged(T0 + 9_000) == T0 + 5_000 and fleet.judged(T0 + 1_000) == T0 + 1_000
    assert fleet.silent(T0 + 9_000) == {"old"}
    assert [w.worker_id for w in fleet.live(T0 + 9_000)] == ["recent"]


def test_a_forgotten_worker_is_dropped_and_heard_again_as_new() -> None:
    fleet = FleetView()
    for i in range(1_000):
        fleet.observe(status(f"pod-{i}", at=T0 + 5_000, state="stopped"))
    fleet.observe(status("w0"))
    fleet.forget([f"pod-{i}" for i in range(1_000)])
    assert [w.worker_id for w in fleet.workers()] == ["w0"]
    # nor does the room they took stay: a pass over the fleet would go over it
    assert sys.getsizeof(fleet._workers) < 1_000  # (36 KB with the room of 1,000)
    assert fleet.observe(status("pod-1", at=T0))  # older than its stop: forgotten, it is new
    assert fleet.get("pod-1").state == "warm"
