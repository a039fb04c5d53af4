"""Helper of the analytics integration tests: a sink run in the test's own process."""

import asyncio
from contextlib import asynccontextmanager

from analytics.progress import wait_caught_up
from analytics.query import StoreSource
from analytics.sink import AnalyticsSink
from analytics.store import Store, StoreLocation
from schemas.topics import TopicCatalog


@asynccontextmanager
async def caught_up_sink(bootstrap: str, catalog: TopicCatalog, location: StoreLocation,
                         timeout_s: float = 60.0):
    """A sink on ``location``, once it has opened its store and taken in everything on the
    topics: yields (the sink, a read-only source over its store, the end offsets it reached).
    The sink stops and the source closes on exit."""
    stop = asyncio.Event()
    sink = AnalyticsSink(bootstrap, catalog, location)
    running = asyncio.create_task(sink.run(stop))
    reader = None
    try:
        async with asyncio.timeout(timeout_s):
            await sink.ready.wait()
        reader = StoreSource(Store.open(location, readonly=True))
        ends = await wait_caught_up(bootstrap, catalog, reader, timeout_s=timeout_s)
        yield sink, reader, ends
    finally:
        stop.set()
        await running
        if reader is not None:
            reader.close()
