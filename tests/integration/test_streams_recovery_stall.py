"""A streams worker whose recovery of its tables is stuck shows it (log lines, gauges), then
logs an ERROR naming the changelog partition it waits on and exits non-zero, on the real broker.

Faust's recovery waits until each changelog partition it recovers is read to its highwater, the
partition's last offset. A changelog that ends in a transaction's commit marker never is: no
consumer is handed a marker. Before 7 Dec the worker sat "recovering" for ever, publishing
nothing: at its default log level only Faust's "No event received for active tp" warnings, no
gauge, no end."""

import asyncio
import re
import time
import urllib.request

import pytest
from aiokafka import AIOKafkaProducer

from infra.kafka import free_ports
from streams.worker import ensure_topics, settings_for
from streams_support import start_streams_worker, stop, the_one_error

pytestmark = pytest.mark.integration

STALL_S = 10


async def _end_in_a_commit_marker(bootstrap: str, topic: str) -> None:
    """One tombstone (harmless to any table) in a committed transaction: the partition's log is
    the tombstone at offset 0 and the commit marker at offset 1."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-writer")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, key=b'"stray"', value=None, partition=0)
    finally:
        await producer.stop()


def _gauges(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:  # not serving yet
        return {}
    return {name: float(value) for name, value in
            re.findall(r"^(governor_streams_recovery_\w+) (\S+)$", text, re.MULTILINE)}


def _wait_for_recovery_gauges(port: int, worker, timeout_s: float) -> dict[str, float]:
    """The recovery gauges once they show a recovery with one record left."""
    deadline = time.monotonic() + timeout_s
    while (seen := _gauges(port)).get("governor_streams_recovery_records_remaining") != 1:
        assert worker.poll() is None, f"the worker exited before its gauges showed {seen}"
        assert time.monotonic() < deadline, f"no recovery with a record left in {seen}"
        time.sleep(0.2)  # the next scrape
    return seen


def test_a_stuck_recovery_is_shown_then_ends_the_worker(kafka_bootstrap, catalog, tmp_path):
    asyncio.run(ensure_topics(settings_for(catalog.namespace, kafka_bootstrap)))
    changelog = f"{catalog.namespace}.streams-windows-changelog"
    asyncio.run(_end_in_a_commit_marker(kafka_bootstrap, changelog))
    port = free_ports(1)[0]
    log = tmp_path / "worker.log"
    worker = start_streams_worker(kafka_bootstrap, catalog.namespace, log, "--metrics-port",
                                  str(port), "--recovery-stall-s", str(STALL_S))
    try:
        gauges = _wait_for_recovery_gauges(port, worker, 90)
        status = worker.wait(timeout=90)
    finally:
        stop(worker)
    text = log.read_text()
    assert gauges["governor_streams_recovery_seconds"] >= 0
    assert status != 0, text[-3000:]
    waited_on = f"waiting on {changelog}[0] 1 left"
    assert re.search(r"\[INFO\] recovering the tables for \d+ s: \d of \d records read; "
                     f"{re.escape(waited_on)}", text), text[-3000:]
    assert the_one_error(text).endswith(
        f"the tables' recovery read nothing for {STALL_S} s (the bound, recovery_stall_s, is "
        f"{STALL_S} s): {waited_on} "), text[-3000:]
