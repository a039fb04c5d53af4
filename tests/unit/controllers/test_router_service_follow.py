"""What the router service makes of the live events it follows (no broker: the adapter's rule)."""

from controllers.router.service import RouterService
from schemas.codec import decode
from schemas.events import Queued, Rejected
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000


class _ReadToItsEnd:
    """The follower's aiokafka consumer as ``RouterService._follow`` asks it: every partition
    read to its end, none added since it was assigned (it reports no assignment)."""

    def assignment(self) -> set:
        return set()

    def highwater(self, _tp) -> int:
        return 0

    def last_poll_timestamp(self, _tp) -> int:
        return T0

    async def position(self, _tp) -> int:
        return 0


def test_a_request_another_router_answered_is_not_placed_again_if_redelivered_here() -> None:
    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    router._followed(Queued(event_time_ms=T0, request_id="by-b", created_ms=T0, prompt_tokens=1,
                            max_tokens=1))
    router._followed(Rejected(event_time_ms=T0, request_id="refused-by-b", reason="load_shed"))
    assert "by-b" in router._seen and "refused-by-b" in router._seen  # _on_request drops them
    assert "other" not in router._seen


def test_read_back_counts_a_queued_request_as_answered_only_with_its_dispatch() -> None:
    from schemas.examples import example_request
    from schemas.requests import Dispatch

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-0")
    placed, lost = example_request("placed"), example_request("lost")
    router._recovered(Dispatch(event_time_ms=T0, request=placed, worker_id="w0", slot=0,
                               router_id="router-1"))  # another router placed it
    for request in (placed, lost):  # the crash came between lost's Queued and its Dispatch
        router._recovered(Queued(event_time_ms=T0, request_id=request.request_id,
                                 created_ms=T0, prompt_tokens=1, max_tokens=1))
    assert "placed" in router._seen
    assert "lost" not in router._seen  # uncommitted, so redelivered: it is placed then


def test_read_back_takes_a_forwarded_cancel_of_a_request_waiting_to_continue() -> None:
    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.events import Requeued
    from schemas.examples import example_request
    from schemas.requests import CancelRequest, Dispatch

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-0")
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    request = example_request("r1")
    router._recovered(Dispatch(event_time_ms=T0, request=request, worker_id="w0", slot=0,
                               router_id="router-0"), 0)
    router._recovered(Requeued(event_time_ms=T0 + 1, request_id="r1", worker_id="w0", attempt=1,
                               tokens_done=2))
    router._recovered(CancelRequest(event_time_ms=T0 + 2, request_id="r1", reason="user left"), 0)
    # Taken once the router is assigned (until then, a router that listed this one as gone
    # may be ending it too)
    assert len(router.outbox) == 0 and "r1" in router.core.in_flight
    router._settled = True  # (as the group's assignment sets it)
    assert router._take_deferred() == 2
    assert [decode(router.catalog.spec(topic), value).type
            for topic, value, _key, _partition in router.outbox._queue] == ["chunk", "cancelled"]
    assert "r1" not in router.core.in_flight  # ended: its stream, and Cancelled


def test_a_forwarded_cancel_followed_while_not_assigned_is_taken_once_assigned() -> None:
    from infra.bus import Outbox
    from schemas.events import Requeued
    from schemas.examples import example_request
    from schemas.requests import CancelRequest, Dispatch

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-0")
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    router._recovered(Dispatch(event_time_ms=T0, request=example_request("r1"), worker_id="w0",
                               slot=0, router_id="router-0"), 0)
    router._followed(Requeued(event_time_ms=T0 + 1, request_id="r1", worker_id="w0", attempt=1,
                              tokens_done=2))
    cancel = CancelRequest(event_time_ms=T0 + 2, request_id="r1", reason="user left")
    assert router._followed(cancel, 0) == 0 and len(router.outbox) == 0  # not assigned yet
    router._settled = True
    assert router._take_deferred() == 2 and "r1" not in router.core.in_flight  # (its stream's
    # end, and Cancelled)
    assert router._take_deferred() == 0  # taken once


