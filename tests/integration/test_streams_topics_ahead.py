"""A streams worker creates every topic its group subscribes to, the tables' changelogs
included, and waits for their leaders before Faust starts (``streams.worker.ensure_topics``).

Faust created the changelogs itself and subscribed at once: of two workers starting together,
one's consumer could fetch its metadata before the broker's held the changelog the other had
just created, and every assignment for the next 5 minutes (aiokafka's metadata refresh) left
it out. The survivor of a takeover then recovered nothing of that table
(``tests/integration/test_streams.py`` timed out, 2 runs of 27 beside a CPU burner)."""

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.app import StreamsApp
from streams.worker import ensure_topics, settings_for

pytestmark = pytest.mark.integration


async def _described(bootstrap: str, names: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """Each topic's partition count, and its cleanup policy."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        partitions = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)
                      if t["error_code"] == 0}
        policies = {}
        for response in await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name) for name in partitions]):
            for _code, _message, _type, name, entries in response.resources:
                policies[name] = {e[0]: e[1] for e in entries}["cleanup.policy"]
        return partitions, policies
    finally:
        await admin.close()


def test_the_tables_changelogs_exist_with_faust_s_policy_before_the_worker_starts(
        kafka_bootstrap, catalog, tmp_path):
    settings = settings_for(catalog.namespace, kafka_bootstrap)
    asyncio.run(ensure_topics(settings))
    tables = StreamsApp(settings, datadir=tmp_path).tables.values()
    changelogs = [table.changelog_topic.get_topic_name() for table in tables]
    partitions, policies = asyncio.run(_described(kafka_bootstrap, changelogs))
    assert partitions == {name: settings.partitions for name in changelogs}
    # as Faust would have created them: a plain table's changelog is compacted
    assert all(table.changelog_topic.compacting and not table.changelog_topic.deleting
               for table in tables)
    assert policies == {name: "compact" for name in changelogs}
