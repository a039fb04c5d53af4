"""Routers share the request topic in a consumer group. When one joins while another holds a
request waiting for a worker of a model nobody serves yet (one an autoscaler pool names), the
partitions move without a request being placed twice: the first router commits no further than
the waiting request and leaves it unanswered, and the partition's next owner reads it again from
there, but not the requests after it that the first router answered. Before this, the first router went on with
its stale batch while the second read the same requests again from the last commit, and both
placed them. A router that stops while a request waits leaves it, unanswered, to the next router
rather than refusing it (sent again to its partition, as on a rebalance). A router started under
the id of a running one (each would take the other's placements for its own) refuses to start and
says why; the running one serves on. The broker and the routers are real;
the workers are their heartbeats."""

import asyncio
import contextlib
import zlib
from collections import Counter

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from controllers.router.service import RouterService
from infra.bus import Outbox, now_ms, partitions, read_back, reading
from schemas.codec import decode, encode
from schemas.config import ConfigSet
from schemas.events import Queued, Rejected, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest

pytestmark = pytest.mark.integration

SERVED, LATE = "llama-3-8b", "llama-3-70b"  # LATE: no worker serves it until the routers split
#: A pool of the autoscaler names LATE: a worker of it may come, so a request for it waits (a
#: model no worker is of and no pool names is refused at once).
LATE_POOL = {"autoscaler.enabled": True, "autoscaler.pools": {f"h100@{LATE}": {}}}


def _request(request_id: str, model: str) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id, model=model,
                            prompt_tokens=32, max_tokens=4)


async def _heartbeats(outbox: Outbox, catalog, slot: int, model: str) -> None:
    started = now_ms()
    while True:
        outbox.emit(catalog.telemetry, WorkerStatus(
            event_time_ms=now_ms(), worker_id=f"w{slot}", slot=slot, pool=f"h100@{model}",
            gpu_type="h100", models_loaded=[model], kv_blocks_free=10_000, started_ms=started),
            f"w{slot}")
        await outbox.flush()
        await asyncio.sleep(0.3)  # the heartbeat period, not a wait for a condition


async def _everything(bootstrap, catalog, topic: str) -> list:
    """Every message ``topic`` holds now."""
    async with reading(bootstrap, catalog, [], "rebalance-count") as typed:
        end = await typed.consumer.end_offsets(partitions(catalog, [topic]))
        return [decode(catalog.spec(topic), record.value)
                async for record in read_back(typed.consumer, topic, 0, end)]


async def _committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {tp: meta.offset
                for tp, meta in (await admin.list_consumer_group_offsets(group)).items()}
    finally:
        await admin.close()