def test_a_request_whose_chunks_would_go_to_an_internal_topic_is_refused() -> None:
    import asyncio

    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.examples import example_request

    catalog = TopicCatalog("unit")
    router = RouterService("127.0.0.1:1", catalog)
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    request = example_request("r1").model_copy(update={"reply_to": catalog.dispatch})
    asyncio.run(router._on_request(request))
    ((topic, value, _key, _partition),) = router.outbox._queue
    rejected = decode(catalog.spec(topic), value)
    assert topic == catalog.telemetry and rejected.reason == "invalid_request"
    assert catalog.dispatch in rejected.detail and "r1" not in router.core.in_flight
    # refused like any step: its task fails, no retry hint
    assert rejected.retry_after_s is None
    assert (request.tenant, request.task_id) == ("acme", "task-1")
    assert ("acme", "task-1") in router.core._failed_tasks


def test_a_request_that_fits_a_record_but_whose_dispatch_does_not_is_refused() -> None:
    import asyncio

    from infra.bus import Outbox, now_ms
    from schemas.codec import decode, encode
    from schemas.events import WorkerStatus
    from schemas.examples import example_request
    from schemas.limits import MAX_RECORD_BYTES

    catalog = TopicCatalog("unit")
    router = RouterService("127.0.0.1:1", catalog)
    router.outbox = Outbox(producer=None)
    now = now_ms()
    router.core.observe(WorkerStatus(event_time_ms=now, worker_id="w0", slot=0,
                                     pool="h100@llama-3-8b", gpu_type="h100",
                                     models_loaded=["llama-3-8b"], started_ms=now), now)
    request = example_request("big").model_copy(update={"created_ms": now, "deadline_ms": None})
    size = len(encode(request))
    request = request.model_copy(update={"prompt_text": "x" * (MAX_RECORD_BYTES - size - 10)})
    assert len(encode(request)) <= MAX_RECORD_BYTES  # a valid record on the requests topic
    asyncio.run(router._on_request(request))  # the router lives on
    end, rejected = [decode(catalog.spec(topic), value)
                     for topic, value, _key, _partition in router.outbox._queue]
    assert (end.type, end.final, end.finish_reason, end.tokens) == ("chunk", True, "error", [])
    assert rejected.reason == "invalid_request" and "too large to dispatch" in rejected.detail
    assert "big" not in router.core.in_flight and router.core.ledger.requests("w0") == 0


def test_a_batch_cut_short_is_committed_up_to_each_partitions_first_request_left() -> None:
    from aiokafka import ConsumerRecord, TopicPartition

    from controllers.router.service import _done_with
    from infra.bus import Decoded
    from schemas.examples import example_request

    def item(partition: int, offset: int) -> Decoded:
        record = ConsumerRecord("reqs", partition, offset, T0, 0, None, b"", None, 0, 0, [])
        return Decoded(record, example_request(f"p{partition}-{offset}"))

    batch = [item(0, 10), item(0, 11), item(1, 5), item(0, 12), item(1, 6), item(2, 3)]
    dead = [(1, 7), (2, 4), (3, 9)]  # partition 1's and 2's after their first left: read again
    assert _done_with("reqs", batch, 3, dead) == {
        TopicPartition("reqs", 0): 12,  # 10 and 11 handled, 12 left
        TopicPartition("reqs", 1): 6,  # 5 handled, 6 left (7 was dead-lettered after it)
        TopicPartition("reqs", 2): 3,  # none handled
        TopicPartition("reqs", 3): 10,  # only a dead letter: done with
    }
    assert _done_with("reqs", batch, len(batch), dead) == {
        TopicPartition("reqs", p): offset for p, offset in ((0, 13), (1, 8), (2, 5), (3, 10))}


