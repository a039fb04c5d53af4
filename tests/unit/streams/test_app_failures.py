"""What the Faust app's agents do when a send, a changelog write or a record fails, without a
broker: the agents run over stand-in batches and a stand-in producer."""

import asyncio
import logging
from collections import defaultdict
from types import SimpleNamespace

import orjson
import pytest

from schemas.codec import decode, encode
from schemas.events import Queued, Started
from schemas.topics import TopicCatalog
from streams.app import StreamsApp
from streams.commits import WriteFailed
from streams.crash import LoggedCrashes
from streams.stages import partition_of
from streams.worker import settings_for

T = 1_700_000_000_000
NS = "unit-ns"
CHANGELOG = {name: f"{NS}.streams-{name}-changelog" for name in ("requests", "tasks", "windows")}


class Producer:
    """Acknowledges every send at once, or fails those ``fail(topic)`` returns an error for;
    keeps what was acknowledged, by topic."""

    def __init__(self, fail=lambda topic: None) -> None:
        self.fail = fail
        self.sent: dict[str, list] = defaultdict(list)

    async def send(self, topic, key, value, partition, timestamp, headers):
        acked = asyncio.get_running_loop().create_future()
        error = self.fail(topic)
        if error is None:
            self.sent[topic].append((key, value, partition))
            acked.set_result(None)
        else:
            acked.set_exception(error)
        return acked


class Batches:
    """A stand-in for the stream Faust hands an agent: ``take_events`` yields the batches."""

    def __init__(self, *batches) -> None:
        self.batches = batches

    async def take_events(self, _max, _within):
        for batch in self.batches:
            yield batch


def event(topic: str, partition: int, offset: int, value: bytes, key: bytes | None = None):
    return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition,
                                                   offset=offset, key=key, value=value))


def telemetry(message, offset: int = 0):
    rid = message.request_id
    return event(f"{NS}.telemetry", partition_of(rid, 4), offset, encode(message), rid.encode())


def by_task(partition: int, offset: int, payloads: list):
    return event(f"{NS}.streams.by-task", partition, offset, orjson.dumps(payloads))


def step(rid: str, t: int, steps: int = 2, o: str = "ok") -> dict:
    return {"k": "step", "rid": rid, "step": 1, "steps": steps, "o": o, "t": t, "tn": "acme"}


def app(tmp_path, producer: Producer, clock=lambda: T) -> StreamsApp:
    streams = StreamsApp(settings_for(NS, "127.0.0.1:1"), datadir=tmp_path, clock=clock)
    streams._producer = lambda: producer
    streams.crashes = []

    async def crash(reason):  # Faust's: stop the worker, its process exits with the reason
        streams.crashes.append(reason)

    streams.app.crash = crash
    return streams


def queued(rid: str, t: int = T) -> Queued:
    return Queued(event_time_ms=t, request_id=rid, tenant="acme", model="m", created_ms=t,
                  prompt_tokens=10, max_tokens=5)


def dead_letters(producer: Producer) -> list:
    spec = TopicCatalog(NS).spec(f"{NS}.deadletter")
    return [decode(spec, value) for _key, value, _p in producer.sent[f"{NS}.deadletter"]]


def test_a_batch_whose_send_fails_writes_nothing_back_commits_nothing_and_stops_the_worker(
        tmp_path):
    """A by-scope send timed out on r1's batch: Faust acknowledged the batch's events and
    restarted the agent in the same process, whose next batch wrote r1's staged state to the
    changelog with its own; r1's observations were lost, and a replay of r1 counted nothing."""
    fail = [TimeoutError("KafkaTimeoutError")]
    producer = Producer(lambda topic: fail.pop() if fail and "by-scope" in topic else None)
    streams = app(tmp_path, producer)
    # the agent does not raise: Faust's supervisor would restart it as the worker stops
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r1"))])))
    assert [type(reason.__cause__) for reason in streams.crashes] == [TimeoutError]
    assert "r1" not in streams.tables["requests"].data and not streams.staged["requests"]._writes
    # a batch the agent reads before the worker has stopped writes nothing back either
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r2"))])))
    assert "r2" not in streams.tables["requests"].data
    assert producer.sent[CHANGELOG["requests"]] == []
    # and the consumer, after Faust's flush, commits no offset
    assert asyncio.run(streams.app.consumer._commit({("unit-ns.telemetry", 0): 1})) is False
    assert len(streams.crashes) == 1  # the worker is stopped once


def test_a_failed_changelog_write_stops_the_next_batch_and_every_commit(tmp_path):
    """The write-back's futures were dropped: a changelog record that failed after the
    producer's retries was lost while Faust committed the offsets past the events behind it."""
    fail = [OSError("NotLeaderForPartition after retries")]
    producer = Producer(lambda topic: fail.pop() if fail and "changelog" in topic else None)
    streams = app(tmp_path, producer)
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r1"))])))  # written back
    assert asyncio.run(streams.app.consumer._commit({("unit-ns.telemetry", 0): 1})) is False
    assert [type(reason.__cause__) for reason in streams.crashes] == [WriteFailed]
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r2"), 1)])))
    assert "r2" not in streams.tables["requests"].data
    assert producer.sent[CHANGELOG["requests"]] == []  # r2's state is not written back


