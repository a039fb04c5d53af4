"""A partition added to a topic while a router, the controllers or a worker run
(``infra.bus.take_on_added``), on a real broker: a worker whose heartbeats go to a partition
added to the telemetry topic is read there, and is never judged silent (its requests would be
failed over); a command sent to a partition added to the control topic is obeyed."""

import asyncio
from collections import Counter
from contextlib import asynccontextmanager
from functools import partial

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.partitioner import murmur2

from infra.bus import make_producer, now_ms, partitions_of, read_back, reading
from schemas.codec import decode, encode
from schemas.events import Queued, WorkerStatus
from schemas.requests import InferenceRequest

BEAT_S = 0.5  # a worker's heartbeat interval
TIMEOUT_MS = 3_000  # the fleet views' default heartbeat timeout
WATCH_S = 8.0  # how long the worker is watched once its partition is added
PLACED_WITHIN_S = 20.0  # how soon a request sent to a partition added meanwhile is placed
PRODUCED_TO_WITHIN_S = 15.0  # how soon a producer sends the keys hashing to an added partition
STORED_WITHIN_S = 20.0  # how soon the analytics sink stores a record sent to an added partition
STREAM_TOKENS, STREAM_TOKENS_PER_S = 600, 50  # a stream of 12 s, long enough to be split


def hashed(key: str, partitions: int) -> int:
    """The partition the producers' default partitioner puts ``key`` on."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def heartbeat(worker: str, at_ms: int, **fields) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id=worker, slot=0, pool="h100@m",
                        gpu_type="h100", models_loaded=["m"], started_ms=at_ms - 1, **fields)


def service(kind: str, bootstrap: str, catalog):
    if kind == "router":
        from controllers.router.service import RouterService

        router = RouterService(bootstrap, catalog, recovery_window_s=0)
        return router, router.core.fleet
    from controllers.service import ControllersService

    controllers = ControllersService(bootstrap, catalog)
    return controllers, controllers.fleet


async def add_partition(bootstrap: str, catalog, producer, topic: str) -> int:
    """Add a partition to the catalog's ``topic``; once ``producer`` has learned of it (as a
    component's producer does at its metadata refresh), its number."""
    added = catalog.spec(topic).partitions
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=added + 1)})
    finally:
        await admin.close()
    while added not in (producer.client.cluster.partitions_for_topic(topic) or ()):
        await producer.client.force_metadata_update()
    return added


@asynccontextmanager
async def running(bootstrap: str, catalog, component):
    """``component`` running, with a producer, a check that it has not stopped, and a call
    that adds a partition to a topic (``add_partition``)."""
    producer = make_producer(bootstrap)
    await producer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(component.run(stop))

    def alive() -> None:
        assert not task.done(), task.exception()

    try:
        yield producer, alive, partial(add_partition, bootstrap, catalog, producer)
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await producer.stop()


