"""``governor sink --clickhouse-url`` to a server that takes the connection and says nothing
(hung, or not ClickHouse) waits for it as for one that refuses: it says each failed open within
``FIRST_ANSWER_S`` and tries again, and a stop signal stops it. Before 7 Dec the open waited
clickhouse_connect's 300 s read timeout, saying nothing, and the stop waited with it; so did
``governor sql``/``report`` before their error."""

import asyncio
import logging
import socket
import threading
import time

from analytics import store
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import Store, StoreError, StoreLocation
from schemas.topics import TopicCatalog


async def _until(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _silent_server() -> tuple[socket.socket, str]:
    """A server that takes connections (the kernel's backlog) and never answers; its URL."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    return silent, f"http://127.0.0.1:{silent.getsockname()[1]}"


def test_a_sink_on_a_server_that_does_not_answer_says_it_waits_and_stops_when_told(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(store, "FIRST_ANSWER_S", 1, raising=False)  # (new on 7 Dec)

    async def scenario(silent: socket.socket, url: str) -> None:
        sink = AnalyticsSink("127.0.0.1:1", TopicCatalog("silent"),
                             StoreLocation.for_namespace("silent", tmp_path, url),
                             SinkSettings(retry_initial_s=0.1))
        stop = asyncio.Event()
        running = asyncio.create_task(sink.run(stop))
        try:
            await _until(lambda: sink.stats.store_failures >= 2, timeout_s=20)
            stop.set()
            await asyncio.wait_for(running, timeout=10)
        finally:  # (a connect still waiting is reset: the loop's end waits for its thread)
            silent.close()
        assert not sink.ready.is_set() and "Read timed out" in sink.stats.last_error

    silent, url = _silent_server()
    with caplog.at_level(logging.WARNING, logger="analytics.sink"):
        asyncio.run(scenario(silent, url))
    said = [r.getMessage() for r in caplog.records if r.name == "analytics.sink"]
    assert said and all(f"waiting for ClickHouse at {url} (database silent): Read timed out"
                        in line and "; retrying in" in line for line in said)


def test_a_read_only_open_of_a_server_that_does_not_answer_fails_in_the_first_answers_time(
        monkeypatch):
    """``governor sql``/``report``'s open: their one error line comes within the bound."""
    monkeypatch.setattr(store, "FIRST_ANSWER_S", 1, raising=False)  # (new on 7 Dec)
    silent, url = _silent_server()
    failed: list[BaseException] = []

    def open_it() -> None:
        try:
            Store.open(StoreLocation("governor", url=url), readonly=True).close()
        except StoreError as exc:
            failed.append(exc)

    opening = threading.Thread(target=open_it, daemon=True)
    opening.start()
    opening.join(timeout=15)
    silent.close()  # (a connect still waiting is reset)
    assert not opening.is_alive(), "still waiting for the server's answer"
    (error,) = failed
    assert str(error).startswith(f"cannot open the analytics store at {url}")
    assert "Read timed out" in str(error)
