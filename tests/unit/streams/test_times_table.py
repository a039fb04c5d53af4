"""The ``times`` table: each telemetry and by-task partition's event time, written back with the
batch that moved it, after the entries it covers, and restored on a new worker
(``test_batching_found`` has the takeover it was made for)."""

import asyncio

import orjson

from streams.stages import partition_of
from streams.worker import settings_for, streams_topics
from test_app_failures import NS, T, Batches, Producer, app, by_task, dead_letters, event, step
from test_batching_found import heartbeat

TIMES = f"{NS}.streams-times-changelog"


class InOrder(Producer):
    """Keeps every record acknowledged in the order sent, whatever its topic (``log``)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, bytes, bytes | None, int]] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.log.append((topic, key, value, partition))
        return await super().send(topic, key, value, partition, timestamp, headers)


def test_streams_topics_holds_the_times_changelog_compacted():
    topics = streams_topics(settings_for(NS, "127.0.0.1:1"))
    assert topics[TIMES] == {"cleanup.policy": "compact"}


def test_a_record_the_stages_fail_on_leaves_the_stored_time_unmoved(tmp_path):
    """A by-task record whose first payload moves its partition's event time 601 s on, and
    whose second fails: it is undone and dead-lettered, and the time written back, restored by
    the next worker, is the record's before it."""
    producer = Producer()
    streams = app(tmp_path, producer)
    old_format = {k: v for k, v in step("c1", T + 601_000).items() if k != "t"}
    half = by_task(1, 1, [["acme|B", step("b1", T + 601_000)], ["acme|C", old_format]])
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|A", step("a1", T)]])],
                                            [half])))
    assert [letter.offset for letter in dead_letters(producer)] == [1]
    assert streams.tables["times"].data == {"k|1": T}
    assert [(orjson.loads(key), orjson.loads(value), partition)
            for key, value, partition in producer.sent[TIMES]] == [("k|1", T, 1)]


def _costs(sent: list) -> dict:
    """The attempts' charges among by-task records sent: (request, attempt) -> USD."""
    return {(payload["rid"], payload["a"]): payload["usd"] for _key, value, _partition in sent
            for _task, payload in orjson.loads(value) if payload["k"] == "cost"}


def test_a_write_back_cut_anywhere_leaves_the_replay_charging_as_the_batch_did(tmp_path):
    """One batch on w-0's telemetry partition: its heartbeat at T, an attempt's end relayed to
    it, its heartbeat at T+1 s (which charges the attempt), and w-1's at T+10 s. The batch's
    write-back (requests, workers, then the partition's time) is cut after each of its records
    in turn, and the batch replayed on a new worker given what landed: the attempt costs what
    it did. Written first, the time at T+10 s restored without w-0's entry would have the
    replay apply w-0's heartbeats at it, taking w-0 as silent since T and charging the attempt
    up to T only."""
    assert partition_of("w-0", 4) == partition_of("w-1", 4)
    partition = partition_of("w-0", 4)
    end = {"k": "end", "rid": "r1", "task": "r1", "tn": "acme", "a": 1, "s": T + 10,
           "e": T + 200}
    batch = [heartbeat("w-0", T, 0),
             event(f"{NS}.streams.by-worker", partition, 0, orjson.dumps([["w-0", end]])),
             heartbeat("w-0", T + 1_000, 1), heartbeat("w-1", T + 10_000, 2)]
    producer = InOrder()
    asyncio.run(app(tmp_path / "first", producer)._ingest_agent(Batches(batch)))
    charged = _costs(producer.sent[f"{NS}.streams.by-task"])
    assert charged and producer.log[-1][0] == TIMES
    changelogs = [record for record in producer.log if record[0].endswith("-changelog")]
    costs = []
    for cut in range(len(changelogs) + 1):
        replay = Producer()
        second = app(tmp_path / f"cut-{cut}", replay)
        for topic, key, value, partition in changelogs[:cut]:
            table = topic.removeprefix(f"{NS}.streams-").removesuffix("-changelog")
            second.tables[table].data[orjson.loads(key)] = orjson.loads(value)
            second.tables[table].data._key_partition[orjson.loads(key)] = partition
        asyncio.run(second._ingest_agent(Batches(batch)))
        costs.append(_costs(replay.sent[f"{NS}.streams.by-task"]))
    assert costs == [charged] * (len(changelogs) + 1)
