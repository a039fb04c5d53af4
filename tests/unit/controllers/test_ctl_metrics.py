"""Prometheus metrics of the router and the controllers, read off the messages they emit."""

from __future__ import annotations

import pytest

from router_factories import T0, request_factory
from controllers.metrics import ControllerMetrics, RouterMetrics
from infra.bus import ConfigPartition
from schemas import commands
from schemas.events import Completed, Queued, Rejected, about
from schemas.requests import Dispatch
from schemas.topics import TopicCatalog
from streams.metrics import SignalMetrics


def _command(cls, **fields):
    return cls(event_time_ms=T0, command_id=f"c-{cls.__name__}-{len(fields)}", issued_by="test",
               reason="test", **fields)


def test_router_metrics_count_dispatches_by_attempt_and_endings_by_reason():
    answerable, waiting_continuations = [0], [0]
    metrics = RouterMetrics(lambda: answerable[0],
                            continuations_waiting=lambda: waiting_continuations[0])
    value = metrics.registry.get_sample_value
    req = request_factory("r1")
    first = Dispatch(event_time_ms=T0, request=req, worker_id="w0", slot=0, router_id="router-0")
    again = first.model_copy(update={"attempt": 2, "worker_id": "w1", "slot": 1})
    for message in (Queued(event_time_ms=T0, prompt_tokens=256, max_tokens=32,
                           **about(req)), first, again,
                    Rejected(event_time_ms=T0, reason="no_capacity", **about(request_factory("r2"))),
                    Rejected(event_time_ms=T0, reason="rate_limited", **about(request_factory("r3"))),
                    Rejected(event_time_ms=T0, reason="rate_limited", **about(request_factory("r4"))),
                    Completed(event_time_ms=T0, worker_id="w1", attempt=2, prompt_tokens=256,
                              output_tokens=32, finish_reason="length", e2e_s=1.0, **about(req))):
        metrics.emitted(message)
    assert value("governor_router_dispatches_total", {"attempt": "first"}) == 1
    assert value("governor_router_dispatches_total", {"attempt": "continuation"}) == 1
    assert value("governor_messages_emitted_total", {"type": "dispatch"}) == 2
    assert value("governor_messages_emitted_total", {"type": "queued"}) == 1
    assert value("governor_requests_ended_total", {"type": "rejected", "reason": "rate_limited"}) == 2
    assert value("governor_requests_ended_total", {"type": "rejected", "reason": "no_capacity"}) == 1
    assert value("governor_requests_ended_total", {"type": "completed", "reason": "length"}) == 1
    # requests in flight it answers for (RouterCore.answerable), read when scraped
    assert value("governor_router_in_flight") == 0
    answerable[0] = 1
    assert value("governor_router_in_flight") == 1
    assert value("governor_router_requests_waiting") == 0  # (none told of)
    # continuations with no live worker able to take them (RouterCore.continuations_waiting)
    assert value("governor_router_continuations_waiting") == 0
    waiting_continuations[0] = 2
    assert value("governor_router_continuations_waiting") == 2


def test_controller_metrics_hold_the_desired_state_last_commanded():
    metrics = ControllerMetrics()
    value = metrics.registry.get_sample_value
    for message in (
            _command(commands.SetLoadShedLevel, min_value=0.4),
            _command(commands.SetLoadShedLevel, min_value=0.7, model="m"),
            _command(commands.ScalePool, pool="h100@m", gpu_type="h100", model="m", replicas=3),
            _command(commands.ScalePool, pool="h100@m", gpu_type="h100", model="m", replicas=2),
            _command(commands.SetBreakerState, worker_id="w0", state="open"),
            _command(commands.SetBreakerState, worker_id="w1", state="half_open"),
            _command(commands.SetRoutingWeights, weights={"h100@m": 1.5, "a100@m": 0.5})):
        metrics.emitted(message)
    assert value("governor_load_shed_level", {"model": "*"}) == 0.4  # (every model's)
    assert value("governor_load_shed_level", {"model": "m"}) == 0.7
    assert value("governor_pool_replicas", {"pool": "h100@m"}) == 2
    assert value("governor_breaker_state", {"worker": "w0"}) == 2
    assert value("governor_breaker_state", {"worker": "w1"}) == 1
    assert value("governor_routing_weight", {"pool": "a100@m"}) == 0.5
    assert value("governor_messages_emitted_total", {"type": "scale_pool"}) == 2
    metrics.emitted(_command(commands.SetBreakerState, worker_id="w0", state="closed"))
    assert value("governor_breaker_state", {"worker": "w0"}) == 0
    metrics.emitted(_command(commands.SetRoutingWeights, weights={"h100@m": 1.0}))
    assert value("governor_routing_weight", {"pool": "a100@m"}) is None  # gone with its pool
    assert value("governor_routing_weight", {"pool": "h100@m"}) == 1.0


