"""How long a burst of configuration records holds up a router's event loop.

    python -m benchmarks.router_config_stall [--tenants 100,300,1000]

A router applies each record of ``governor.config`` on its one event loop (``LiveConfig.apply``
and ``RouterCore.apply_config``: milliseconds each with many tenants configured,
``benchmarks.live_config_apply``), where it also admits and places requests and its Kafka
clients heartbeat. Two bursts of one record per tenant, each tenant's limit: read at start
(``read_to_end`` before the router takes requests, as from a topic holding them all) and then
written again while it runs (a restore, a script setting each tenant; ``_follow_config``), the
reader's consumer standing in for the broker's and handing up to ``FETCH_RECORDS`` a fetch, as
aiokafka does. Beside it a task asks to wake every millisecond: the most it woke late is the
longest the loop stood still, what a request or a heartbeat waited then. Prints that, the
burst's wall time and the most CPU time one record took, in milliseconds (the machine may be
shared: a loop may stand still longer than its own work, while another process runs).
"""

import argparse
import asyncio
import time

from aiokafka.structs import ConsumerRecord, TopicPartition

from controllers.router.service import RouterService
from infra.bus import FETCH_RECORDS, Decoded, read_to_end
from schemas.config import ConfigSet
from schemas.topics import TopicCatalog

T0 = 1_800_000_000_000
CATALOG = TopicCatalog("bench")


class NoOutbox:
    def emit(self, *_args, **_kwargs) -> None:
        pass

    async def flush(self) -> int:
        return 0


class Reader:
    """A config topic's reader: the records given, ``FETCH_RECORDS`` a fetch, then none."""

    def __init__(self, records: list[Decoded]) -> None:
        self.consumer, self.catalog = self, CATALOG
        self._records, self._read = records, 0
        self.first_offset = records[0].record.offset if records else 0

    async def fetch(self, timeout_ms: int = 200) -> list[Decoded]:
        if self._read == len(self._records):
            await asyncio.sleep(timeout_ms / 1000)
        batch = self._records[self._read:self._read + FETCH_RECORDS]
        self._read += len(batch)
        return batch

    async def end_offsets(self, parts):
        return {tp: self.first_offset + len(self._records) for tp in parts}

    async def position(self, _tp: TopicPartition) -> int:
        return self.first_offset + self._read

    def done(self) -> bool:
        return self._read == len(self._records)


def records(tenants: int, first_offset: int, rate: float) -> list[Decoded]:
    records = []
    for n in range(tenants):
        key, offset = f"tenants.t-{n}", first_offset + n
        value = {"requests_per_s": rate + n % 7, "tokens_per_s": 10_000.0, "priority": n % 10}
        message = ConfigSet(event_time_ms=T0 + offset, key=key, value=value)
        records.append(Decoded(ConsumerRecord(CATALOG.config, 0, offset, T0 + offset, 0,
                                              key.encode(), b"", None, 0, 0, []), message))
    return records


async def _worst_lateness(stop: asyncio.Event, worst: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        asked = loop.time()
        await asyncio.sleep(0.001)
        worst[0] = max(worst[0], loop.time() - asked - 0.001)


async def _stalls(burst) -> tuple[float, float, float]:
    """The most the loop stood still while ``burst`` ran, and its wall time, in seconds."""
    _Longest.cpu_s = 0.0
    stop, worst = asyncio.Event(), [0.0]
    ticker = asyncio.create_task(_worst_lateness(stop, worst))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await burst()
    took = time.perf_counter() - started
    stop.set()
    await ticker
    return worst[0], took, _Longest.cpu_s


class _Longest:
    """The most CPU time one record took."""

    cpu_s = 0.0

    @classmethod
    def timed(cls, handle):
        def timed_handle(item: Decoded) -> None:
            started = time.process_time()
            handle(item)
            cls.cpu_s = max(cls.cpu_s, time.process_time() - started)
        return timed_handle


async def measure(tenants: int) -> dict[str, tuple[float, float, float]]:
    router = RouterService("127.0.0.1:1", CATALOG)
    router.outbox = NoOutbox()
    router._configured = _Longest.timed(router._configured)
    start = Reader(records(tenants, 0, 10.0))
    results = {"start": await _stalls(
        lambda: read_to_end(start, CATALOG.config, router._configured))}
    assert len(router.core.config.tenants) == tenants

    live = Reader(records(tenants, tenants, 20.0))

    async def follow() -> None:
        follower = asyncio.create_task(router._follow_config(live))
        while not live.done() or router.live_config._read_to < 2 * tenants - 1:
            await asyncio.sleep(0.001)
        follower.cancel()
    results["live"] = await _stalls(follow)
    assert router.core.config.tenants["t-0"].requests_per_s == 20.0
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", default="100,300,1000")
    args = parser.parse_args()
    print("tenants | start: loop stood still, burst, one record's CPU (ms) | live: the same")
    for tenants in (int(t) for t in args.tenants.split(",")):
        results = asyncio.run(measure(tenants))
        print(f"{tenants:7,} | " + " | ".join(
            f"{worst * 1000:8.1f} {took * 1000:8.1f} {cpu * 1000:6.1f}" for worst, took, cpu in
            (results["start"], results["live"])))


if __name__ == "__main__":
    main()