async def until(condition, alive, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            alive()
            await asyncio.sleep(0.02)  # (polling the component's state: a condition)


async def a_worker_moved_to_an_added_partition(bootstrap: str, catalog, kind: str) -> dict:
    count = catalog.spec(catalog.telemetry).partitions
    worker = next(w for w in (f"w{i}" for i in range(1_000)) if hashed(w, count + 1) == count)
    component, fleet = service(kind, bootstrap, catalog)
    partition = hashed(worker, count)  # its key's partition before one is added
    async with running(bootstrap, catalog, component) as (producer, alive, add_partition):

        async def beating() -> None:
            while True:
                await producer.send_and_wait(catalog.telemetry,
                                             encode(heartbeat(worker, now_ms())),
                                             key=worker.encode(), partition=partition)
                await asyncio.sleep(BEAT_S)  # (a worker's heartbeat interval: the load)

        started = now_ms()
        await until(lambda: (fleet.heard_until_ms or 0) > started, alive, 60)
        beater = asyncio.create_task(beating())
        try:
            await until(lambda: fleet.get(worker) is not None, alive, 10)
            partition = await add_partition(catalog.telemetry)  # (its producer learned of it)
            moved_ms = now_ms()
            silent, read_ms = [], None
            while now_ms() < moved_ms + WATCH_S * 1000:
                alive()
                assert not beater.done(), beater.exception()
                now = now_ms()
                if worker in fleet.silent(now):
                    silent.append(now - moved_ms)
                if read_ms is None and fleet.get(worker).last_seen_ms >= moved_ms:
                    read_ms = now - moved_ms
                await asyncio.sleep(0.02)  # (sampling the view as it runs)
            # Its heartbeats there go on being read: one sent after the watch is. (Waited for:
            # the process stalled by the machine's load, the sampling above stalls with it and
            # can end before the component has read what the stall held up.)
            watched_ms = now_ms()
            await until(lambda: min(fleet.heard_until_ms, fleet.get(worker).last_seen_ms)
                        > watched_ms, alive, 10)
        finally:
            beater.cancel()
        return dict(silent=silent, read_ms=read_ms, heard_ms=fleet.heard_until_ms - moved_ms,
                    last_seen_ms=fleet.get(worker).last_seen_ms - moved_ms)


@pytest.mark.parametrize("kind", ["router", "controllers"])
def test_a_worker_heart_beating_on_a_partition_added_meanwhile_is_read_and_never_silent(
        kafka_bootstrap, catalog, kind):
    seen = asyncio.run(a_worker_moved_to_an_added_partition(kafka_bootstrap, catalog, kind))
    assert seen["silent"] == []
    # its heartbeats there are read within a heartbeat timeout, and go on being read
    assert seen["read_ms"] is not None and seen["read_ms"] < TIMEOUT_MS, seen
    assert seen["last_seen_ms"] > WATCH_S * 1000, seen
    assert seen["heard_ms"] > WATCH_S * 1000, seen


def test_a_worker_obeys_a_command_on_a_partition_added_to_the_control_topic(kafka_bootstrap,
                                                                            catalog):
    """Its control reader read the topic by subscription: an added partition was taken on at
    its metadata refresh (5 minutes), from its end, and a drain sent there meanwhile was lost."""
    from schemas.commands import DrainWorker
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    worker_id = "worker-0"
    worker = WorkerService(kafka_bootstrap, catalog,
                           WorkerIdentity(0, worker_id, "h100@llama-3-8b", "h100", "llama-3-8b"),
                           FixedRateEngine(decode_tokens_per_s=1000))

    async def scenario() -> float:
        async with running(kafka_bootstrap, catalog, worker) as (producer, alive, add_partition):
            # (reading its commands once it reads its slot)
            await until(lambda: getattr(worker, "dispatch", None) is not None, alive, 60)
            added = await add_partition(catalog.control)
            loop = asyncio.get_running_loop()
            sent = loop.time()
            drain = DrainWorker(event_time_ms=now_ms(), command_id="drain-1", worker_id=worker_id)
            await producer.send_and_wait(catalog.control, encode(drain), key=worker_id.encode(),
                                         partition=added)
            await until(lambda: worker.mode != "serving", alive, 10)
            return loop.time() - sent

    assert asyncio.run(scenario()) < 3.0  # (seconds from the command's send to the drain)


def test_a_closed_loop_replay_hears_a_step_end_on_a_partition_added_meanwhile(kafka_bootstrap,
                                                                             catalog):
    """``governor replay --closed-loop`` sends a task's next step once it reads the end of the
    step before: its reader, assigned the telemetry topic's partitions at its start, never read
    an end sent to one added since, and the step waited out ``--step-wait-s``."""
    from infra.replay import replay
    from infra.traces import TraceRequest
    from schemas.events import Completed, about

    rows = [TraceRequest(0.0, 64, 8, task_id="t1", steps_total=2),
            TraceRequest(0.1, 96, 8, task_id="t1", step=2, steps_total=2)]

    async def scenario() -> float:
        sent = {}
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        replaying = asyncio.create_task(replay(
            rows, kafka_bootstrap, catalog, run_id="pa", closed_loop=True, step_wait_s=60,
            on_sent=lambda request: sent.setdefault(request.request_id, request)))
        try:
            await until(lambda: "pa-000000" in sent, lambda: None, 60)
            added = await add_partition(kafka_bootstrap, catalog, producer, catalog.telemetry)
            first = sent["pa-000000"]
            end = Completed(event_time_ms=now_ms(), **about(first), worker_id="worker-0",
                            prompt_tokens=first.prompt_tokens, output_tokens=8, e2e_s=0.5)
            loop = asyncio.get_running_loop()
            ended = loop.time()
            await producer.send_and_wait(catalog.telemetry, encode(end),
                                         key=first.request_id.encode(), partition=added)
            await until(lambda: "pa-000001" in sent, lambda: None, 10)
            took = loop.time() - ended
            assert await asyncio.wait_for(replaying, timeout=30) == 2
            return took
        finally:
            replaying.cancel()
            await asyncio.gather(replaying, return_exceptions=True)
            await producer.stop()

    assert asyncio.run(scenario()) < 3.0  # (seconds from the end's send to the next step's)


async def _queued_counts(bootstrap: str, catalog) -> Counter:
    """How many ``Queued`` the telemetry topic holds now for each request id."""
    async with reading(bootstrap, catalog, [], "partitions-added-count") as typed:
        ends = await typed.consumer.end_offsets(partitions_of(typed.consumer, catalog,
                                                              [catalog.telemetry]))
        spec = catalog.spec(catalog.telemetry)
        return Counter([message.request_id
                        async for record in read_back(typed.consumer, catalog.telemetry, 0, ends)
                        if isinstance(message := decode(spec, record.value), Queued)])


def test_a_request_sent_to_a_partition_added_to_the_request_topic_is_placed_soon(
        kafka_bootstrap, catalog):
    """The routers read the request topic in a consumer group, which takes on an added
    partition when its leader's metadata lists it: aiokafka refreshed it every 5 minutes, so a
    request a client sent there waited that long unanswered. The requests sent meanwhile to the
    other partitions, across the rebalance it makes, are each placed once."""
    from controllers.router.service import RouterService

    router = RouterService(kafka_bootstrap, catalog, recovery_window_s=0)
    count = catalog.spec(catalog.requests).partitions

    def request(request_id: str) -> InferenceRequest:
        t = now_ms()
        return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                                model="m", prompt_tokens=32, max_tokens=4)

    async def scenario() -> tuple[float, frozenset[int], Counter]:
        async with running(kafka_bootstrap, catalog, router) as (producer, alive, add_partition):
            started = now_ms()

            async def beating() -> None:
                while True:
                    await producer.send_and_wait(
                        catalog.telemetry, encode(heartbeat("w0", now_ms(), kv_blocks_free=10_000)),
                        key=b"w0")
                    await asyncio.sleep(BEAT_S)  # (a worker's heartbeat interval: the load)

            sent: list[str] = []

            async def sending() -> None:  # (to the partitions the topic had, through it all)
                while True:
                    rid = f"old-{len(sent)}"
                    await producer.send_and_wait(catalog.requests, encode(request(rid)),
                                                 key=rid.encode(),
                                                 partition=len(sent) % count)
                    sent.append(rid)
                    await asyncio.sleep(0.05)  # (a client's pace, not a wait for a condition)

            beater = asyncio.create_task(beating())
            sender = asyncio.create_task(sending())
            try:
                await until(lambda: router.assigned and router.core.fleet.get("w0") is not None
                            and (router.core.fleet.heard_until_ms or 0) > started, alive, 60)
                added = await add_partition(catalog.requests)  # (its producer learned of it)
                loop = asyncio.get_running_loop()
                at = loop.time()
                await producer.send_and_wait(catalog.requests, encode(request("new")),
                                             key=b"new", partition=added)
                await until(lambda: "new" in router.core.in_flight, alive, PLACED_WITHIN_S)
                took, assigned = loop.time() - at, router.assigned
                assert not sender.done(), sender.exception()
                sender.cancel()
                await until(lambda: set(sent) <= set(router.core.in_flight), alive, 30)
            finally:
                for task in (beater, sender):
                    task.cancel()
                await asyncio.gather(beater, sender, return_exceptions=True)
        # (the router stopped: every Queued of what it placed is sent)
        return took, assigned, await _queued_counts(kafka_bootstrap, catalog)

    took, assigned, queued = asyncio.run(scenario())
    assert count in assigned
    print(f"placed {took:.2f} s after its send; {len(queued)} requests queued")
    assert queued["new"] == 1
    assert len(queued) > 1 and set(queued.values()) == {1}, queued


