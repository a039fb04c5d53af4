"""The streams' source topics of another partition count than theirs (``streams.sources``):
what is said of them, once, the gauge, and the metadata Faust's assignor is given."""

import logging

import pytest

from schemas.topics import TopicCatalog
from streams.metrics import SignalMetrics
from streams.sources import (SourcesWatch, _CappedCluster, say_unread, sources_problem,
                             unread_sources)

CATALOG = TopicCatalog("ns")
AGAIN = ("make it again: `governor topics delete --namespace ns {topic}` (their records go with "
         "them) then `governor topics create --namespace ns`")


@pytest.mark.parametrize("counts, unread", [
    ({"ns.telemetry": 4, "ns.requests": 4, "ns.dispatch": 32}, {}),
    ({"ns.telemetry": 5, "ns.requests": 4}, {"ns.telemetry": 5}),
    ({"ns.telemetry": 4, "ns.requests": 1}, {"ns.requests": 1}),  # (a broker auto-created it)
    ({"ns.telemetry": 6, "ns.requests": 5}, {"ns.telemetry": 6, "ns.requests": 5}),
    ({"ns.requests": 4, "ns.kv": 3}, {}),  # (a topic missing is the start's check, not this)
])
def test_the_sources_of_another_count_than_the_streams_are_unread(counts, unread):
    assert unread_sources(CATALOG, 4, counts) == unread


@pytest.mark.parametrize("count, why", [
    (5, "so the records of its partition 4 are not read"),
    (7, "so the records of its partitions 4 to 6 are not read"),
    (1, "so it cannot be read co-partitioned with them"),
])
def test_what_is_said_names_the_topic_its_count_the_streams_count_and_the_fix(count, why):
    assert say_unread(CATALOG, 4, "ns.telemetry", count) == (
        f"topic ns.telemetry has {count} partitions, not 4: the streams read it co-partitioned "
        "with their repartition topics and tables' changelogs, of 4 partitions each (the "
        f"catalog's count), {why}; " + AGAIN.format(topic="ns.telemetry"))


def test_a_problem_says_each_unread_source_and_none_where_there_is_none():
    assert sources_problem(CATALOG, 4, {"ns.telemetry": 4, "ns.requests": 4}) is None
    both = sources_problem(CATALOG, 4, {"ns.telemetry": 5, "ns.requests": 6})
    assert both.startswith("topic ns.telemetry has 5 partitions, not 4: ")
    assert "; topic ns.requests has 6 partitions, not 4: " in both
    assert both.endswith(AGAIN.format(topic="ns.requests"))


def _gauge(metrics: SignalMetrics, topic: str) -> float | None:
    return metrics.registry.get_sample_value("governor_streams_unread_partitions",
                                             {"topic": topic})


def test_a_partition_added_to_a_source_is_an_error_once_and_its_gauge_says_it(caplog):
    metrics = SignalMetrics()
    watch = SourcesWatch(CATALOG, 4, metrics.unread_seen)
    assert (_gauge(metrics, "ns.telemetry"), _gauge(metrics, "ns.requests")) == (0, 0)
    with caplog.at_level(logging.ERROR, logger="streams.sources"):
        watch.look({"ns.telemetry": None, "ns.requests": 4})  # (not heard of yet)
        assert not caplog.records and _gauge(metrics, "ns.telemetry") == 0
        watch.look({"ns.telemetry": 5, "ns.requests": 4})
        watch.look({"ns.telemetry": 5, "ns.requests": 4})
        watch.look({"ns.telemetry": 6, "ns.requests": 4})
    assert [r.getMessage() for r in caplog.records] == [
        say_unread(CATALOG, 4, "ns.telemetry", 5) + "; the worker reads on the others meanwhile"]
    assert (_gauge(metrics, "ns.telemetry"), _gauge(metrics, "ns.requests")) == (2, 0)


def test_a_running_worker_logs_the_fix_with_its_own_broker(caplog):
    """A running worker logged the fix with no ``--bootstrap``: run as logged, its commands
    went to the default broker, not the worker's."""
    watch = SourcesWatch(CATALOG, 4, SignalMetrics().unread_seen, "10.0.0.7:9093")
    with caplog.at_level(logging.ERROR, logger="streams.sources"):
        watch.look({"ns.telemetry": 5})
    (logged,) = [r.getMessage() for r in caplog.records]
    assert "`governor topics create --bootstrap 10.0.0.7:9093 --namespace ns`" in logged


class _Cluster:
    """A cluster's metadata: its topics' partitions."""

    brokers = "the brokers"

    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic)


def test_faust_s_assignor_is_given_no_partition_of_a_source_past_the_streams_count():
    cluster = _Cluster({"ns.telemetry": set(range(5)), "ns.requests": set(range(4)),
                        "ns.streams.by-task": set(range(4))})
    capped = _CappedCluster(cluster, {"ns.telemetry": 4, "ns.requests": 4})
    assert capped.partitions_for_topic("ns.telemetry") == {0, 1, 2, 3}
    assert capped.partitions_for_topic("ns.requests") == {0, 1, 2, 3}
    assert capped.partitions_for_topic("ns.streams.by-task") == {0, 1, 2, 3}
    assert capped.partitions_for_topic("ns.missing") is None
    assert capped.brokers == "the brokers"  # the rest as the cluster's


def test_the_fix_names_the_broker_the_user_gave():
    """Run as printed, the commands reach the broker the start was told of, not the default."""
    said = sources_problem(CATALOG, 4, {"ns.telemetry": 5}, bootstrap="10.0.0.7:9093")
    assert "`governor topics delete --bootstrap 10.0.0.7:9093 --namespace ns " in said
    assert "`governor topics create --bootstrap 10.0.0.7:9093 --namespace ns`" in said
    assert "--bootstrap" not in sources_problem(CATALOG, 4, {"ns.telemetry": 5})
