"""The streams' source topics (telemetry, requests) and their partitions.

The streams read the sources co-partitioned with their repartition topics and tables' changelogs
(``streams.app``): partition N of each goes to the same worker, and a record's state is written
to partition N of a changelog. Those topics are made with the catalog's partition count, so a
source of another count cannot be read whole: Faust's assignor gave a topic of its own count
partitions of its own, and a record read on a partition past the changelogs' crashed the worker
(``AssertionError: Unrecognized partition``, as it wrote its state there). So a worker refuses
to start where a source has another count (``governor streams``), and one running when a
partition is added to a source reads on the partitions it has (``SourcesAssignor``: the added
one is never assigned) and says it (``SourcesWatch``).
"""

import logging
from collections.abc import Callable, Mapping

from faust.assignor import PartitionAssignor

from infra.bus import make_again
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


def sources(catalog: TopicCatalog) -> tuple[str, str]:
    """The topics the streams read co-partitioned with their own."""
    return catalog.telemetry, catalog.requests


def unread_sources(catalog: TopicCatalog, partitions: int,
                   counts: Mapping[str, int]) -> dict[str, int]:
    """Each source topic of ``counts`` (topic -> its partition count as the broker has it)
    whose count is not ``partitions``, the streams', with its count."""
    return {topic: counts[topic] for topic in sources(catalog)
            if counts.get(topic, partitions) != partitions}


def say_unread(catalog: TopicCatalog, partitions: int, topic: str, count: int,
               bootstrap: str | None = None) -> str:
    """Why the streams cannot read ``topic`` of ``count`` partitions whole, and the fix (its
    commands with the ``--bootstrap`` the user gave, if any)."""
    past = f" {partitions}" if count == partitions + 1 else f"s {partitions} to {count - 1}"
    unread = (f"the records of its partition{past} are not read" if count > partitions
              else "it cannot be read co-partitioned with them")
    return (f"topic {topic} has {count} partitions, not {partitions}: the streams read it "
            "co-partitioned with their repartition topics and tables' changelogs, of "
            f"{partitions} partitions each (the catalog's count), so {unread}; make it again: "
            f"{make_again(catalog.namespace, [topic], bootstrap)}")


def sources_problem(catalog: TopicCatalog, partitions: int, counts: Mapping[str, int],
                    bootstrap: str | None = None) -> str | None:
    """What ``say_unread`` says of each source topic of another count; None where none is."""
    unread = unread_sources(catalog, partitions, counts)
    return "; ".join(say_unread(catalog, partitions, topic, count, bootstrap)
                     for topic, count in unread.items()) or None


class SourcesWatch:
    """The source topics' partitions as a running worker last heard of them (``look``): a
    partition added to one is logged as an error, once per topic, and ``unread`` (the gauge
    ``governor_streams_unread_partitions``) is told how many partitions of each it leaves
    unread."""

    def __init__(self, catalog: TopicCatalog, partitions: int,
                 unread: Callable[[str, int], None], bootstrap: str | None = None) -> None:
        self.catalog, self.partitions, self.unread = catalog, partitions, unread
        self.bootstrap = bootstrap  # (the fix it logs names it: ``say_unread``)
        self.said: set[str] = set()
        for topic in sources(catalog):
            unread(topic, 0)

    def look(self, counts: Mapping[str, int | None]) -> None:
        """``counts``: each source topic's partition count as last heard (None: not yet)."""
        for topic, count in counts.items():
            if count is None:
                continue
            self.unread(topic, max(count - self.partitions, 0))
            if count != self.partitions and topic not in self.said:
                self.said.add(topic)
                logger.error("%s; the worker reads on the others meanwhile",
                             say_unread(self.catalog, self.partitions, topic, count,
                                        self.bootstrap))


class _CappedCluster:
    """A cluster's metadata as Faust's assignor reads it, each topic of ``caps`` with its first
    partitions alone."""

    def __init__(self, cluster, caps: Mapping[str, int]) -> None:
        self._cluster, self._caps = cluster, caps

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        partitions = self._cluster.partitions_for_topic(topic)
        cap = self._caps.get(topic)
        return partitions if partitions is None or cap is None else \
            {p for p in partitions if p < cap}

    def __getattr__(self, name: str):
        return getattr(self._cluster, name)


class SourcesAssignor(PartitionAssignor):
    """Faust's assignor, which assigns no partition of a source topic past the streams' count
    (``caps``, topic -> count: set on a class of the app's own): one added to it while the group
    runs is left unread, the others stay co-partitioned with the changelogs. Faust's would have
    assigned every partition of a source at its next metadata refresh (5 minutes), apart from
    the changelogs', and the worker crashed on the first record of the added one."""

    caps: Mapping[str, int] = {}

    def _perform_assignment(self, cluster, member_metadata):
        return super()._perform_assignment(_CappedCluster(cluster, self.caps), member_metadata)
