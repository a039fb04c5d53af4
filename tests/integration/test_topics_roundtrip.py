"""Every event and command type round-trips through its topic on the real broker."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import create_topics, make_producer, send
from schemas.codec import decode
from schemas.examples import examples
from schemas.topics import SPECS

pytestmark = pytest.mark.integration


async def _roundtrip(bootstrap, catalog):
    sent = []
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for spec in SPECS:
            topic = catalog.name(spec.suffix)
            for model in spec.models:
                message = examples()[model]
                await send(producer, topic, message, key=model.__name__)
                sent.append((topic, message))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(*catalog.topics(), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    received = []
    try:
        async with asyncio.timeout(30):
            while len(received) < len(sent):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    received += [(r.topic, decode(catalog.spec(r.topic), r.value)) for r in records]
    finally:
        await consumer.stop()
    return sent, received


def test_every_message_type_round_trips_through_its_topic(kafka_bootstrap, catalog):
    sent, received = asyncio.run(_roundtrip(kafka_bootstrap, catalog))
    key = lambda pair: (pair[0], pair[1].type)  # noqa: E731
    assert sorted(received, key=key) == sorted(sent, key=key)
    assert {type(m) for _, m in received} == set(examples())


def test_topics_create_is_idempotent_and_follows_the_catalog(kafka_bootstrap, catalog):
    from aiokafka.admin import AIOKafkaAdminClient

    again = asyncio.run(create_topics(kafka_bootstrap, catalog))
    assert again == []

    async def describe():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            return await admin.describe_topics(list(catalog.topics()))
        finally:
            await admin.close()

    described = {t["topic"]: len(t["partitions"]) for t in asyncio.run(describe())}
    assert described == {name: spec.partitions for name, spec in catalog.topics().items()}


def test_topics_create_says_which_configs_differ_and_aligns_them(kafka_bootstrap, catalog):
    """Topics an earlier release made keep their configs (the signals topic kept 7 days before
    5 Dec, 1 day since): `topics create` says so, and `--align-configs` sets the catalog's,
    keeping the topic's other overrides."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from typer.testing import CliRunner

    import infra.cli as cli
    from infra.bus import config_drift

    async def configs(set_to: dict | None = None) -> dict:
        """The signals topic's configs; ``set_to``: set first, and applied (the broker applies
        them a moment after it answers)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            if set_to is not None:
                await admin.alter_configs([
                    ConfigResource(ConfigResourceType.TOPIC, catalog.signals, set_to)])
            async with asyncio.timeout(15):
                while True:
                    (response,) = await admin.describe_configs([
                        ConfigResource(ConfigResourceType.TOPIC, catalog.signals)])
                    described = {e[0]: e[1] for e in response.resources[0][4]}
                    if set_to is None or set_to.items() <= described.items():
                        return described
                    await asyncio.sleep(0.1)  # polling until the broker has applied them
        finally:
            await admin.close()

    week, day = str(7 * 86_400_000), str(86_400_000)
    asyncio.run(configs({"cleanup.policy": "delete", "retention.ms": week,
                         "max.message.bytes": "2000000"}))  # as an earlier release, and by hand
    assert asyncio.run(config_drift(kafka_bootstrap, catalog)) == {
        catalog.signals: {"retention.ms": (week, day)}}
    args = ["topics", "create", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace]
    said = CliRunner().invoke(cli.app, args)
    assert said.exit_code == 0, said.output
    assert f"the catalog's retention.ms is {day}, it has {week}" in said.output
    assert "1 existing topics' configs differ from the catalog's" in said.output
    assert (f"`governor topics create --bootstrap {kafka_bootstrap} --namespace "
            f"{catalog.namespace} --align-configs` sets them" in " ".join(said.output.split())
            )  # (in the namespace and on the broker it was run on, not the default ones)
    assert asyncio.run(configs())["retention.ms"] == week  # told, not changed
    aligned = CliRunner().invoke(cli.app, [*args, "--align-configs"])
    assert aligned.exit_code == 0, aligned.output
    assert f"set retention.ms {day} (was {week})" in aligned.output
    assert asyncio.run(config_drift(kafka_bootstrap, catalog)) == {}
    now = asyncio.run(configs())
    assert (now["retention.ms"], now["max.message.bytes"]) == (day, "2000000")


def test_a_topic_of_other_partitions_is_made_again_with_topics_delete(kafka_bootstrap,
                                                                       namespaces_to_delete,
                                                                       capsys):
    """A topic a broker auto-created (one partition) before `topics create` ran: the error says
    how to make it again, and `topics delete` does what it says."""
    import uuid

    from typer.testing import CliRunner

    import infra.cli as cli
    from infra.bus import create_topic, topic_partitions
    from schemas.errors import GovernorError
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog(f"t-{uuid.uuid4().hex[:10]}")
    namespaces_to_delete.append(catalog.namespace)
    asyncio.run(create_topic(kafka_bootstrap, catalog.requests))  # one partition, not four
    common = ["--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace]
    refused = CliRunner().invoke(cli.app, ["topics", "create", *common])
    assert isinstance(refused.exception, GovernorError), refused.output
    # (on the broker and in the namespace it was run on, not the default ones: before, the
    # commands it named had no --bootstrap, and run as printed went to 127.0.0.1:9092)
    told = (f"`governor topics delete --bootstrap {kafka_bootstrap} --namespace "
            f"{catalog.namespace} {catalog.requests}`")
    assert told in str(refused.exception)
    again = (f"`governor topics create --bootstrap {kafka_bootstrap} --namespace "
             f"{catalog.namespace}`")
    assert str(refused.exception).endswith(f"then {again}")
    capsys.readouterr()
    cli._with_topics(kafka_bootstrap, catalog)  # (what a component checks before it starts)
    assert f"then {again}" in capsys.readouterr().err
    typo = CliRunner().invoke(cli.app, ["topics", "delete", "request", *common])
    assert isinstance(typo.exception, GovernorError), typo.output
    assert str(typo.exception).startswith(f"not a topic of namespace '{catalog.namespace}': "
                                          "request (its topics: ")
    deleted = CliRunner().invoke(cli.app, ["topics", "delete", catalog.requests, "kv", *common])
    assert deleted.exit_code == 0, deleted.output
    assert [line.split() for line in deleted.output.splitlines()] == [
        [catalog.requests, "deleted"], [catalog.kv, "deleted"]]
    made = CliRunner().invoke(cli.app, ["topics", "create", *common])
    assert made.exit_code == 0, made.output
    assert asyncio.run(topic_partitions(kafka_bootstrap, catalog)) == {
        name: spec.partitions for name, spec in catalog.topics().items()}
