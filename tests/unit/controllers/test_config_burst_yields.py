"""A burst of configuration records (a restore, a script setting each tenant) holds up the other
tasks of a router's event loop (admission, placement, heartbeats) for one record at a time, not
for a fetch of up to 500 of them: milliseconds each with many tenants configured, seconds all
together (``python -m benchmarks.router_config_stall``)."""

import asyncio

from benchmarks.router_config_stall import CATALOG, NoOutbox, Reader, records
from controllers.router.service import RouterService
from infra.bus import read_to_end


def _seen_between(reading) -> list[int]:
    """How far (the offset of the last record applied) a router's configuration had been read
    each time another task ran while ``reading(router, reader)`` read three records."""
    async def scenario():
        router = RouterService("127.0.0.1:1", CATALOG)
        router.outbox = NoOutbox()
        seen: list[int] = []

        async def watch() -> None:
            while not seen or seen[-1] < 2:
                seen.append(router.live_config._read_to)
                await asyncio.sleep(0)
        watcher = asyncio.create_task(watch())
        reader = asyncio.create_task(reading(router, Reader(records(3, 0, 10.0))))
        await watcher
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        assert router.core.config.tenants["t-2"].requests_per_s == 12.0
        return seen
    return asyncio.run(scenario())


def test_the_router_s_config_follower_lets_other_tasks_run_between_two_records():
    seen = _seen_between(lambda router, reader: router._follow_config(reader))
    assert {0, 1} <= set(seen), seen


def test_the_configuration_read_at_start_lets_other_tasks_run_between_two_records():
    seen = _seen_between(lambda router, reader: read_to_end(reader, CATALOG.config,
                                                            router._configured))
    assert {0, 1} <= set(seen), seen