class _Group:
    """Routers of one consumer group on a real broker, workers heart-beating, and the requests
    answered (``Queued``) as the telemetry topic shows them."""

    def __init__(self, bootstrap, catalog) -> None:
        self.bootstrap, self.catalog = bootstrap, catalog
        self.routers: dict[str, RouterService] = {}
        self.running: dict[str, asyncio.Task] = {}
        self.stops: dict[str, asyncio.Event] = {}
        self.workers: list[asyncio.Task] = []
        self.answered: set[str] = set()

    async def __aenter__(self) -> "_Group":
        self._reading = reading(self.bootstrap, self.catalog, [self.catalog.telemetry],
                                "rebalance-test", offset_reset="earliest")
        self.typed = await self._reading.__aenter__()
        self.outbox = Outbox(self.typed.producer)
        for key, value in LATE_POOL.items():  # read by each router before its first request
            self.outbox.emit(self.catalog.config, ConfigSet(event_time_ms=now_ms(), key=key,
                                                            value=value), key)
        await self.outbox.flush()
        self.worker(0, SERVED)
        return self

    async def __aexit__(self, *exc) -> None:
        for name in list(self.running):
            await self.stop(name)
        for task in self.workers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._reading.__aexit__(*exc)

    def worker(self, slot: int, model: str) -> None:
        self.workers.append(asyncio.create_task(_heartbeats(self.outbox, self.catalog, slot,
                                                            model)))

    def start(self, name: str) -> RouterService:
        self.routers[name] = RouterService(self.bootstrap, self.catalog, router_id=name,
                                           recovery_window_s=0, no_worker_wait_s=60)
        self.stops[name] = asyncio.Event()
        self.running[name] = asyncio.create_task(self.routers[name].run(self.stops[name]))
        return self.routers[name]

    async def stop(self, name: str) -> None:
        self.stops[name].set()
        await self.running.pop(name)  # raises what the router failed with, if it did

    async def send(self, *requests: tuple[str, str, int]) -> None:
        """Send requests (id, model, partition) in one go."""
        for request_id, model, partition in requests:
            self.outbox.emit(self.catalog.requests, _request(request_id, model), request_id,
                             partition)
        await self.outbox.flush()

    async def until_split(self, a: RouterService, b: RouterService) -> None:
        """Until routers ``a`` and ``b`` hold every partition of the request topic between them,
        none twice: a router's ``assigned`` still holds every partition until its own new
        assignment comes, which may be after the other's."""
        parts = set(range(self.catalog.spec(self.catalog.requests).partitions))
        async with asyncio.timeout(60):
            while not (a.assigned and b.assigned and not a.assigned & b.assigned
                       and a.assigned | b.assigned == parts):
                await asyncio.sleep(0.05)  # polls the routers' assignments

    async def until(self, condition) -> None:
        """Until ``condition`` holds of the requests answered so far."""
        async with asyncio.timeout(60):
            while not condition(self.answered):
                self.answered.update(i.message.request_id for i in await self.typed.fetch(200)
                                     if isinstance(i.message, Queued))

    async def until_committed(self) -> None:
        """Until the group has committed every request: none is left to place."""
        group, requests = f"{self.catalog.namespace}.router", self.catalog.requests
        ends = await self.typed.consumer.end_offsets(partitions(self.catalog, [requests]))
        async with asyncio.timeout(60):
            while True:
                committed = await _committed(self.bootstrap, group)
                if all(committed.get(tp, 0) == end for tp, end in ends.items()):
                    break
                await asyncio.sleep(0.1)  # polls the group's offsets

    async def placements(self) -> dict:
        """Who placed each request (the routers of its dispatches), and how often it was
        answered ``Queued``: read once every router is stopped, so nothing more comes."""
        assert not self.running
        dispatched = [m for m in await _everything(self.bootstrap, self.catalog,
                                                   self.catalog.dispatch)
                      if isinstance(m, Dispatch)]
        queued = [m for m in await _everything(self.bootstrap, self.catalog,
                                               self.catalog.telemetry) if isinstance(m, Queued)]
        return {"placed_by": {rid: sorted(d.router_id for d in dispatched
                                          if d.request.request_id == rid)
                              for rid in {d.request.request_id for d in dispatched}},
                "queued": Counter(q.request_id for q in queued)}


async def _joining(bootstrap, catalog) -> dict:
    """router-b joins while router-a waits, mid-batch, for a worker of ``LATE``."""
    async with _Group(bootstrap, catalog) as group:
        a = group.start("router-a")
        await group.send(("probe", SERVED, 0))
        await group.until(lambda ids: "probe" in ids)  # router-a is up, holds every partition
        parts = range(catalog.spec(catalog.requests).partitions)
        # Each partition: one request placed at once, one that waits, and one placed at once
        # while it waits (out of line).
        await group.send(*[(f"{kind}-{p}", model, p) for p in parts for kind, model in (
            ("now", SERVED), ("late", LATE), ("after", SERVED))])
        await group.until(lambda ids: {f"{kind}-{p}" for p in parts
                                       for kind in ("now", "after")} <= ids)
        b = group.start("router-b")
        await group.until_split(a, b)
        split = {"router-a": sorted(a.assigned), "router-b": sorted(b.assigned)}
        group.worker(1, LATE)
        await group.until(lambda ids: {f"{kind}-{p}" for p in parts
                                       for kind in ("now", "late", "after")} <= ids)
        await group.until_committed()
        for name in ("router-a", "router-b"):
            await group.stop(name)
        return {"split": split, "parts": list(parts), **await group.placements()}


