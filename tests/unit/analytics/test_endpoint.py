"""The SQL endpoint over real HTTP on 127.0.0.1 and a real embedded store: reads only."""

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from analytics.endpoint import ENDPOINT_FILE, SqlEndpoint
from analytics.query import EndpointSource, QueryError, StoreSource, open_source


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
        with pytest.raises(QueryError, match="stores database 't_analytics', not the database "
                                             "of namespace 'other'"):
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


async def _over_the_limit_then_a_query(location) -> list[tuple[int, dict]]:
    endpoint = SqlEndpoint(location, health=lambda: {"ready": True}, port=0)
    url = await endpoint.start()
    try:
        answers = []
        for sql in ("SELECT number FROM system.numbers LIMIT 1000001",  # past max_result_rows
                    "SELECT 1 AS one"):
            answers.append(await asyncio.to_thread(
                _post, url, json.dumps({"sql": sql}).encode(), "application/json"))
        return answers
    finally:
        await endpoint.stop()


def test_a_query_after_one_cut_off_by_a_limit_is_answered(store, location):
    """A query the store cuts off (past the rows one may return) leaves the embedded client's
    connection unusable for the next one ("unrecognized data found in stream"): the endpoint
    opens it again, and the next caller gets its answer."""
    cut, after = asyncio.run(_over_the_limit_then_a_query(location))
    assert cut[0] == 400 and "TOO_MANY_ROWS" in cut[1]["error"], cut
    assert after == (200, after[1]) and after[1]["rows"] == [[1]], after
    assert store.query("SELECT 2").rows == [[2]]  # the sink's own connection is untouched


async def _through_the_endpoint(location, sql: str) -> tuple[int, dict]:
    endpoint = SqlEndpoint(location, health=lambda: {"ready": True}, port=0)
    url = await endpoint.start()
    try:
        return await asyncio.to_thread(_post, url, json.dumps({"sql": sql}).encode(),
                                       "application/json")
    finally:
        await endpoint.stop()


def test_addresses_and_times_of_day_are_answered_as_text(store, location):
    """The client gives IPv4, IPv6 and Time values as Python objects JSON has no form for:
    before 7 Dec the endpoint answered `500 Internal Server Error` (and `governor sql` said
    only `HTTP 500 Internal Server Error`), while the same query on the directory printed them."""
    status, answer = asyncio.run(_through_the_endpoint(
        location, "SELECT toIPv4('10.0.0.1') AS v4, [toIPv6('::1')] AS v6s, "
                  "toTime('12:34:56') AS t"))
    assert (status, answer["rows"]) == (200, [["10.0.0.1", ["::1"], "12:34:56"]]), answer


#: A time before year 1, which the client has no Python value for.
BEFORE_YEAR_ONE = "SELECT toDateTime64(-1, 3) - toIntervalYear(3000) AS t"


def test_a_value_the_client_cannot_read_is_a_clear_error(store, location):
    """Before 7 Dec the client's ValueError went past the store: `governor sql` on a directory
    printed a Python traceback, and the endpoint answered `500 Internal Server Error`."""
    with pytest.raises(QueryError, match="holds a value out of the range this client reads: "
                                         "day -719163 is outside the date range 0001-01-01"):
        StoreSource(store).query(BEFORE_YEAR_ONE)
    status, answer = asyncio.run(_through_the_endpoint(location, BEFORE_YEAR_ONE))
    assert status == 400 and "day -719163 is outside the date range" in answer["error"], answer


async def _a_query_behind_a_long_one(location) -> str:
    endpoint = SqlEndpoint(location, health=lambda: {"ready": True}, port=0)
    url = await endpoint.start()
    try:
        async with endpoint._lock:  # (a long query runs: one at a time)
            with pytest.raises(QueryError) as refused:
                await asyncio.to_thread(EndpointSource(url, timeout_s=0.5).query, "SELECT 1")
        return str(refused.value)
    finally:
        await endpoint.stop()


def test_a_query_queued_behind_a_long_one_past_the_clients_wait_says_the_endpoint_is_busy(
        store, location):
    """The endpoint runs one query at a time, each for up to 120 s: one queued behind a long
    one may wait past the client's 130 s. Before 7 Dec that read `no analytics SQL endpoint
    answers at URL`, as if no sink ran there."""
    said = asyncio.run(_a_query_behind_a_long_one(location))
    assert "gave no answer within 0.5 s" in said and "busy" in said, said
    assert "no analytics SQL endpoint answers" not in said


async def _asked_for_namespaces(location, asked: list[list[str]]) -> list[object]:
    """``governor sql --endpoint URL`` with each of ``asked``'s options, against a sink whose
    store is ``location``'s: the output, or the error."""
    from typer.testing import CliRunner

    import infra.cli as cli

    endpoint = SqlEndpoint(location, health=lambda: {"ready": True}, port=0)
    url = await endpoint.start()
    try:
        said = []
        for options in asked:
            result = await asyncio.to_thread(
                CliRunner().invoke, cli.app, ["sql", "--endpoint", url, *options,
                                              "SELECT currentDatabase() AS db"],
                env={"GOVERNOR_NAMESPACE": None})
            said.append(result.exception or result.output)
        return [str(one).replace(url, "URL") for one in said]
    finally:
        await endpoint.stop()


def test_an_endpoint_of_another_namespace_than_the_one_given_is_an_error(store, location):
    """The sink behind ``--endpoint`` answers for its own namespace: before 7 Dec `governor sql`
    and `report` dropped a `--namespace` of another without a word, and answered with the
    other namespace's rows (the endpoint a `--data-dir` names was checked)."""
    said = asyncio.run(_asked_for_namespaces(location, [["--namespace", "t_analytics"],
                                                        [], ["--namespace", "other-ns"]]))
    assert said[0] == said[1] == "db\n-----------\nt_analytics\n(1 row)\n"
    assert said[2] == ("the sink at URL stores database 't_analytics', not the database of "
                       "namespace 'other-ns' ('other_ns'): give --namespace of that sink, or the "
                       "'other-ns' sink's --endpoint or --data-dir")