def test_a_producer_sends_to_a_partition_added_meanwhile_within_its_metadata_refresh(
        kafka_bootstrap, catalog):
    """Every component's producer (``make_producer``) learned of an added partition at its
    metadata refresh, every 5 minutes: the keys that hash to it went to the old partitions, and
    the partition took no load, that long."""
    topic = catalog.requests
    count = catalog.spec(topic).partitions
    key = next(k for k in (f"r{i}" for i in range(1_000)) if hashed(k, count + 1) == count)

    async def scenario() -> tuple[int, float]:
        producer, admin_side = make_producer(kafka_bootstrap), make_producer(kafka_bootstrap)
        for client in (producer, admin_side):
            await client.start()
        try:
            await producer.send_and_wait(topic, b"before", key=key.encode())
            added = await add_partition(kafka_bootstrap, catalog, admin_side, topic)
            loop = asyncio.get_running_loop()
            at = loop.time()
            await until(lambda: added in (producer.client.cluster.partitions_for_topic(topic)
                                          or ()), lambda: None, PRODUCED_TO_WITHIN_S)
            took = loop.time() - at
            sent = await producer.send_and_wait(topic, b"after", key=key.encode())
            return sent.partition, took
        finally:
            for client in (producer, admin_side):
                await client.stop()

    partition, took = asyncio.run(scenario())
    print(f"the producer sends to the added partition {took:.2f} s after it is added")
    assert partition == count