def test_a_request_the_core_fails_on_is_refused_and_the_router_carries_on(monkeypatch) -> None:
    """A bug one request sets off must not stop the router: it would meet the same request
    again at every restart (never committed), and no request behind it would be served."""
    import asyncio

    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.examples import example_request

    catalog = TopicCatalog("unit")
    router = RouterService("127.0.0.1:1", catalog)
    router.outbox = Outbox(producer=None)
    route = router.core.route

    def failing(request, now, stream_partition=None):
        if request.request_id == "poison":
            raise ValueError("math domain error" + " (and much more)" * 200)
        return route(request, now, stream_partition)

    monkeypatch.setattr(router.core, "route", failing)
    asyncio.run(router._on_request(example_request("poison")))  # answered, not raised
    end, rejected = [decode(catalog.spec(topic), value)
                     for topic, value, _key, _partition in router.outbox._queue]
    assert (end.type, end.final, end.finish_reason, end.tokens) == ("chunk", True, "error", [])
    assert (rejected.request_id, rejected.reason) == ("poison", "invalid_request")
    assert "ValueError: math domain error" in rejected.detail


def test_a_worker_claiming_a_slot_past_the_dispatch_partitions_is_not_placed_on() -> None:
    """A dispatch to it could not be sent (aiokafka refuses a partition the topic lacks)."""
    from infra.bus import now_ms
    from schemas.events import WorkerStatus
    from schemas.examples import example_request

    catalog = TopicCatalog("unit")
    router = RouterService("127.0.0.1:1", catalog)
    now = now_ms()
    for slot in (40, 3):
        router._followed(WorkerStatus(event_time_ms=now, worker_id=f"w{slot}", slot=slot,
                                      pool="h100@llama-3-8b", gpu_type="h100",
                                      models_loaded=["llama-3-8b"], started_ms=now))
    assert [w.worker_id for w in router.core.fleet.live(now)] == ["w3"]
    request = example_request("r1").model_copy(update={"created_ms": now, "deadline_ms": None})
    decision = router.core.route(request, now)
    assert decision.dispatch is not None and decision.dispatch.slot == 3


def _listing(monkeypatch, error: int, members: list[tuple]) -> None:
    """The broker's answer to describing the router group (aiokafka returns an error in the
    reply, it does not raise it)."""
    from types import SimpleNamespace

    import controllers.router.service as service

    class Admin:
        def __init__(self, **_kwargs) -> None:
            pass

        async def start(self) -> None:
            pass

        async def close(self) -> None:
            pass

        async def describe_consumer_groups(self, groups):
            return [SimpleNamespace(groups=[(error, groups[0], "Stable", "consumer", "range",
                                             members)])]

    monkeypatch.setattr(service, "AIOKafkaAdminClient", Admin)


def _router_b_placed_r1_and_w0_hands_it_back(a: RouterService, listed) -> list:
    """router-b, alive, placed r1 on w0; router ``a`` lists the group (``listed``); 61 s later
    w0 hands r1 back: what ``a`` resumes."""
    import asyncio
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from router_factories import request_factory, status_factory

    from controllers.router import service
    from schemas.events import Requeued
    from schemas.requests import Dispatch

    now = service.now_ms()
    later = now + 61_000
    for slot in (0, 1):
        a.core.observe(status_factory(f"w{slot}", slot, at=now), now)
    a.core.observe(Dispatch(event_time_ms=now, request=request_factory("r1"), worker_id="w0",
                            slot=0, router_id="router-b"), now)
    asyncio.run(a._check_id())
    listed(a)
    for slot in (0, 1):
        a.core.observe(status_factory(f"w{slot}", slot, at=later), later)
    a.core.observe(Requeued(event_time_ms=later, request_id="r1", worker_id="w0", attempt=1,
                            tokens_done=3), later)
    return [e.message for e in a.core.resume(later)]


def test_a_group_listing_with_an_error_is_not_taken_for_every_other_router_gone(monkeypatch):
    def not_listed(a: RouterService) -> None:
        assert not a._listed  # asked again

    a = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-a")
    _listing(monkeypatch, 16, [])  # NOT_COORDINATOR: the coordinator moved, no members listed
    assert _router_b_placed_r1_and_w0_hands_it_back(a, not_listed) == []  # router-b's to resume


def test_a_group_listing_without_this_router_is_asked_again(monkeypatch):
    import asyncio

    a = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-a")
    _listing(monkeypatch, 0, [("m-b", "router-b", "/10.0.0.2", b"", b"")])
    asyncio.run(a._check_id())
    assert not a._listed


