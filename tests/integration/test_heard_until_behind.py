"""Until when a reader of the telemetry topic has heard its workers (``infra.bus.HeardUntil``),
on a real broker, as the router's follower reads it: a reader that takes a fetch late, or whose
consumer fetches a partition no more for a while, has not read what its workers sent since, and
judges none of them silent for it."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from controllers.router.fleet import FleetView
from infra.bus import HeardUntil, make_producer, now_ms, partitions
from schemas.codec import decode, encode
from schemas.events import WorkerStatus

TIMEOUT_MS = 3_000


def heartbeat(at_ms: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=at_ms, worker_id="w0", slot=0, pool="h100@m",
                        gpu_type="h100", models_loaded=["m"], started_ms=at_ms - 1)


async def until(condition, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)  # (polling the consumer's state: a condition)


async def a_reader_behind(bootstrap: str, catalog, *, paused: bool) -> tuple[bool, int, int]:
    """A worker's heartbeat fetched, its next one sent and not fetched, and the reader taking
    what it fetched a heartbeat timeout later: is the worker silent to it then, until when has
    it heard, when was the first heartbeat sent. ``paused``: the reader took the first at once
    and then paused the partition (as a consumer whose fetches fail); else it took it only
    then, from the records its consumer held meanwhile (and, holding them, fetched that
    partition no more)."""
    parts = partitions(catalog, [catalog.telemetry])
    follower = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=100)  # (as the router's)
    producer = make_producer(bootstrap)
    await follower.start()
    await producer.start()
    try:
        follower.assign(parts)
        await follower.seek_to_end(*parts)
        for tp in parts:
            await follower.position(tp)
        heard = HeardUntil(parts, since_ms=now_ms())
        fleet = FleetView(heartbeat_timeout_ms=TIMEOUT_MS)

        async def take(records) -> int:
            for record in records:
                fleet.observe(decode(catalog.spec(catalog.telemetry), record.value))
            fleet.heard_until_ms = await heard.update(follower, records)
            return fleet.heard_until_ms

        first = heartbeat(now_ms())
        sent = await (await producer.send(catalog.telemetry, encode(first), key=b"w0"))
        tp = next(p for p in parts if p.partition == sent.partition)
        await until(lambda: follower.highwater(tp) == sent.offset + 1)  # fetched, held
        if paused:
            await take((await follower.getmany(tp, timeout_ms=5_000))[tp])
            follower.pause(tp)
            other = next(p for p in parts if p != tp)
            for _ in range(2):  # answered fetches sent after the pause: without the partition
                polled = follower.last_poll_timestamp(other)
                await until(lambda: follower.last_poll_timestamp(other) != polled)
        second_ms = max(now_ms(), first.event_time_ms + 1)
        later = await (await producer.send(catalog.telemetry, encode(heartbeat(second_ms)),
                                           key=b"w0"))
        assert later.partition == tp.partition
        # the reader, busy, takes what its consumer fetched only past the heartbeat timeout
        await until(lambda: now_ms() > first.event_time_ms + TIMEOUT_MS + 500)
        records = [] if paused else (await follower.getmany(tp, timeout_ms=5_000))[tp]
        assert [r.offset for r in records] == ([] if paused else [sent.offset])
        heard_until = await take(records)
        silent = "w0" in fleet.silent(now_ms())
        # read on: the next heartbeat read, the reader hears past it (held back for no longer)
        follower.resume(tp)
        async with asyncio.timeout(30):
            while await take((await follower.getmany(timeout_ms=200)).get(tp, [])) \
                    <= second_ms or fleet.get("w0").last_seen_ms != second_ms:
                pass
        return silent, heard_until, first.event_time_ms
    finally:
        await producer.stop()
        await follower.stop()


@pytest.mark.parametrize("paused", [False, True], ids=["taken-late", "paused"])
def test_a_reader_judges_no_worker_silent_for_heartbeats_it_has_not_fetched(
        kafka_bootstrap, catalog, paused):
    silent, heard_until, sent_ms = asyncio.run(a_reader_behind(kafka_bootstrap, catalog,
                                                               paused=paused))
    assert not silent
    assert heard_until < sent_ms + TIMEOUT_MS


def test_partitions_whose_records_retention_deleted_hold_a_starting_router_back_not_at_all(
        kafka_bootstrap, catalog):
    """Every telemetry partition starts past offset 0 (its records deleted, as retention does)
    and holds none: a router reading back from there hears up to its fetches, and a worker that
    heart-beats then is live to it."""
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    from controllers.router.service import RouterService

    async def scenario() -> tuple[int, int, bool]:
        parts = partitions(catalog, [catalog.telemetry])
        producer = make_producer(kafka_bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        await admin.start()
        stop, running = asyncio.Event(), None
        try:
            for tp in parts:
                await (await producer.send(catalog.telemetry, encode(heartbeat(now_ms())),
                                           key=b"old", partition=tp.partition))
            starts = await admin.delete_records({tp: RecordsToDelete(1) for tp in parts})
            assert set(starts.values()) == {1}
            router = RouterService(kafka_bootstrap, catalog, recovery_window_s=600)
            started = now_ms()
            running = asyncio.create_task(router.run(stop))
            fleet = router.core.fleet
            async with asyncio.timeout(60):
                while (fleet.heard_until_ms or 0) <= started:
                    assert not running.done(), running.exception()
                    await asyncio.sleep(0.05)  # (polling the router's state: a condition)
                sent = heartbeat(now_ms())
                await (await producer.send(catalog.telemetry, encode(sent), key=b"w0"))
                while fleet.get("w0") is None or fleet.heard_until_ms < sent.event_time_ms:
                    assert not running.done(), running.exception()
                    await asyncio.sleep(0.05)
            live = [w.worker_id for w in fleet.live(now_ms())]
            return started, fleet.heard_until_ms, live == ["w0"]
        finally:
            stop.set()
            if running is not None:
                await running
            await admin.close()
            await producer.stop()

    started, heard_until, live = asyncio.run(scenario())
    assert heard_until > started and live