def test_routers_weigh_their_share_of_the_request_partitions_as_the_broker_has_them(
        kafka_bootstrap, catalog):
    """Task admission and the tenants' rate limits take each router's share of the request
    topic's partitions. It was counted against the catalog's number: once a partition was added
    to the topic, two routers holding 3 and 2 of 5 weighed 3/4 and 2/4 of the fleet, 1.25 in
    all, and admitted a quarter more than the fleet takes."""
    from controllers.router.service import RouterService

    routers = [RouterService(kafka_bootstrap, catalog, router_id=f"router-{i}",
                             recovery_window_s=0) for i in range(2)]
    total = catalog.spec(catalog.requests).partitions + 1

    async def scenario() -> list[float]:
        async with running(kafka_bootstrap, catalog, routers[0]) as (_, alive, add_partition):
            async with running(kafka_bootstrap, catalog, routers[1]) as (_, other_alive, _):

                def both_alive() -> None:
                    alive()
                    other_alive()

                await until(lambda: all(r.assigned for r in routers), both_alive, 60)
                added_ms = now_ms()
                await add_partition(catalog.requests)
                # (each assigned anew since: one whose partitions stay the same is told too)
                await until(lambda: all(r._assigned_ms >= added_ms for r in routers)
                            and len(routers[0].assigned | routers[1].assigned) == total
                            and not routers[0].assigned & routers[1].assigned, both_alive, 30)
                return sorted(r.core.request_share for r in routers)

    assert asyncio.run(scenario()) == [2 / total, 3 / total]


