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
from schemas.events import Completed, Queued, WorkerStatus
from streams.stages import partition_of
from streams_support import (SignalsReader, group_members, produce, start_streams_worker, stop,
                             wait_for_members)

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


WORKERS = 16  # fleet-view keys: both streams workers own the telemetry partitions of some


def _heartbeats(t: int) -> list[WorkerStatus]:
    return [WorkerStatus(event_time_ms=t, worker_id=f"w-{i}", slot=i, pool="h100@m",
                         gpu_type="h100", models_loaded=["m"], state="warm", started_ms=0)
            for i in range(WORKERS)]


class FleetViews:
    """Every fleet-view snapshot published (scope ``fleet``, keyed by worker id), in order."""

    def __init__(self, bootstrap: str, catalog) -> None:
        self.reader = SignalsReader(bootstrap, catalog)
        self.published: list[tuple[str, int]] = []  # (worker id, last_seen_ms)

    async def __aenter__(self) -> "FleetViews":
        await self.reader.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.reader.__aexit__(*exc)

    def newest(self, worker: str) -> int | None:
        return next((seen for w, seen in reversed(self.published) if w == worker), None)

    async def wait_all_seen_at(self, t: int, procs, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        spec = self.reader.catalog.spec(self.reader.catalog.signals)
        while any(self.newest(f"w-{i}") != t for i in range(WORKERS)):
            assert all(p.poll() is None for p in procs), f"a streams worker exited ({what})"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for records in (await self.reader.consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    s = decode(spec, record.value)
                    if s.scope == "fleet" and s.key != "all":
                        self.published.append((s.key, int(s.values["last_seen_ms"])))


async def _pair_scenario(bootstrap, catalog, tmp_path) -> tuple[list, int]:
    """Two streams workers; one paused past its session timeout while the other takes its
    partitions and publishes newer heartbeats there, then resumed. Returns every fleet view
    published and how many of them came before the resume."""
    group = f"{catalog.namespace}.streams"
    workers = [start_streams_worker(bootstrap, catalog.namespace, tmp_path / f"worker-{n}.log",
                                    "--tick-s", "0.05") for n in range(2)]
    paused = workers[0]
    try:
        async with FleetViews(bootstrap, catalog) as views:
            await wait_for_members(bootstrap, group, 2, 120, workers)
            t0 = int(time.time() * 1000)
            await produce(bootstrap, catalog, _heartbeats(t0))
            await views.wait_all_seen_at(t0, workers, "the first heartbeats published")
            os.kill(paused.pid, signal.SIGSTOP)
            try:
                await wait_for_members(bootstrap, group, 1, 60, [])  # its session expired
                t1 = int(time.time() * 1000)
                await produce(bootstrap, catalog, _heartbeats(t1))
                await views.wait_all_seen_at(t1, [], "the other worker publishing them all")
                before = len(views.published)
            finally:
                os.kill(paused.pid, signal.SIGCONT)
            await wait_for_members(bootstrap, group, 2, 120, workers)
            t2 = int(time.time() * 1000)
            await produce(bootstrap, catalog, _heartbeats(t2))
            await views.wait_all_seen_at(t2, workers, "both workers publishing again")
            return views.published, before
    finally:
        for worker in workers:
            stop(worker)


def test_a_resumed_streams_worker_publishes_nothing_of_the_partitions_it_lost(
        kafka_bootstrap, catalog, tmp_path):
    """Paused past its session timeout, a streams worker's partitions went to the other worker,
    which published newer heartbeats there. Resumed, before it learns so (its heartbeat is
    refused, it rejoins), the paused worker published its older fleet view of them: a
    worker's ``last_seen_ms`` went back, then forward again."""
    published, before = asyncio.run(_pair_scenario(kafka_bootstrap, catalog, tmp_path))
    newest: dict[str, int] = {}
    back = []
    for i, (worker, seen) in enumerate(published):
        if seen < newest.get(worker, 0):
            back.append((i - before, worker, newest[worker], seen))
        newest[worker] = max(newest.get(worker, 0), seen)
    assert back == [], f"{len(back)} fleet views went back, the first: {back[:3]}"
