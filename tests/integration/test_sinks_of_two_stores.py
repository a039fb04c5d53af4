"""Two sinks of one namespace on two stores (a ``governor sink --data-dir other`` beside
``governor up``'s, as the README advises) each store every record: their consumer groups are
their stores'. Before 6 Dec both joined ``<namespace>.analytics``, which split the partitions
between them, so each store held about half of what was produced while both ran (12 requests
replayed beside a running stack: 6 in each store), and ``governor report`` answered from half.
Sinks of one store still share a group (``test_analytics_sink``: two sinks on one store)."""

import asyncio
import signal
import time
from pathlib import Path

import pytest

from analytics.progress import count_rows, wait_caught_up, wait_for_endpoint
from analytics.schema import RECORD_TABLES
from analytics.sink import analytics_group
from analytics.store import StoreLocation
from analytics.synthetic import history, produce
from tests.integration.test_analytics_sink import _start_sink

pytestmark = pytest.mark.integration


async def _scenario(bootstrap, catalog, tmp_path):
    """Two ``governor sink`` processes (one chdb path per process) on two data directories."""
    dirs = [tmp_path / name for name in "ab"]
    sinks = [_start_sink(bootstrap, catalog, d, tmp_path / f"sink-{d.name}.log") for d in dirs]
    total = sum(catalog.spec(topic).partitions for topic in catalog.topics())
    try:
        endpoints = [await wait_for_endpoint(d, 60, lambda p=p: p.poll() is None)
                     for d, p in zip(dirs, sinks, strict=True)]
        async with asyncio.timeout(60):
            # both in their groups with partitions, their assignments settled (in one group,
            # they split them: about half each)
            while True:
                shares = [e.health()["partitions"] for e in endpoints]
                if all(shares) and sum(shares) in (total, 2 * total):
                    break
                await asyncio.sleep(0.1)  # polls the sinks' assignments
        records, produced = history(catalog, 0, 600, int(time.time() * 1000))
        await produce(bootstrap, records)
        counts = []
        for endpoint in endpoints:
            try:
                await wait_caught_up(bootstrap, catalog, endpoint, timeout_s=20)
            except TimeoutError:
                pass  # (counted below: what it holds says what it lacks)
            counts.append(count_rows(endpoint))
        return counts, produced
    finally:
        for sink in sinks:
            if sink.poll() is None:
                sink.send_signal(signal.SIGTERM)
                sink.wait(timeout=30)


def test_two_sinks_of_two_stores_each_store_every_record(kafka_bootstrap, catalog, tmp_path):
    counts, produced = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    want = {table: produced.get(table, 0) for table in RECORD_TABLES}
    assert counts == [want, want]


def test_the_group_is_the_stores():
    here = StoreLocation("governor", data_dir=Path("x/chdb"))
    assert analytics_group("governor", here) == analytics_group(
        "governor", StoreLocation("governor", data_dir=here.data_dir.resolve()))
    assert analytics_group("governor", here) != analytics_group(
        "governor", StoreLocation("governor", data_dir=Path("y/chdb")))
    server = StoreLocation("governor", url="http://u:secret@ch:8123")
    assert analytics_group("governor", server) == analytics_group(
        "governor", StoreLocation("governor", url="http://u:rotated@ch:8123"))
    assert analytics_group("governor", server) != analytics_group(
        "governor", StoreLocation("other", url="http://u:secret@ch:8123"))
    assert analytics_group("governor", server).startswith("governor.analytics.")


def test_one_server_spelt_two_ways_is_one_store():
    """The client asks ``http://ch`` on its default port (8123; https: 8443) and ignores the
    URL's path (the database is given apart): the same server, so the same group. Spelt
    ``http://ch``, ``http://ch:8123`` and ``http://ch:8123/`` they were three groups, whose sinks
    each read every record and wrote it to the one store."""
    def group(url: str) -> str:
        return analytics_group("governor", StoreLocation("governor", url=url))

    assert group("http://ch") == group("http://ch:8123") == group("http://ch:8123/")
    assert group("https://ch") == group("https://ch:8443")
    assert group("http://ch:8124") != group("http://ch")
