"""Why older and newer streams workers must not share a group (CHANGELOG, "Upgrading" past
7 Dec 2026): Faust's assignor, given one worker without the ``times`` table and two with it,
assigns that table's changelog apart from the telemetry partitions whose times it holds, and an
older leader's assignment fails the newer workers' own check of it."""

import faust
from faust.assignor.partition_assignor import PartitionAssignor

from schemas.topics import STREAMS_TABLES

PARTITIONS = 4
NS = "mixed"
INPUTS = [f"{NS}.telemetry", f"{NS}.requests", f"{NS}.streams.by-worker",
          f"{NS}.streams.by-task", f"{NS}.streams.by-scope"]
TIMES = f"{NS}.streams-times-changelog"
OLDER = tuple(table for table in STREAMS_TABLES if table != "times")


class Cluster:
    """The broker's metadata, as the assignor reads it: every topic has the same partitions."""

    def partitions_for_topic(self, _topic):
        return set(range(PARTITIONS))


def _worker(n: int, tables: tuple[str, ...]):
    """A streams worker's assignor (the app's table set and replicas) and its join metadata."""
    app = faust.App(f"{NS}.streams", broker="kafka://127.0.0.1:1", store="memory://",
                    autodiscover=False, web_enabled=False, topic_partitions=PARTITIONS,
                    table_standby_replicas=1, canonical_url=f"http://worker-{n}:6066")
    for table in tables:
        app.Table(table, default=None, partitions=PARTITIONS)
    assignor = PartitionAssignor(app, replicas=1)
    return assignor, assignor.metadata({*INPUTS, *app.tables.changelog_topics})


def _assign(tables: list[tuple[str, ...]]) -> list[dict[str, set[int]] | None]:
    """Each worker's active partitions (topic -> partitions) as the first worker, the group's
    leader, assigns them; None where the worker refuses its assignment."""
    workers = [_worker(n, t) for n, t in enumerate(tables)]
    sent = workers[0][0]._perform_assignment(
        Cluster(), {f"m{n}": metadata for n, (_a, metadata) in enumerate(workers)})
    out = []
    for (assignor, _metadata), assignment in zip(workers, sent.values(), strict=True):
        try:
            assignor.on_assignment(assignment)
        except AssertionError:
            out.append(None)
            continue
        actives: dict[str, set[int]] = {}
        for tp in assignor.assigned_actives():
            actives.setdefault(tp.topic, set()).add(tp.partition)
        out.append(actives)
    return out


def _times_apart(actives: dict[str, set[int]]) -> bool:
    """Whether a worker holds the times of other telemetry partitions than its own."""
    return actives.get(TIMES, set()) != actives.get(f"{NS}.telemetry", set())


def test_newer_workers_alone_hold_the_times_of_their_own_partitions():
    assert not any(_times_apart(actives) for actives in _assign([STREAMS_TABLES] * 3))


def test_an_older_leader_sends_the_newer_workers_an_assignment_they_refuse():
    assert [actives is not None for actives in _assign([OLDER, STREAMS_TABLES, STREAMS_TABLES])
            ] == [True, False, False]


def test_a_newer_leader_assigns_the_times_apart_from_their_partitions():
    assigned = _assign([STREAMS_TABLES, OLDER, STREAMS_TABLES])
    assert None not in assigned
    assert any(_times_apart(actives) for actives in assigned[::2])