def test_a_cancellation_is_counted_without_its_clients_reason() -> None:
    """A cancellation's reason is its client's words (``CancelRequest.reason``, any text up to
    the limit): before 6 Dec each new one made a series of ``governor_requests_ended_total``,
    1,000 cancellations that name their time or request 1,000 series. The other endings'
    reasons come from closed sets and stay labels."""
    from schemas.events import Cancelled

    metrics = RouterMetrics(lambda: 0)
    for n in range(1_000):
        metrics.emitted(Cancelled(event_time_ms=T0, reason=f"user left at {T0 + n}",
                                  **about(request_factory(f"r{n}"))))
    metrics.emitted(Rejected(event_time_ms=T0, reason="load_shed", **about(request_factory("x"))))
    ended = [s for family in metrics.registry.collect() if family.name == "governor_requests_ended"
             for s in family.samples if s.name.endswith("_total")]
    assert {(s.labels["type"], s.labels["reason"], s.value) for s in ended} == {
        ("cancelled", "", 1_000), ("rejected", "load_shed", 1)}


def test_breaker_changes_and_pool_size_changes_are_counted() -> None:
    """A breaker can open and close again within one scrape interval (a 10 s cooldown and a
    healthy probe), and the gauges then show nothing happened: the changes are counted, by the
    state entered and by the direction a pool's size moved. A restatement, or the first state
    told of a worker or pool, is no change. Before 6 Dec only the gauges and the count of every
    command sent (restatements too) were served."""
    metrics = ControllerMetrics()
    value = metrics.registry.get_sample_value

    def breaker(worker: str, state: str) -> None:
        metrics.emitted(_command(commands.SetBreakerState, worker_id=worker, state=state))

    def scale(replicas: int) -> None:
        metrics.emitted(_command(commands.ScalePool, pool="h100@m", gpu_type="h100", model="m",
                                 replicas=replicas))

    for worker, state in (("w0", "closed"), ("w1", "closed"), ("w0", "open"), ("w0", "open"),
                          ("w0", "half_open"), ("w0", "closed"), ("w1", "open"), ("w2", "open")):
        breaker(worker, state)
    for replicas in (2, 2, 3, 5, 5, 4):
        scale(replicas)
    assert value("governor_breaker_changes_total", {"state": "open"}) == 3  # (w2: a restart's)
    assert value("governor_breaker_changes_total", {"state": "half_open"}) == 1
    assert value("governor_breaker_changes_total", {"state": "closed"}) == 1
    assert value("governor_pool_size_changes_total", {"pool": "h100@m", "direction": "up"}) == 2
    assert value("governor_pool_size_changes_total", {"pool": "h100@m", "direction": "down"}) == 1
    metrics.keep_breakers({"w1"})  # w0 and w2 forgotten; w2 back, closed: no change
    breaker("w2", "closed")
    assert value("governor_breaker_changes_total", {"state": "closed"}) == 1


class _Metadata:
    """A consumer's metadata as ``ConfigPartition`` asks it: the partitions of a topic."""

    def __init__(self, count: int) -> None:
        self.count = count

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.count))


@pytest.mark.parametrize("metrics", [lambda: RouterMetrics(lambda: 0), ControllerMetrics,
                                     SignalMetrics], ids=["router", "controllers", "streams"])
def test_the_config_topic_partitions_gauge_follows_what_the_reader_sees(metrics):
    """One gauge every reader of the configuration topic serves: 1, then the split (2) once its
    metadata lists a partition added."""
    served = metrics()
    metadata = _Metadata(1)
    reader = ConfigPartition(metadata, TopicCatalog("t"), "reader",
                             seen=served.config_partitions.set)

    def partitions() -> float | None:
        return served.registry.get_sample_value("governor_config_topic_partitions")

    reader.watch()
    assert partitions() == 1 and reader.split is None
    metadata.count = 2
    reader.watch()
    assert partitions() == 2 and reader.split is not None
