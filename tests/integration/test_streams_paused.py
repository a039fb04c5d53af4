"""A streams worker paused (SIGSTOP) past its session timeout and resumed never publishes a running
total below one it published before, on the real broker.

Resumed, the worker rejoins its group and is given its partitions again; Faust then reads each
table's changelog again from where its last recovery ended, over the state it holds, so for a
while the tables hold older values of the keys written since. The publishing timer read them
then: the fleet's running total went back, and forward again once the recovery ended."""

import asyncio
import os
import signal
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.codec import decode
from schemas.events import Completed, Queued
from streams.stages import partition_of
from streams_support import group_members, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration

ROUNDS, PER_ROUND, TENANTS = 12, 400, 300


def _requests(first: int, count: int, t0: int) -> list:
    """``count`` requests from number ``first`` on, each queued and completed, over many tenants
    (each its own running total, so many changelog records for a recovery to read)."""
    out = []
    for i in range(first, first + count):
        common = dict(request_id=f"r{i}", tenant=f"t{i % TENANTS}", created_ms=t0 + i)
        out += [Queued(event_time_ms=t0 + i, prompt_tokens=10, max_tokens=5, **common),
                Completed(event_time_ms=t0 + i + 50, worker_id="w-1", prompt_tokens=10,
                          output_tokens=5, e2e_s=0.05, **common)]
    return out


class FleetTotals:
    """Every running total of ``fleet:all`` published, in order (its key has one partition)."""

    def __init__(self, bootstrap: str, catalog) -> None:
        self.bootstrap, self.catalog = bootstrap, catalog
        self.published: list[tuple[int, float]] = []  # (event_time_ms, events)

    async def __aenter__(self) -> "FleetTotals":
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await self.consumer.start()
        topic = self.catalog.signals
        tp = TopicPartition(topic, partition_of("fleet:all",
                                                self.catalog.spec(topic).partitions))
        self.consumer.assign([tp])
        self.consumer.seek(tp, 0)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.consumer.stop()

    async def poll(self) -> None:
        spec = self.catalog.spec(self.catalog.signals)
        for records in (await self.consumer.getmany(timeout_ms=200)).values():
            for record in records:
                s = decode(spec, record.value)
                if (s.scope, s.key) == ("fleet", "all") and s.window_s not in (10.0, 60.0):
                    self.published.append((s.event_time_ms, s.values["events"]))

    async def wait_until(self, condition, timeout_s: float, what: str, worker) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert worker.poll() is None, f"the streams worker exited ({what})"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await self.poll()

    def newest(self) -> float:
        return self.published[-1][1] if self.published else 0.0


async def _scenario(bootstrap, catalog, tmp_path) -> list[tuple[int, float]]:
    group = f"{catalog.namespace}.streams"
    t0 = int(time.time() * 1000) - 60_000
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "worker.log",
                                  "--tick-s", "0.05")
    try:
        async with FleetTotals(bootstrap, catalog) as totals:
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            for r in range(ROUNDS):  # one round a batch at least: a fleet total written each
                await produce(bootstrap, catalog, _requests(r * PER_ROUND, PER_ROUND, t0))
                await totals.wait_until(lambda r=r: totals.newest() == 2 * PER_ROUND * (r + 1),
                                        120, f"round {r}'s events counted", worker)
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 60
                while await group_members(bootstrap, group) != 0:  # its session expired
                    assert time.monotonic() < deadline, "the paused worker stayed in its group"
                    await asyncio.sleep(0.5)  # polling the broker's group state
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            # the agents read again once the recovery has ended: one more round counted
            await produce(bootstrap, catalog, _requests(ROUNDS * PER_ROUND, PER_ROUND, t0))
            await totals.wait_until(lambda: totals.newest() == 2 * PER_ROUND * (ROUNDS + 1),
                                    120, "the round after the rejoin counted", worker)
            return totals.published
    finally:
        stop(worker)


def test_a_paused_and_resumed_streams_worker_never_publishes_a_total_going_back(
        kafka_bootstrap, catalog, tmp_path):
    published = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    events = [value for _t, value in published]
    back = [(i, events[i - 1], events[i]) for i in range(1, len(events))
            if events[i] < events[i - 1]]
    assert back == [], f"the fleet's running total went back: {back[:5]}"
    assert events[-1] == 2 * (ROUNDS + 1) * PER_ROUND
