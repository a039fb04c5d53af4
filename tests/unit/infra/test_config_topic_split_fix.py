"""The fix ``config_topic_split`` names for a configuration topic of several partitions: its
commands reach the broker the user gave (``--bootstrap``), as printed."""

from infra.bus import config_topic_split
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
