"""``governor sql`` and ``governor report`` against a sink that is still opening its store: a
sink announces its endpoint seconds before its store is open (3 s on the 2-core machine, on a
new data directory), and a query sent then failed, `the sink is still opening the store`."""

import asyncio
import itertools

import pytest

from analytics.endpoint import SqlEndpoint
from analytics.query import QueryError, open_source


async def _query_while_it_opens(location, data_dir, **where) -> tuple[list, list]:
    """Query a sink whose store is open from the third health check on: the one that finds
    the sink, then the wait's polls."""
    checks = itertools.count(1)
    endpoint = SqlEndpoint(location, health=lambda: {"ready": next(checks) >= 3}, port=0)
    url = await endpoint.start()
    endpoint.write_discovery_file(data_dir)
    waits = []
    try:
        source = await asyncio.to_thread(
            open_source, location.database, data_dir=data_dir,
            endpoint=url if where.get("endpoint") else None,
            waiting=lambda *said: waits.append(said))
        result = await asyncio.to_thread(source.query, "SELECT 1 AS one")
        return [(said[0] == url, said[1]) for said in waits], result.rows
    finally:
        await endpoint.stop()


@pytest.mark.parametrize("where", [{}, {"endpoint": True}], ids=["data-dir", "endpoint"])
def test_a_query_waits_for_the_sink_to_open_its_store(store, location, tmp_path, where):
    waits, rows = asyncio.run(_query_while_it_opens(location, tmp_path, **where))
    assert waits == [(True, 60.0)]  # said once, with the bound
    assert rows == [[1]]


async def _never_opens(location, data_dir) -> None:
    endpoint = SqlEndpoint(location, health=lambda: {"ready": False, "last_error": "disk full"},
                           port=0)
    url = await endpoint.start()
    endpoint.write_discovery_file(data_dir)
    try:
        with pytest.raises(QueryError, match=rf"^the sink at {url} has not opened its store "
                                             r"within 0\.5 s \(disk full\): see its log$"):
            await asyncio.to_thread(open_source, location.database, data_dir=data_dir,
                                    opening_wait_s=0.5)
    finally:
        await endpoint.stop()


def test_a_sink_that_does_not_open_its_store_is_an_error_naming_it(store, location, tmp_path):
    asyncio.run(_never_opens(location, tmp_path))
