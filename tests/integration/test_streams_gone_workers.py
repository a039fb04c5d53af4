"""A worker silent past the worker table's retention is deleted on the real broker, and the
deletion reaches the table's changelog: a Faust worker restarted (after a SIGKILL) recovers the
table without it.

Before 6 Dec the table kept every worker it had heard from: a deployment whose worker ids change
at each restart grew it, its changelog and every tick's pass over it for good. A deletion that did
not reach the changelog would bring the entry back at the next restart: the probe below, a
heartbeat of the deleted worker one second after its last, would then be provisioned that second
(the restored entry's interval), where a deleted worker's next heartbeat is a first one."""

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.events import WorkerStatus
from streams.signals.workers import RETENTION_S
from streams.stages import partition_of
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration


def _hb(worker: str, t: int, state: str = "warm") -> WorkerStatus:
    return WorkerStatus(event_time_ms=t, worker_id=worker, slot=0, pool="h100@m",
                        gpu_type="h100", models_loaded=["m"], state=state, started_ms=0)


def _pair(partitions: int) -> tuple[str, str]:
    """A gone worker and a live one whose heartbeats share a telemetry partition (the gone
    one's is swept at the live one's event time)."""
    gone = "gone-0"
    live = next(f"live-{i}" for i in range(1000)
                if partition_of(f"live-{i}", partitions) == partition_of(gone, partitions))
    return gone, live


async def _changelog(bootstrap: str, topic: str, partitions: int) -> dict[bytes, bytes | None]:
    """The last value of each key on ``topic`` (None: a tombstone)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends = await consumer.end_offsets(tps)
        last: dict[bytes, bytes | None] = {}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    last[record.key] = record.value
        return last
    finally:
        await consumer.stop()


async def _scenario(bootstrap, catalog, tmp_path) -> tuple[dict, float]:
    partitions = catalog.spec(catalog.telemetry).partitions
    gone, live = _pair(partitions)
    now = int(time.time() * 1000)
    old = now - int(RETENTION_S * 1000) - 600_000  # its last heartbeat: past the retention
    live_t = now - 20_000
    changelog_topic = f"{catalog.namespace}.streams-workers-changelog"
    group = f"{catalog.namespace}.streams"
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "first.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            await produce(bootstrap, catalog, [_hb(gone, old - 5_000 + i * 1000)
                                               for i in range(6)])
            await signals.wait_until(
                lambda: signals.total("fleet:all").get("provisioned_s") == 5.0, 60,
                "the gone worker's heartbeats", [worker], lambda: signals.total("fleet:all"))
            await produce(bootstrap, catalog, [_hb(live, live_t + i * 1000) for i in range(5)])
            # more than an hour after the gone worker's last: fleet:all's total restarts
            await signals.wait_until(
                lambda: signals.total("fleet:all").get("provisioned_s") == 4.0, 60,
                "the live worker's heartbeats", [worker], lambda: signals.total("fleet:all"))
            key = f'"{gone}"'.encode()
            deadline = time.monotonic() + 60
            while (last := await _changelog(bootstrap, changelog_topic, partitions)).get(
                    key, b"") is not None:
                assert time.monotonic() < deadline, f"no tombstone for {gone}: {last.get(key)}"
            assert last[f'"{live}"'.encode()] is not None
            worker.kill()  # SIGKILL: the next worker recovers the table from its changelog
            worker.wait()
            worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "second.log")
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            # the probe, then a live heartbeat 2 s after its last behind it in the same
            # partition: the total goes from 4 to 6 s, where a restored entry of the gone
            # worker would count the probe's second, 5 s, then 7 (whichever is published)
            await produce(bootstrap, catalog, [_hb(gone, old + 1_000, "stopped"),
                                               _hb(live, live_t + 6_000)])
            await signals.wait_until(
                lambda: signals.total("fleet:all").get("provisioned_s", 0) >= 6.0, 90,
                "the probe and the live heartbeat after the restart", [worker],
                lambda: signals.total("fleet:all"))
            return last, signals.total("fleet:all")["provisioned_s"]
    finally:
        stop(worker)


def test_a_worker_gone_past_the_retention_is_deleted_through_the_changelog(
        kafka_bootstrap, catalog, tmp_path):
    _last, provisioned = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    # 4 s of the live worker before the restart (fleet:all's total restarted at its first
    # heartbeat), 2 after: none for the probe, the first heartbeat of an entry of its own
    assert provisioned == 6.0
