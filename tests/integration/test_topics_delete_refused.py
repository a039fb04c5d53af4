"""``governor topics delete`` on a broker that refuses to delete topics: an ``error:`` naming
each topic it did not delete and the broker's reason, exit 2, at once. Before 7 Dec it ignored
the error codes of the broker's answer and waited 30 s for the topics to go, then said the
broker still listed them "after deleting them". A broker of the test's own, its topic deletion
turned off (``delete.topic.enable=false``)."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.bus import create_topics, topic_partitions
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports
from schemas.topics import TopicCatalog

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_topics_delete_says_which_topics_the_broker_refused_to_delete(tmp_path):
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                         home=tmp_path / "kafka", delete_topics=False),
                          progress=lambda _: None)
    bootstrap = kafka.start(timeout_s=120)
    catalog = TopicCatalog("kept")
    try:
        asyncio.run(create_topics(bootstrap, catalog))
        started = time.monotonic()
        deleting = subprocess.run(
            [sys.executable, "-m", "infra.cli", "topics", "delete", "requests", "kv",
             "--bootstrap", bootstrap, "--namespace", catalog.namespace],
            cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
        took_s = time.monotonic() - started
        left = asyncio.run(topic_partitions(bootstrap, catalog))
    finally:
        kafka.stop()
    output = " ".join((deleting.stdout + deleting.stderr).split())
    assert catalog.requests in left and catalog.kv in left  # (the broker kept them)
    assert deleting.returncode == 2, output
    assert "Traceback" not in output and "deleted" not in output.replace("not deleted", ""), output
    assert (f"error: the broker at {bootstrap} did not delete kept.requests, kept.kv: "
            "TOPIC_DELETION_DISABLED (the broker's delete.topic.enable is false)") in output, output
    assert took_s < 25, took_s  # (not the 30 s wait for topics that were never to go)
