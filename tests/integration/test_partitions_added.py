"""A partition added to the telemetry topic while a router or the controllers run
(``infra.bus.take_on_added``), on a real broker: a worker whose heartbeats go there from then on
is read there, and is never judged silent (its requests would be failed over)."""

import asyncio

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


async def a_worker_moved_to_an_added_partition(bootstrap: str, catalog, kind: str) -> dict:
    count = catalog.spec(catalog.telemetry).partitions
    worker = next(w for w in (f"w{i}" for i in range(1_000)) if hashed(w, count + 1) == count)
    running, fleet = service(kind, bootstrap, catalog)
    producer = make_producer(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await producer.start()
    await admin.start()
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    partition = hashed(worker, count)  # its key's partition before one is added
    beats = asyncio.Event()

    async def beating() -> None:
        while True:
            await producer.send_and_wait(catalog.telemetry, encode(heartbeat(worker, now_ms())),
                                         key=worker.encode(), partition=partition)
            beats.set()
            await asyncio.sleep(BEAT_S)  # (a worker's heartbeat interval: the load, no wait)

    async def watch(condition, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                assert not task.done(), task.exception()
                await asyncio.sleep(0.02)  # (polling the service's view: a condition)

    beater = None
    try:
        started = now_ms()
        await watch(lambda: (fleet.heard_until_ms or 0) > started, 60)
        beater = asyncio.create_task(beating())
        await watch(lambda: fleet.get(worker) is not None, 10)
        await admin.create_partitions({catalog.telemetry: NewPartitions(total_count=count + 1)})
        while count not in (producer.client.cluster.partitions_for_topic(catalog.telemetry)
                            or ()):  # (the worker's producer learns of it)
            await producer.client.force_metadata_update()
        moved_ms = now_ms()
        partition = count  # its key's partition from now on (as its producer learns of it)
        silent, read_ms = [], None
        while now_ms() < moved_ms + WATCH_S * 1000:
            assert not task.done(), task.exception()
            assert not beater.done(), beater.exception()
            now = now_ms()
            if worker in fleet.silent(now):
                silent.append(now - moved_ms)
            if read_ms is None and fleet.get(worker).last_seen_ms >= moved_ms:
                read_ms = now - moved_ms
            await asyncio.sleep(0.02)  # (sampling the view as it runs)
        return dict(silent=silent, read_ms=read_ms, heard_ms=fleet.heard_until_ms - moved_ms,
                    last_seen_ms=fleet.get(worker).last_seen_ms - moved_ms)
    finally:
        if beater is not None:
            beater.cancel()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await admin.close()
        await producer.stop()


@pytest.mark.parametrize("kind", ["router", "controllers"])
def test_a_worker_heart_beating_on_a_partition_added_meanwhile_is_read_and_never_silent(
        kafka_bootstrap, catalog, kind):
    seen = asyncio.run(a_worker_moved_to_an_added_partition(kafka_bootstrap, catalog, kind))
    assert seen["silent"] == []
    # its heartbeats there are read within a heartbeat timeout, and go on being read
    assert seen["read_ms"] is not None and seen["read_ms"] < TIMEOUT_MS, seen
    assert seen["last_seen_ms"] > WATCH_S * 1000 - 2_000, seen
    assert seen["heard_ms"] > WATCH_S * 1000 - 2_000, seen