def test_a_consumer_whose_metadata_predates_an_added_partition_is_told_the_count_anew(
        kafka_bootstrap, catalog):
    """A router's share of the request partitions is counted when its group assigns them, of
    the partitions the broker lists then: its consumer's metadata may predate a partition the
    group's leader already assigned (two routers holding 3 and 2 of 5 weighed 3/4 and 2/4)."""
    from aiokafka import AIOKafkaConsumer

    from infra.bus import listed_partition_count, partitions_of

    topic = catalog.requests
    count = catalog.spec(topic).partitions

    async def scenario() -> tuple[int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap,
                                    metadata_max_age_ms=600_000)
        await consumer.start()
        try:
            await consumer._client.force_metadata_update()
            assert len(partitions_of(consumer, catalog, [topic])) == count
            producer = make_producer(kafka_bootstrap)  # (the group's leader, which knew)
            await producer.start()
            try:
                await asyncio.wait_for(add_partition(kafka_bootstrap, catalog, producer, topic),
                                       PRODUCED_TO_WITHIN_S)
            finally:
                await producer.stop()
            stale = len(partitions_of(consumer, catalog, [topic]))
            return stale, await listed_partition_count(consumer, catalog, topic)
        finally:
            await consumer.stop()

    stale, listed = asyncio.run(scenario())
    assert stale == count  # (the consumer's own metadata: what the share was counted of)
    assert listed == count + 1


def test_the_analytics_sink_stores_a_record_sent_to_a_partition_added_meanwhile(
        kafka_bootstrap, catalog, tmp_path):
    """The analytics sink reads the topics in a consumer group, which took on an added
    partition at its leader's metadata refresh, every 5 minutes: a heartbeat sent there was
    stored that late."""
    from analytics.progress import count_rows, wait_caught_up
    from analytics.store import StoreLocation
    from tests.integration.analytics_support import caught_up_sink

    location = StoreLocation.for_namespace(catalog.namespace, tmp_path)

    async def scenario() -> tuple[float, int]:
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        try:
            async with caught_up_sink(kafka_bootstrap, catalog, location) as (_, source, _):
                added = await add_partition(kafka_bootstrap, catalog, producer, catalog.telemetry)
                loop = asyncio.get_running_loop()
                at = loop.time()
                await producer.send_and_wait(catalog.telemetry, encode(heartbeat("w0", now_ms())),
                                             key=b"w0", partition=added)
                await wait_caught_up(kafka_bootstrap, catalog, source, timeout_s=STORED_WITHIN_S)
                return loop.time() - at, count_rows(source)["worker_status"]
        finally:
            await producer.stop()

    took, stored = asyncio.run(scenario())
    print(f"the sink stored it {took:.2f} s after its send")
    assert stored == 1


async def learned(producer, topic: str, partition: int) -> None:
    """Return once ``producer``'s metadata lists ``partition`` of ``topic`` (asked for now,
    rather than at its next refresh, ``PRODUCER_METADATA_MS``)."""
    async with asyncio.timeout(10):
        while partition not in (producer.client.cluster.partitions_for_topic(topic) or ()):
            await producer.client.force_metadata_update()


async def _records_of(bootstrap: str, catalog, topic: str, request_id: str) -> list:
    """(partition, message) of each record of ``request_id`` the topic holds now, each
    partition's in its order."""
    async with reading(bootstrap, catalog, [], "partitions-added-stream") as typed:
        ends = await typed.consumer.end_offsets(partitions_of(typed.consumer, catalog, [topic]))
        spec = catalog.spec(topic)
        return [(record.partition, message)
                async for record in read_back(typed.consumer, topic, 0, ends)
                if (message := decode(spec, record.value)).request_id == request_id]