def test_a_router_joining_mid_batch_places_nothing_twice(kafka_bootstrap, catalog):
    seen = asyncio.run(_joining(kafka_bootstrap, catalog))
    split, parts = seen["split"], seen["parts"]
    assert sorted(split["router-a"] + split["router-b"]) == parts  # all, none twice
    ids = ["probe"] + [f"{kind}-{p}" for p in parts for kind in ("now", "late", "after")]
    assert seen["queued"] == Counter({i: 1 for i in ids})
    # Each placed once. A late request router-a had read but not answered was placed by its
    # partition's owner after the split, which read it again from router-a's last commit; a
    # request router-a answered before the split, by router-a alone, though the partition's
    # new owner read the one after the late one again too.
    placed_by, owner = seen["placed_by"], {p: "router-a" if p in split["router-a"] else
                                           "router-b" for p in parts}
    assert placed_by.keys() == set(ids) and placed_by["probe"] == ["router-a"]
    for p in parts:
        assert placed_by[f"late-{p}"] == [owner[p]]
        assert placed_by[f"now-{p}"] == ["router-a"] and placed_by[f"after-{p}"] == ["router-a"]


async def _unkeyed_twice(bootstrap, catalog) -> dict:
    """A client sends one request twice without a key, and its producer puts the two records on
    partitions of two routers (a keyless record's partition is the producer's choice)."""
    async with _Group(bootstrap, catalog) as group:
        a, b = group.start("router-a"), group.start("router-b")
        await group.until_split(a, b)
        twice = encode(_request("twice", SERVED))
        for partition in (min(a.assigned), min(b.assigned)):
            await group.typed.producer.send_and_wait(catalog.requests, twice, key=None,
                                                     partition=partition)
        await group.send(("keyed", SERVED, min(b.assigned)))
        await group.until(lambda ids: "keyed" in ids)
        await group.until_committed()
        for name in ("router-a", "router-b"):
            await group.stop(name)
        dead = [m for m in await _everything(bootstrap, catalog, catalog.deadletter)
                if m.source_topic == catalog.requests]
        return {"dead": dead, **await group.placements()}


def test_a_request_sent_twice_without_a_key_is_placed_by_no_router(kafka_bootstrap, catalog):
    """Until 6 Dec a record with no key was taken: each router placed the request it read on its
    own partition, and it ran twice (two dispatches, two ``Queued``). Now a request with no key
    is dead-lettered by its partition's router, as one keyed by another id is."""
    seen = asyncio.run(_unkeyed_twice(kafka_bootstrap, catalog))
    assert seen["placed_by"] == {"keyed": ["router-b"]}
    assert seen["queued"] == Counter({"keyed": 1})
    assert len(seen["dead"]) == 2
    for letter in seen["dead"]:
        assert (letter.reason, letter.key) == ("schema_violation", None)
        assert letter.error.startswith("key: none; a request and its cancellation are keyed by "
                                       "their request_id 'twice'"), letter.error


async def _stopping(bootstrap, catalog) -> dict:
    """router-a stops while a request waits for a worker; router-b comes up after it."""
    async with _Group(bootstrap, catalog) as group:
        group.start("router-a")
        await group.send(("now", SERVED, 0), ("late", LATE, 0), ("after", SERVED, 0))
        await group.until(lambda ids: {"now", "after"} <= ids)  # and router-a waits with "late"
        await group.stop("router-a")
        group.start("router-b")
        group.worker(1, LATE)
        await group.until(lambda ids: "late" in ids)
        await group.until_committed()
        await group.stop("router-b")
        rejected = [m for m in await _everything(bootstrap, catalog, catalog.telemetry)
                    if isinstance(m, Rejected)]
        return {"rejected": rejected, **await group.placements()}


def test_a_request_waiting_when_its_router_stops_is_left_to_the_next(kafka_bootstrap, catalog):
    seen = asyncio.run(_stopping(kafka_bootstrap, catalog))
    assert seen["rejected"] == []  # not refused for the stop
    # router-b, which read back nothing (recovery_window_s 0), read "late" again but not
    # "after", which router-a had answered
    assert seen["placed_by"] == {"now": ["router-a"], "late": ["router-b"],
                                 "after": ["router-a"]}
    assert seen["queued"] == Counter({"now": 1, "late": 1, "after": 1})