@pytest.mark.parametrize("failing", ["by-scope", "changelog"])
def test_a_failed_send_or_write_is_told_once(tmp_path, caplog, failing):
    """The worker logs why it stops (CRITICAL, with the traceback), then crashes: before, with
    the failure itself, and mode's "Crashed reason=..." line said it again, traceback and all.
    The crash's reason is now a ``LoggedCrash``, whose line ``LoggedCrashes`` drops."""
    fail = [TimeoutError("KafkaTimeoutError")]
    producer = Producer(lambda topic: fail.pop() if fail and failing in topic else None)
    streams = app(tmp_path, producer)
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r1"))])))
    asyncio.run(streams.app.consumer._commit({("unit-ns.telemetry", 0): 1}))  # (the write's)
    told = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(told) == 1 and "KafkaTimeoutError" in told[0], caplog.text
    [reason] = streams.crashes
    mode_says = logging.LogRecord("faust.app.base", logging.ERROR, __file__, 1,
                                  "[^-App]: Crashed reason=%r", (reason,), None)
    assert not LoggedCrashes().filter(mode_says)


@pytest.mark.parametrize("route", ["worker", "task", "scope"])
def test_an_undecodable_internal_record_is_dead_lettered_and_the_batch_goes_on(tmp_path, route):
    """An internal record the agent could not read stopped it (orjson.loads raised), losing
    the batch; now it goes to the dead-letter topic and the records after it count."""
    producer = Producer()
    streams = app(tmp_path, producer)
    bad = event(f"{NS}.streams.by-{route}", 1, 7, b"\x00 not json")
    if route == "worker":
        good, agent = telemetry(queued("r1")), streams._ingest_agent
    elif route == "task":
        good, agent = by_task(1, 8, [["acme|t1", step("a", T)]]), streams._task_agent
    else:
        obs = {"k": "q", "t": T}
        good = event(f"{NS}.streams.by-scope", 1, 8,
                     orjson.dumps([["tenant:acme", ["t0", 1, 0, obs]]]))
        agent = streams._window_agent
    asyncio.run(agent(Batches([bad, good])))
    [letter] = dead_letters(producer)
    assert (letter.source_topic, letter.offset, letter.reason) == (
        f"{NS}.streams.by-{route}", 7, "undecodable")
    # counted by topic and reason, as every component counts its dead letters (until 6 Dec the
    # streams counted them in governor_streams_dead_letters_total alone, without either)
    assert streams.metrics.registry.get_sample_value("governor_dead_letters_total", {
        "topic": f"{NS}.streams.by-{route}", "reason": "undecodable"}) == 1
    assert streams.crashes == []
    assert {"worker": "r1", "task": "acme|t1", "scope": "tenant:acme|total"}[route] in {
        orjson.loads(key) for key, _value, _p in
        producer.sent[CHANGELOG[{"worker": "requests", "task": "tasks", "scope": "windows"}[route]]]}


def test_an_internal_record_that_fails_half_way_changes_nothing_and_is_dead_lettered(tmp_path):
    """A by-task record's first payload had changed task t1 in place when its second failed
    (an older format, without "t"): the agent stopped, and t1 kept half the record."""
    producer = Producer()
    streams = app(tmp_path, producer)
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|t1", step("a", T)]])])))
    before = orjson.loads(orjson.dumps(streams.tables["tasks"].data["acme|t1"]))
    old_format = {k: v for k, v in step("c", T + 5_000).items() if k != "t"}
    half = by_task(1, 1, [["acme|t1", step("b", T + 5_000)], ["acme|t2", old_format]])
    after = by_task(1, 2, [["acme|t3", step("d", T + 6_000)]])
    asyncio.run(streams._task_agent(Batches([half, after])))
    [letter] = dead_letters(producer)
    assert (letter.offset, letter.reason) == (1, "unprocessable")
    assert letter.error.startswith("KeyError")
    assert streams.tables["tasks"].data["acme|t1"] == before  # step b's "ok" undone
    assert "acme|t2" not in streams.tables["tasks"].data
    assert "acme|t3" in streams.tables["tasks"].data and streams.crashes == []


