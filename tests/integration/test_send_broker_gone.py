"""A one-shot send of the command line (``governor command``, ``config set``, ``demo
--fault``) whose broker goes away after its producer started: an error within some 15 s saying
the broker did not acknowledge it. Before 7 Dec it waited for ever, its Ctrl-C too (aiokafka's
idempotent producer retries a batch for as long as its broker is away). A broker of the test's
own, stopped."""

import asyncio
import time

import pytest

from infra.bus import create_topics, make_producer
from infra.delivery import DELIVERY_S, STOP_S, NotAcknowledged, deliver
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports
from schemas.commands import DrainWorker, target
from schemas.topics import TopicCatalog

pytestmark = pytest.mark.integration


async def _sent_after_the_broker_stopped(kafka: EmbeddedKafka, bootstrap: str,
                                         catalog: TopicCatalog, command) -> tuple[str, float]:
    """What ``deliver`` raised, and after how long, the broker stopped once its producer knew
    the control topic's leader."""
    producer = make_producer(bootstrap)
    await producer.start()
    await producer.partitions_for(catalog.control)
    await asyncio.to_thread(kafka.stop)
    started = time.monotonic()
    try:
        async with asyncio.timeout(DELIVERY_S + STOP_S + 30):  # (for ever, before 7 Dec)
            await deliver(producer, bootstrap, [(catalog.control, command, target(command), None)],
                          f"the command {command.command_id}")
    except NotAcknowledged as exc:
        return str(exc), time.monotonic() - started
    return "", time.monotonic() - started


def test_a_send_whose_broker_went_away_ends_in_an_error_within_its_delivery_time(tmp_path):
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                         home=tmp_path / "kafka"), progress=lambda _: None)
    bootstrap = kafka.start(timeout_s=120)
    catalog = TopicCatalog("gone")
    command = DrainWorker(event_time_ms=1, command_id="drain-worker-0", issued_by="operator",
                          reason="", worker_id="worker-0")
    try:
        asyncio.run(create_topics(bootstrap, catalog))
        said, took_s = asyncio.run(_sent_after_the_broker_stopped(kafka, bootstrap, catalog,
                                                                  command))
    finally:
        kafka.stop()
    assert said == (f"the broker at {bootstrap} did not acknowledge the command drain-worker-0 "
                    f"(none within 15 s): it may be on gone.control or not")
    assert took_s < DELIVERY_S + STOP_S + 5, took_s
