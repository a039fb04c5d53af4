"""A partition added to a topic while a router, the controllers or a worker run
(``infra.bus.take_on_added``), on a real broker: a worker whose heartbeats go to a partition
added to the telemetry topic is read there, and is never judged silent (its requests would be
failed over); a command sent to a partition added to the control topic is obeyed."""

import asyncio
from contextlib import asynccontextmanager

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.partitioner import murmur2

from infra.bus import make_producer, now_ms
from schemas.codec import encode
from schemas.events import WorkerStatus

BEAT_S = 0.5  # a worker's heartbeat interval
TIMEOUT_MS = 3_000  # the fleet views' default heartbeat timeout
WATCH_S = 8.0  # how long the worker is watched once its partition is added


def hashed(key: str, partitions: int) -> int:
    """The partition the producers' default partitioner puts ``key`` on."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def heartbeat(worker: str, at_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id=worker, slot=0, pool="h100@m",
                        gpu_type="h100", models_loaded=["m"], started_ms=at_ms - 1)


def service(kind: str, bootstrap: str, catalog):
    if kind == "router":
        from controllers.router.service import RouterService

        router = RouterService(bootstrap, catalog, recovery_window_s=0)
        return router, router.core.fleet
    from controllers.service import ControllersService

    controllers = ControllersService(bootstrap, catalog)
    return controllers, controllers.fleet


@asynccontextmanager
async def running(bootstrap: str, catalog, component):
    """``component`` running, with a producer, a check that it has not stopped, and a call
    that adds a partition to a topic (once the producer has learned of it: the new one's
    number)."""
    producer = make_producer(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await producer.start()
    await admin.start()
    stop = asyncio.Event()
    task = asyncio.create_task(component.run(stop))

    def alive() -> None:
        assert not task.done(), task.exception()

    async def add_partition(topic: str) -> int:
        added = catalog.spec(topic).partitions
        await admin.create_partitions({topic: NewPartitions(total_count=added + 1)})
        while added not in (producer.client.cluster.partitions_for_topic(topic) or ()):
            await producer.client.force_metadata_update()
        return added

    try:
        yield producer, alive, add_partition
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await admin.close()
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
    assert seen["last_seen_ms"] > WATCH_S * 1000 - 2_000, seen
    assert seen["heard_ms"] > WATCH_S * 1000 - 2_000, seen


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