def test_a_record_the_stages_fail_on_moves_no_event_time(tmp_path):
    """A by-task record whose first payload moved its partition's event time past task A's
    retention (600 s after its close), and whose second failed: the record was undone and
    dead-lettered, but the stages' event time stayed moved, so the retry of A's failed step,
    read next, took A as forgotten and opened a task of its own (``tc``) instead of moving A
    to succeeded (``tr``)."""
    producer = Producer()
    streams = app(tmp_path, producer)
    failed = by_task(1, 0, [["acme|A", step("a1", T, steps=1, o="failed")]])
    old_format = {k: v for k, v in step("c1", T + 601_000).items() if k != "t"}
    half = by_task(1, 1, [["acme|B", step("b1", T + 601_000)], ["acme|C", old_format]])
    asyncio.run(streams._task_agent(Batches([failed], [half])))
    assert [letter.offset for letter in dead_letters(producer)] == [1]
    producer.sent.pop(f"{NS}.streams.by-scope")
    retry = by_task(1, 2, [["acme|A", step("a2", T + 2_000, steps=1)]])
    asyncio.run(streams._task_agent(Batches([retry])))
    kinds = [item[3]["k"] for _key, value, _p in producer.sent[f"{NS}.streams.by-scope"]
             for key, item in orjson.loads(value) if key == "fleet:all"]
    assert kinds == ["tr"]


def test_a_source_record_the_stages_fail_on_half_way_leaves_no_trace(tmp_path):
    """The request book records an event as seen before it applies it: one the stages failed
    on half-way stayed seen in the store's own dict, so the same event sent again (or replayed
    once the bug is fixed) was dropped as a duplicate."""
    producer = Producer()
    streams = app(tmp_path, producer)
    asyncio.run(streams._ingest_agent(Batches([telemetry(queued("r1"))])))
    started = Started(event_time_ms=T + 10, request_id="r1", tenant="acme", model="m",
                      worker_id="w1")
    book, on_started = streams.stages.request_book, streams.stages.request_book._on_started

    def failing(st, event):
        st["att"]["1"] = ["w1", T, 1]
        raise ZeroDivisionError("a bug")

    book._on_started = failing
    asyncio.run(streams._ingest_agent(Batches([telemetry(started, 1)])))
    [letter] = dead_letters(producer)
    assert letter.reason == "unprocessable" and letter.error == "ZeroDivisionError: a bug"
    assert streams.tables["requests"].data["r1"]["seen"] == ["queued"]
    assert streams.tables["requests"].data["r1"]["att"] == {}
    book._on_started = on_started
    sent = len(producer.sent[f"{NS}.streams.by-scope"])
    asyncio.run(streams._ingest_agent(Batches([telemetry(started, 1)])))
    assert len(producer.sent[f"{NS}.streams.by-scope"]) > sent  # counted this time
    assert "started:1" in streams.tables["requests"].data["r1"]["seen"]


def test_a_bad_observation_among_good_ones_is_dead_lettered_alone(tmp_path):
    """The window agent applies a batch grouped by scope key; when that fails it applies the
    records one by one, so only the bad one is left out."""
    producer = Producer()
    streams = app(tmp_path, producer)
    good = [event(f"{NS}.streams.by-scope", 1, i, orjson.dumps(
        [["tenant:acme", [f"t{i}", 1, 0, {"k": "q", "t": T + i}]]])) for i in (0, 2)]
    bad = event(f"{NS}.streams.by-scope", 1, 1, orjson.dumps(
        [["tenant:acme", ["t9", 1, 0, {"k": "q"}]]]))  # no time
    asyncio.run(streams._window_agent(Batches([good[0], bad, good[1]])))
    [letter] = dead_letters(producer)
    assert (letter.offset, letter.reason) == (1, "unprocessable")
    total = streams.tables["windows"].data["tenant:acme|total"]
    assert total["b"]["c"]["queued"] == 2 and set(total["hw"]) == {"t0", "t2"}



def test_a_task_closed_again_in_a_replay_has_the_identity_of_its_first_close(tmp_path):
    """A sweep's outputs had the offset of the last record of the batch it followed: a worker
    that crashed after sending a task's close and before writing the task back closed it again
    in its replay, after a batch split elsewhere, under another identity, and the window book
    counted the close twice."""
    producer = Producer()
    first = app(tmp_path / "first", producer)
    asyncio.run(first._task_agent(Batches([by_task(1, 0, [["acme|x", step("a", T)]])])))
    written = list(producer.sent[CHANGELOG["tasks"]])  # what the changelog keeps of the crash
    later = by_task(1, 1, [["acme|y", step("b", T + 200_000)]])
    asyncio.run(first._task_agent(Batches([later])))  # closes x, then the worker crashes

    def closes():
        return [item for _key, value, _p in producer.sent.pop(f"{NS}.streams.by-scope", [])
                for key, item in orjson.loads(value) if key == "fleet:all" and item[3]["k"] == "tc"]

    [sent_first] = closes()
    second = app(tmp_path / "second", producer)  # restores the tasks from the changelog
    restored = second.staged["tasks"]
    for key, value, partition in written:
        restored.partition = partition
        restored[orjson.loads(key)] = orjson.loads(value)
    restored.flush()
    replay = [later, by_task(1, 2, [["acme|z", step("c", T + 210_000)]])]
    asyncio.run(second._task_agent(Batches(replay)))  # one batch this time
    [sent_again] = closes()
    assert sent_again == sent_first
    assert sent_first[3] == {"k": "tc", "t": T + 120_000, "o": "timed_out", "usd": 0.0}
