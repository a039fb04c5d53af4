"""A topic whose log began again (deleted and created again, the broker's data wiped, a new
cluster under a kept data directory) has offsets below the store's marks: the sink stores its
records all the same (before, it skipped every one below the old marks, and the store still
counted as caught up)."""

import asyncio
import time

import pytest

from analytics.batch import OffsetRange
from analytics.journal import Flush, Journal
from analytics.progress import count_rows, end_offsets, wait_caught_up
from analytics.query import StoreSource
from analytics.sink import AnalyticsSink
from analytics.store import Store, StoreLocation
from analytics.synthetic import history, produce

pytestmark = pytest.mark.integration


async def _begun_again_scenario(bootstrap, catalog, location):
    store = Store.open(location)  # marks of 10 records on dispatch partitions 0-3: an older log
    Journal(store, "earlier-run").mark(Flush("earlier-run", 1, tuple(
        OffsetRange(catalog.dispatch, p, 0, 9) for p in range(4))))
    store.close()
    records, _ = history(catalog, 0, 8, int(time.time() * 1000))  # request i on partition i % 4
    await produce(bootstrap, [r for r in records if r.topic == catalog.dispatch])
    ends = await end_offsets(bootstrap, [catalog.dispatch])
    stop = asyncio.Event()
    sink = AnalyticsSink(bootstrap, catalog, location)
    running = asyncio.create_task(sink.run(stop))
    reader = None
    try:
        total = sum(spec.partitions for spec in catalog.topics().values())
        async with asyncio.timeout(60):
            while sink.stats.partitions < total:  # assigned and positioned
                await asyncio.sleep(0.05)  # polls the sink's progress until a deadline
        reader = StoreSource(Store.open(location, readonly=True))
        await wait_caught_up(bootstrap, catalog, reader, timeout_s=60)
        return ends, count_rows(reader)["dispatches"]
    finally:
        stop.set()
        await running
        if reader is not None:
            reader.close()


def test_a_partition_whose_log_began_again_has_its_records_stored(kafka_bootstrap, catalog,
                                                                   tmp_path):
    location = StoreLocation("t_begun_again", data_dir=tmp_path / "chdb")
    ends, stored = asyncio.run(_begun_again_scenario(kafka_bootstrap, catalog, location))
    assert {key: end for key, end in ends.items() if end} == {
        (catalog.dispatch, p): 2 for p in range(4)}  # below the store's marks
    assert stored == 8
