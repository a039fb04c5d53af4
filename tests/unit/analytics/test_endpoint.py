"""The SQL endpoint over real HTTP on 127.0.0.1 and a real embedded store: reads only."""

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from analytics.endpoint import ENDPOINT_FILE, SqlEndpoint
from analytics.query import EndpointSource, QueryError, open_source


def _post(url: str, body: bytes, content_type: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/query", data=body,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _scenario(location, tmp_path):
    ready = {"ready": False}
    endpoint = SqlEndpoint(location, health=lambda: dict(ready, records=7), port=0)
    url = await endpoint.start()
    endpoint.write_discovery_file(tmp_path)
    try:
        before = await asyncio.to_thread(
            _post, url, json.dumps({"sql": "SELECT 1 AS one"}).encode(), "application/json")
        ready["ready"] = True
        source = EndpointSource(url)
        results = {
            "health": await asyncio.to_thread(source.health),
            "query": await asyncio.to_thread(source.query, "SELECT {n:UInt8} + 1 AS two",
                                             {"n": 1}),
            "plain": await asyncio.to_thread(
                _post, url, json.dumps({"sql": "SELECT 1"}).encode(), "text/plain"),
            "garbage": await asyncio.to_thread(_post, url, b"{not json", "application/json"),
        }
        with pytest.raises(QueryError, match="only reads are allowed"):
            await asyncio.to_thread(source.query, "DROP TABLE request_events")
        with pytest.raises(QueryError, match="UNKNOWN_TABLE|Unknown table"):
            await asyncio.to_thread(source.query, "SELECT * FROM no_such_table")
        # governor sql / report on the directory find that sink, for its own namespace only
        found = await asyncio.to_thread(open_source, location.database, data_dir=tmp_path)
        assert isinstance(found, EndpointSource) and found.url == url
        with pytest.raises(QueryError, match="stores database 't_analytics', not namespace "
                                             "'other'"):
            await asyncio.to_thread(open_source, "other", data_dir=tmp_path)
        return url, before, results
    finally:
        await endpoint.stop()


def test_the_endpoint_answers_reads_and_refuses_the_rest(store, location, tmp_path):
    url, before, results = asyncio.run(_scenario(location, tmp_path))
    assert url.startswith("http://127.0.0.1:")
    assert json.loads((tmp_path / ENDPOINT_FILE).read_text())["url"] == url
    assert before == (503, {"error": "the sink is still opening the store"})
    assert results["health"] == {"database": location.database, "ready": True, "records": 7}
    assert (results["query"].columns, results["query"].rows) == (["two"], [[2]])
    assert results["plain"][0] == 415  # a web page cannot post here without a preflight
    assert results["garbage"][0] == 400 and "send JSON" in results["garbage"][1]["error"]