async def _id_in_use(bootstrap, catalog) -> dict:
    """router-x serves; a second router is started under its id."""
    async with _Group(bootstrap, catalog) as group:
        running = group.start("router-x")
        await group.send(("before", SERVED, 0))
        await group.until(lambda ids: "before" in ids)
        rebalances, assigned = running._rebalances, running.assigned
        newcomer = RouterService(bootstrap, catalog, router_id="router-x", recovery_window_s=0)
        stop = asyncio.Event()
        try:
            async with asyncio.timeout(60):
                await newcomer.run(stop)
            refused = None
        except Exception as exc:  # (what it refused with, or a timeout: asserted below)
            refused = exc
        finally:
            stop.set()
        await group.send(("after", SERVED, 1))
        await group.until(lambda ids: "after" in ids)
        return {"refused": refused, "serving": not group.running["router-x"].done(),
                "rebalanced": running._rebalances != rebalances,
                "same_partitions": running.assigned == assigned}


def test_a_router_started_under_an_id_in_use_refuses_and_the_running_one_serves_on(
        kafka_bootstrap, catalog):
    """Before 6 Dec the newcomer joined the group, and both listed it with two members under
    the id and stopped: ``governor up`` then stopped the whole stack for its router's exit."""
    from controllers.router.service import RouterIdInUse

    seen = asyncio.run(_id_in_use(kafka_bootstrap, catalog))
    assert isinstance(seen["refused"], RouterIdInUse), seen["refused"]
    assert "a router already runs under the id 'router-x'" in str(seen["refused"])
    assert "give it an id of its own (--router-id)" in str(seen["refused"])
    # the running router never saw it: no rebalance, its partitions kept, and it answers
    assert seen["serving"] and not seen["rebalanced"] and seen["same_partitions"]


async def _predecessor_leaving(bootstrap, catalog) -> dict:
    """A member under router-y's id (its predecessor, stopping) is in the group when router-y
    starts, and leaves while router-y waits."""
    from aiokafka import AIOKafkaConsumer

    old = AIOKafkaConsumer(catalog.requests, bootstrap_servers=bootstrap, client_id="router-y",
                           group_id=f"{catalog.namespace}.router", session_timeout_ms=6_000,
                           heartbeat_interval_ms=1_000)
    await old.start()
    async with asyncio.timeout(60):
        while not old.assignment():
            await old.getmany(timeout_ms=200)
    router = RouterService(bootstrap, catalog, router_id="router-y", recovery_window_s=0)
    listings: list = []
    members = router._members

    async def listed():  # what router-y hears of its group
        listing = await members()
        listings.append(sorted(m[1] for m in listing or ()))
        return listing

    router._members = listed
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(stop))
    try:
        async with asyncio.timeout(60):
            while not listings:
                await asyncio.sleep(0.05)  # polls router-y's first listing
            await old.stop()  # (leaves the group)
            while not router.assigned and not task.done():
                await asyncio.sleep(0.05)  # polls router-y's assignment
        return {"first_listing": listings[0], "assigned": sorted(router.assigned),
                "parts": list(range(catalog.spec(catalog.requests).partitions))}
    finally:
        stop.set()
        await task


def test_a_router_waits_for_a_predecessor_under_its_id_to_leave(kafka_bootstrap, catalog):
    """One that crashed stays a member until the session timeout: its successor, restarted at
    once, is not refused for it."""
    seen = asyncio.run(_predecessor_leaving(kafka_bootstrap, catalog))
    assert seen["first_listing"] == ["router-y"] and seen["assigned"] == seen["parts"]


async def _tenant_limit(bootstrap, catalog) -> Counter:
    """Two routers split the partitions; a tenant limited to a burst of 2 requests (and 0.1 a
    second more) sends 5 requests to each partition at once."""
    async with _Group(bootstrap, catalog) as group:
        limit = {"requests_per_s": 0.1, "tokens_per_s": 1e6, "burst_s": 20}
        group.outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(), key="tenants.acme",
                                                    value=limit), "tenants.acme")
        await group.outbox.flush()
        a, b = group.start("router-a"), group.start("router-b")
        await group.until_split(a, b)
        parts = range(catalog.spec(catalog.requests).partitions)
        ids = {f"acme-{p}-{i}": p for p in parts for i in range(5)}
        for request_id, p in ids.items():
            t = now_ms()
            group.outbox.emit(catalog.requests, InferenceRequest(
                event_time_ms=t, created_ms=t, request_id=request_id, tenant="acme",
                prompt_tokens=32, max_tokens=4), request_id, p)
        await group.outbox.flush()
        answers: dict[str, str] = {}
        async with asyncio.timeout(60):
            while answers.keys() < ids.keys():
                for item in await group.typed.fetch(200):
                    if isinstance(item.message, (Queued, Rejected)) \
                            and item.message.request_id in ids:
                        answers[item.message.request_id] = (
                            "queued" if isinstance(item.message, Queued)
                            else item.message.reason)
        return Counter(answers.values())


