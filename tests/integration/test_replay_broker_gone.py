"""``governor replay`` whose broker goes away partway: an ``error:`` that says how many requests
the broker took and which it did not, exit 2. Before 7 Dec it ended in a traceback
(``infra.bus.Undelivered``), exit 1, saying neither. A broker of the test's own, stopped."""

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.bus import create_topics
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.topics import TopicCatalog
from tests.integration.test_replay_closed_loop import records_on

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: a request every 0.1 s: 20 s of them, the broker stopped after the first 5
ROWS = 200


def test_replay_says_what_was_sent_when_its_broker_goes_away(tmp_path):
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                         home=tmp_path / "kafka"), progress=lambda _: None)
    bootstrap = kafka.start(timeout_s=120)
    catalog = TopicCatalog("gone")
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl([TraceRequest(i / 10, 64, 4) for i in range(ROWS)], trace)
    replay = None
    try:
        asyncio.run(create_topics(bootstrap, catalog))
        replay = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "replay", str(trace), "--bootstrap", bootstrap,
             "--namespace", catalog.namespace, "--run-id", "gone"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        asyncio.run(records_on(bootstrap, catalog.requests, 5))
        kafka.stop()
        output, _ = replay.communicate(timeout=90)
    finally:
        if replay is not None and replay.poll() is None:
            replay.kill()
        kafka.stop()
    assert "Traceback" not in output, output
    assert replay.returncode == 2, output
    said = re.search(r"error: replay stopped: the broker at (\S+) did not acknowledge (\d+) "
                     r"requests? \(gone-\d{6}.*?\): .+; (\d+) of the (\d+) requests were "
                     r"delivered to gone\.requests, (\d+) not sent", " ".join(output.split()))
    assert said, output
    unacknowledged, delivered, total, unsent = (int(n) for n in said.groups()[1:])
    assert said[1] == bootstrap and total == ROWS
    assert delivered >= 5 and unacknowledged >= 1 and unsent > 0
    assert delivered + unacknowledged + unsent == ROWS