def test_a_good_group_listing_lets_a_router_continue_a_gone_routers_requests(monkeypatch):
    from schemas.requests import Dispatch

    def listed(a: RouterService) -> None:
        assert a._listed

    a = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-a")
    _listing(monkeypatch, 0, [("m-a", "router-a", "/10.0.0.1", b"", b"")])  # router-b is gone
    emitted = _router_b_placed_r1_and_w0_hands_it_back(a, listed)
    [resumed] = [m for m in emitted if isinstance(m, Dispatch)]
    assert resumed.router_id == "router-a" and resumed.attempt == 2


def test_a_dispatch_of_a_predecessor_under_this_routers_id_is_taken_over() -> None:
    """A rolling restart: the new process under router-0 follows the old one's placements made
    after its read-back; they are its own to continue, not dropped as already accounted for."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from router_factories import request_factory, status_factory

    from schemas.events import Requeued
    from schemas.requests import Dispatch

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"), router_id="router-0")
    for slot in (0, 1):
        router.core.observe(status_factory(f"w{slot}", slot, at=T0), T0)
    old = Dispatch(event_time_ms=T0, request=request_factory("r1"), worker_id="w0", slot=0,
                   router_id="router-0")
    router._followed(old)
    assert "r1" in router.core.in_flight and "r1" in router._seen
    router._followed(old)  # read again: nothing counted twice
    assert router.core.ledger.requests("w0") == 1
    router.core.observe(Requeued(event_time_ms=T0 + 1, request_id="r1", worker_id="w0",
                                 attempt=1, tokens_done=3), T0 + 1)
    [resumed] = [e.message for e in router.core.resume(T0 + 2) if isinstance(e.message, Dispatch)]
    assert resumed.request.request_id == "r1" and resumed.attempt == 2


def test_a_followed_event_the_router_fails_on_is_dead_lettered_and_following_goes_on() -> None:
    import asyncio
    from types import SimpleNamespace

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    events = [Queued(event_time_ms=T0, request_id=rid, created_ms=T0, prompt_tokens=1,
                     max_tokens=1) for rid in ("bad", "good")]

    def followed(message, partition=None, written_ms=None) -> int:
        if message.request_id == "bad":
            raise ValueError("a bug it set off")
        router._remember(message.request_id)
        return 0

    class Typed:  # what the follower's typed consumer hands over: one fetch, then the end
        letters: list = []
        fetches = 0
        consumer = _ReadToItsEnd()

        async def fetch(self, _ms):
            self.fetches += 1
            if self.fetches > 1:
                raise asyncio.CancelledError
            return [SimpleNamespace(message=m, record=SimpleNamespace(
                topic="unit.telemetry", partition=0, offset=i, timestamp=T0))
                for i, m in enumerate(events)]

        async def dead_letter(self, bad) -> None:
            self.letters += [(record.offset, exc.reason, exc.detail) for record, exc in bad]

        def take_dead_lettered(self) -> list:
            return []

    router._followed = followed
    typed = Typed()
    try:
        asyncio.run(router._follow(typed))
    except asyncio.CancelledError:
        pass
    assert typed.letters == [(0, "unprocessable", "ValueError: a bug it set off")]
    assert "good" in router._seen


class _Acks:
    """A producer that acknowledges every send at once and keeps what was sent."""

    client = None

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, _topic, value, *_args, **_kwargs):
        import asyncio

        self.sent.append(value)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def test_a_redelivered_request_another_router_placed_is_not_placed_again() -> None:
    """Its Dispatch (dispatch topic) was read, its Queued (telemetry) not yet."""
    import asyncio
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from router_factories import request_factory, status_factory

    from infra.bus import Outbox
    from schemas.requests import Dispatch

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    router.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    router._followed(status_factory("w0", 0, at=T0), 0)
    request = request_factory("r1")
    router._followed(Dispatch(event_time_ms=T0, request=request, worker_id="w0", slot=0,
                              router_id="router-b"))
    asyncio.run(router._on_request(request))
    # neither placed again nor answered again; its Queued, not read, is sent as of its placement
    # (since 6 Dec: a router sends it once its Dispatch is on the broker, and one that stopped
    # between the two left it without one; a Queued read twice is taken once)
    [(topic, value, key, _partition)] = router.outbox._queue
    queued = decode(TopicCatalog("unit").spec(topic), value)
    assert (queued.type, queued.request_id, queued.event_time_ms) == ("queued", "r1", T0)


def test_a_router_failing_on_every_followed_event_stops() -> None:
    """Set aside one by one, a bug hitting every heartbeat would leave the router serving on a
    fleet view gone stale: after 100 failures in a row it stops (and is restarted)."""
    import asyncio
    from types import SimpleNamespace

    import pytest

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))

    def followed(_message, _partition=None, _written_ms=None) -> int:
        raise ValueError("broken")

    class Typed:
        letters = 0
        consumer = _ReadToItsEnd()

        async def fetch(self, _ms):
            return [SimpleNamespace(message=None, record=SimpleNamespace(
                topic="unit.telemetry", partition=0, offset=i, timestamp=T0))
                for i in range(150)]

        async def dead_letter(self, bad) -> None:
            self.letters += len(bad)

        def take_dead_lettered(self) -> list:
            return []

    router._followed = followed
    typed = Typed()
    with pytest.raises(ValueError, match="broken"):
        asyncio.run(router._follow(typed))
    assert typed.letters == 100


def test_a_worker_may_come_for_a_model_of_the_fleet_or_of_an_autoscaler_pool_only() -> None:
    """What a request for a model no live worker serves may wait for (else it is refused at
    once: a mistyped model name)."""
    from schemas.config import GovernorConfig
    from schemas.events import WorkerStatus

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    assert router._may_come("anything")  # no worker heard of yet: anything may come
    router.core.fleet.observe(WorkerStatus(
        event_time_ms=T0, worker_id="w0", slot=0, pool="h100@llama-2-7b", gpu_type="h100",
        state="loading", started_ms=T0))
    assert router._may_come("llama-2-7b")  # loading: not live, but coming
    assert not router._may_come("llama-2-7B")
    pooled = GovernorConfig().with_setting("autoscaler.pools",
                                           {"a100@mistral-7b": {"min_replicas": 0}})
    router.core.apply_config(pooled)
    assert not router._may_come("mistral-7b")  # a pool, but no autoscaler to start it
    # (its client is told so: before 6 Dec "no autoscaler pool names it", which one did)
    assert "an autoscaler pool names it but the autoscaler is off (autoscaler.enabled)" in \
        router._unheard_of("mistral-7b")
    router.core.apply_config(pooled.with_setting("autoscaler.enabled", True))
    assert router._may_come("mistral-7b")
    assert "(the fleet's models: llama-2-7b)" in router._unheard_of("llama-2-7B")


def test_a_pool_the_autoscaler_commands_is_one_a_worker_may_come_for(monkeypatch) -> None:
    """It restates every pool's size every few seconds, one at zero too: a router restarted
    long after the pool's last worker went reads the command back (or follows it) and waits."""
    from controllers.router import service as service_module
    from schemas.commands import ScalePool
    from schemas.events import WorkerStatus

    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    router.core.fleet.observe(WorkerStatus(
        event_time_ms=T0, worker_id="w0", slot=0, pool="h100@llama-3-8b", gpu_type="h100",
        models_loaded=["llama-3-8b"], started_ms=T0))
    clock = {"now": T0}
    monkeypatch.setattr(service_module, "now_ms", lambda: clock["now"])
    assert not router._may_come("qwen-7b")
    router._recovered(ScalePool(event_time_ms=T0, command_id="c", issued_by="autoscaler",
                                pool="a100@qwen-7b", gpu_type="a100", model="qwen-7b",
                                replicas=0, reason="idle: scaled to zero"))
    assert router._may_come("qwen-7b")
    clock["now"] = T0 + service_module.COMMANDED_FOR_MS
    assert not router._may_come("qwen-7b")  # no longer commanded: the autoscaler is gone
    router._followed(ScalePool(event_time_ms=clock["now"], command_id="d",
                               issued_by="autoscaler", pool="a100@qwen-7b", gpu_type="a100",
                               model="qwen-7b", replicas=0, reason="restated"))
    assert router._may_come("qwen-7b")
