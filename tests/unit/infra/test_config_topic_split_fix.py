"""The fix ``config_topic_split`` names for a configuration topic of several partitions: its
commands reach the broker the user gave (``--bootstrap``), as printed."""

import logging

from infra.bus import ConfigPartition, config_topic_split
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("ns")


def test_one_partition_or_an_unlisted_topic_is_no_problem():
    assert config_topic_split(CATALOG, 1) is None
    assert config_topic_split(CATALOG, None) is None


def test_the_fix_names_the_broker_given_and_none_where_none_was():
    said = config_topic_split(CATALOG, 2, "10.0.0.7:9093")
    for command in ("`governor config get --bootstrap 10.0.0.7:9093 --namespace ns`",
                    "`governor topics delete --bootstrap 10.0.0.7:9093 --namespace ns config`",
                    "`governor topics create --bootstrap 10.0.0.7:9093 --namespace ns`"):
        assert command in said
    assert "--bootstrap" not in config_topic_split(CATALOG, 2)


class _Metadata:
    """A consumer's metadata as ``ConfigPartition`` asks it: the topic of two partitions."""

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}


def test_a_running_reader_logs_the_fix_with_its_own_broker(caplog):
    """A running component's reader logged the fix with no ``--bootstrap``: run as logged, its
    commands went to the default broker, not the component's."""
    reader = ConfigPartition(_Metadata(), CATALOG, "router r0", bootstrap="10.0.0.7:9093")
    with caplog.at_level(logging.ERROR, logger="infra.bus"):
        reader.watch()
    (logged,) = [r.getMessage() for r in caplog.records]
    assert "`governor topics create --bootstrap 10.0.0.7:9093 --namespace ns`" in logged