def test_a_stream_stays_on_its_partition_when_partitions_are_added_to_its_topic(
        kafka_bootstrap, catalog):
    """A stream runs on one worker; a partition is added to the responses topic; once every
    producer has learned of it, the worker streams on, then hands the request back and another
    worker continues it to its end. Every chunk, the continuation's and the final one
    included, lands on the partition of the first. Before, a worker's chunks went where their
    key hashed among the partitions its producer knew: from its metadata refresh on, the rest
    of the stream, the continuation and the end went to another partition than the first."""
    from controllers.router.service import RouterService
    from infra.tally import RunTally
    from workers.fixed_rate import FixedRateEngine
    from workers.service import WorkerIdentity, WorkerService

    topic = catalog.responses
    count = catalog.spec(topic).partitions
    rid = next(r for r in (f"s{i}" for i in range(1_000))
               if hashed(r, count + 1) != hashed(r, count))  # (its key moves)
    router = RouterService(kafka_bootstrap, catalog, recovery_window_s=0)
    workers = [WorkerService(kafka_bootstrap, catalog,
                             WorkerIdentity(slot, f"worker-{slot}", "h100@llama-3-8b", "h100",
                                            "llama-3-8b"),
                             FixedRateEngine(decode_tokens_per_s=STREAM_TOKENS_PER_S),
                             slot_check_s=0) for slot in range(2)]

    def running_it() -> WorkerService | None:
        return next((w for w in workers if rid in w._running
                     and w._running[rid].tokens_flushed > 0), None)

    async def scenario() -> list:
        async with running(kafka_bootstrap, catalog, router) as (producer, alive, _):
            stops = [asyncio.Event() for _ in workers]
            tasks = [asyncio.create_task(w.run(stop)) for w, stop in zip(workers, stops)]

            def all_alive() -> None:
                alive()
                for task in tasks:
                    assert not task.done() or task.exception() is None, task.exception()

            try:
                await until(lambda: router.assigned and all(
                    router.core.fleet.get(w.me.worker_id) is not None for w in workers),
                    all_alive, 60)
                t = now_ms()
                await producer.send_and_wait(catalog.requests, encode(InferenceRequest(
                    event_time_ms=t, created_ms=t, request_id=rid, model="llama-3-8b",
                    prompt_tokens=32, max_tokens=STREAM_TOKENS)), key=rid.encode())
                await until(lambda: running_it() is not None, all_alive, 30)
                first = running_it()
                # (the router's producer tracks the responses topic; the test's, having sent
                # a request, the requests topic alone)
                added = await add_partition(kafka_bootstrap, catalog, router.producer, topic)
                for worker in workers:
                    await learned(worker.producer, topic, added)
                flushed = first._running[rid].tokens_flushed
                # (streamed on with the added partition known, then handed back mid-stream)
                await until(lambda: first._running[rid].tokens_flushed > flushed, all_alive, 10)
                first.hand_back_now()
                stops[workers.index(first)].set()
                await until(lambda: rid not in router.core.in_flight, alive, 60)
            finally:
                for worker, stop in zip(workers, stops):
                    worker.hand_back_now()
                    stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        return await _records_of(kafka_bootstrap, catalog, topic, rid)

    records = asyncio.run(scenario())
    chunks = [chunk for _, chunk in records]
    assert {chunk.attempt for chunk in chunks} == {1, 2}  # continued on the other worker
    assert sum(chunk.final for chunk in chunks) == 1
    first_partition = next(p for p, chunk in records if chunk.token_offset == 0)
    assert first_partition == hashed(rid, count)
    assert {p for p, _ in records} == {first_partition}, Counter(p for p, _ in records)
    tally = RunTally(prefix=rid)  # (the demo's reader, reading the stream's partition in order)
    for chunk in chunks:
        tally.observe(chunk)
    assert tally.summary()["streams_broken"] == 0 and tally._streams[rid].final