def test_a_tenants_rate_limit_holds_across_the_routers_of_the_group(kafka_bootstrap, catalog):
    # Each router admits its share (its partitions) of the tenant's limit. Before, each admitted
    # the whole limit: with two routers the tenant got twice its rate, 4 of the 20 at once.
    answers = asyncio.run(_tenant_limit(kafka_bootstrap, catalog))
    assert answers == Counter({"queued": 2, "rate_limited": 18})


def _murmur2_partition(key: str, partitions: int) -> int:
    """Where Kafka's Java client and aiokafka put ``key`` (and Governor's own producers)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def _crc32_partition(key: str, partitions: int) -> int:
    """Where librdkafka's default partitioner (``consistent_random``) puts ``key``: CRC32 of it
    modulo the partitions (confluent-kafka-python, Go and .NET clients, unless configured)."""
    return zlib.crc32(key.encode()) % partitions


async def _two_partitioners(bootstrap, catalog) -> dict:
    """A request sent by a client whose producer partitions keys by librdkafka's default waits
    at its router for a worker of ``LATE``; its cancellation, from a client partitioning as
    Kafka's Java client does, is read first by the other router; then a worker of ``LATE``
    comes."""
    async with _Group(bootstrap, catalog) as group:
        a, b = group.start("router-a"), group.start("router-b")
        await group.until_split(a, b)
        n = catalog.spec(catalog.requests).partitions
        owner = {p: router for router in (a, b) for p in router.assigned}
        rid = next(rid for rid in (f"split-{i}" for i in range(1000))
                   if owner[_crc32_partition(rid, n)] is not owner[_murmur2_partition(rid, n)])
        holder, other = owner[_crc32_partition(rid, n)], owner[_murmur2_partition(rid, n)]
        await group.send((rid, LATE, _crc32_partition(rid, n)))
        async with asyncio.timeout(30):
            while rid not in holder.waiting:
                await asyncio.sleep(0.05)  # polls the router's waiting room
        cancel_at = TopicPartition(catalog.requests, _murmur2_partition(rid, n))
        group.outbox.emit(catalog.requests, CancelRequest(event_time_ms=now_ms(), request_id=rid,
                                                          reason="client left"),
                          rid, cancel_at.partition)
        await group.outbox.flush()
        end = (await group.typed.consumer.end_offsets([cancel_at]))[cancel_at]
        async with asyncio.timeout(30):  # the other router has read (and committed) the cancel
            while (await _committed(bootstrap, f"{catalog.namespace}.router")).get(cancel_at) != end:
                await asyncio.sleep(0.1)  # polls the group's offsets
        group.worker(1, LATE)
        await group.until(lambda ids: rid in ids)  # placed by its router, at last
        forwarded = []
        async with reading(bootstrap, catalog, [catalog.dispatch], "partitioners",
                           offset_reset="earliest") as typed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(20):
                    while not forwarded:
                        forwarded += [(i.record.partition, i.message) for i in await typed.fetch(100)
                                      if isinstance(i.message, CancelRequest)
                                      and i.message.request_id == rid]
        return {"holder": holder.router_id, "other": other.router_id, "forwarded": forwarded}


def test_a_cancel_on_another_partition_than_its_request_still_ends_it(kafka_bootstrap, catalog):
    """A client's cancellation produced under another partitioner than its request (one client
    on librdkafka's default, CRC32; another on Kafka's Java default, murmur2) reaches another
    router than the one holding the request waiting for a worker. Before 6 Dec that router
    kept it as a cancel read before its request, which never came to it, and the request ran to
    its end once a worker came. Now a router holding such a cancel forwards it to the request's
    slot when it sees another router place the request, and the worker stops it."""
    seen = asyncio.run(_two_partitioners(kafka_bootstrap, catalog))
    assert seen["holder"] != seen["other"]
    assert [(slot, c.reason, c.attempt) for slot, c in seen["forwarded"]] == [
        (1, "client left", None)]
