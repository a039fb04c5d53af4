"""A streams worker and a source topic (telemetry, requests) of more partitions than the streams'
(``streams.sources``), on the real broker.

The streams read the sources co-partitioned with their repartition topics and changelogs, of the
catalog's count. Before 7 Dec a worker started on a source of one partition more ran, warning,
until a record came on that partition, and then crashed (``AssertionError: Unrecognized
partition``, as it wrote its state to a changelog partition that does not exist), again at each
restart; one running when a partition was added read nothing of it, said nothing, and crashed
so at Faust's next metadata refresh (5 minutes; 7.6 s after the addition with a 5 s refresh).
Now the worker refuses to start, and one running says it within the producer's metadata
refresh (10 s), serves it as a gauge, and reads on the partitions it has."""

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from infra.bus import PRODUCER_METADATA_MS, make_again, make_producer, now_ms
from infra.kafka import free_ports
from schemas.codec import encode
from schemas.events import WorkerStatus
from streams_support import SignalsReader, start_streams_worker, stop

pytestmark = pytest.mark.integration

QUICK_METADATA = (str(Path(__file__).with_name("quick_metadata_streams_worker.py")),)
BEAT_S = 0.5  # a worker's heartbeat interval
SAID_WITHIN_S = PRODUCER_METADATA_MS / 1000 + 5  # the refresh, and a loaded machine's slack


async def _add_partition(bootstrap: str, topic: str, count: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=count + 1)})
    finally:
        await admin.close()


def _heartbeat(worker: str) -> bytes:
    at = now_ms()
    return encode(WorkerStatus(event_time_ms=at, worker_id=worker, slot=0, pool="h100@m",
                               gpu_type="h100", models_loaded=["m"], started_ms=at - 1))


@pytest.mark.parametrize("source", ["telemetry", "requests"])
def test_a_worker_refuses_to_start_on_a_source_of_more_partitions(kafka_bootstrap, catalog,
                                                                  tmp_path, source):
    topic = getattr(catalog, source)
    count = catalog.spec(topic).partitions
    asyncio.run(_add_partition(kafka_bootstrap, topic, count))
    log = tmp_path / "worker.log"
    worker = start_streams_worker(kafka_bootstrap, catalog.namespace, log)
    try:
        status = worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker runs on {topic} of {count + 1} partitions: "
                    f"{log.read_text()[-2000:]}")
    finally:
        stop(worker)
    text = log.read_text()
    assert status == 2, text[-2000:]
    assert text.splitlines()[-1] == (
        f"error: topic {topic} has {count + 1} partitions, not {count}: the streams read it "
        "co-partitioned with their repartition topics and tables' changelogs, of "
        f"{count} partitions each (the catalog's count), so the records of its partition "
        f"{count} are not read; make it again: "
        f"{make_again(catalog.namespace, [topic], kafka_bootstrap)}")  # (on the broker given)
    assert "warning:" not in text and "Worker" not in text  # one error, and Faust not started


def _unread_gauges(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {topic: float(value) for topic, value in re.findall(
        r'^governor_streams_unread_partitions\{topic="([^"]+)"\} (\S+)$', text, re.MULTILINE)}


def _rebalances(log: Path) -> int:
    """The assignments the worker has taken on (Faust logs each generation's)."""
    return len(re.findall(r"generation id \d+ app consumers id", log.read_text()))


async def _added_while_running(bootstrap: str, catalog, worker: subprocess.Popen, log: Path,
                               port: int) -> dict:
    """A worker heart-beating on partition 1 of the telemetry topic is published; a partition
    is added to the topic, another worker heart-beats there; until the streams worker has said
    it and its group has rebalanced (Faust's metadata refresh), and a heartbeat of the first
    sent after that is published."""
    telemetry = catalog.telemetry
    count = catalog.spec(telemetry).partitions
    producer = make_producer(bootstrap)
    await producer.start()

    def alive() -> None:
        assert worker.poll() is None, f"the streams worker exited: {log.read_text()[-3000:]}"

    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            deadline = time.monotonic() + 90
            while not signals.total("fleet:w-old"):
                alive()
                assert time.monotonic() < deadline, "w-old was never published"
                await producer.send_and_wait(telemetry, _heartbeat("w-old"), key=b"w-old",
                                             partition=1)
                await signals.poll()
            rebalanced = _rebalances(log)
            await _add_partition(bootstrap, telemetry, count)
            added = time.monotonic()
            while count not in (producer.client.cluster.partitions_for_topic(telemetry) or ()):
                await producer.client.force_metadata_update()
            said_s = sent_ms = None
            while sent_ms is None or signals.total("fleet:w-old")["last_seen_ms"] < sent_ms:
                alive()
                assert time.monotonic() - added < 60, (
                    f"said after {said_s} s, rebalanced {_rebalances(log) - rebalanced} times; "
                    f"{log.read_text()[-3000:]}")
                await producer.send_and_wait(telemetry, _heartbeat("w-new"), key=b"w-new",
                                             partition=count)
                beat_ms = now_ms()
                await producer.send_and_wait(telemetry, _heartbeat("w-old"), key=b"w-old",
                                             partition=1)
                if said_s is None and "[ERROR] topic " in log.read_text():
                    said_s = time.monotonic() - added
                if sent_ms is None and said_s is not None and _rebalances(log) > rebalanced:
                    sent_ms = beat_ms  # (its first heartbeat since both)
                poll_until = time.monotonic() + BEAT_S
                while time.monotonic() < poll_until:
                    await signals.poll()  # (a worker's heartbeat interval: the load)
            return dict(said_s=said_s, gauges=_unread_gauges(port),
                        new_published=bool(signals.total("fleet:w-new")))
    finally:
        await producer.stop()


def test_a_partition_added_to_a_source_while_the_worker_runs_is_said_and_left_unread(
        kafka_bootstrap, catalog, tmp_path):
    """With Faust's consumer asking for its topics' partitions every 2 s
    (``quick_metadata_streams_worker``), its group rebalances soon after the addition: the added
    partition is not assigned, and the worker reads on the others."""
    port = free_ports(1)[0]
    log = tmp_path / "worker.log"
    worker = start_streams_worker(kafka_bootstrap, catalog.namespace, log, "--metrics-port",
                                  str(port), launcher=QUICK_METADATA)
    try:
        seen = asyncio.run(_added_while_running(kafka_bootstrap, catalog, worker, log, port))
        alive_after = worker.poll() is None
    finally:
        stop(worker)
    text = log.read_text()
    print(f"said {seen['said_s']:.1f} s after the partition was added", file=sys.stderr)
    assert alive_after, text[-3000:]
    assert seen["said_s"] <= SAID_WITHIN_S, text[-3000:]
    count = catalog.spec(catalog.telemetry).partitions
    errors = [line for line in text.splitlines() if "[ERROR]" in line or "[CRITICAL]" in line]
    assert len(errors) == 1, errors  # said once
    assert errors[0].endswith(
        f"[ERROR] topic {catalog.telemetry} has {count + 1} partitions, not {count}: the streams "
        "read it co-partitioned with their repartition topics and tables' changelogs, of "
        f"{count} partitions each (the catalog's count), so the records of its partition "
        f"{count} are not read; make it again: "
        f"{make_again(catalog.namespace, [catalog.telemetry], kafka_bootstrap)}"
        "; the worker reads on the others meanwhile "), errors[0]  # (on the worker's broker)
    assert seen["gauges"] == {catalog.telemetry: 1.0, catalog.requests: 0.0}
    assert not seen["new_published"]  # its partition is not read
