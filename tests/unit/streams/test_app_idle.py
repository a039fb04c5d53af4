"""The sweeps of partitions no record reaches any more, run from the app's timer, without a
broker (the stand-ins of ``test_app_failures``)."""

import asyncio
import math
import time
from collections import defaultdict
from types import SimpleNamespace

import orjson
from faust.types import TP

from schemas.codec import encode
from schemas.events import Completed, Queued, Started, WorkerStatus
from streams.app import StreamsApp
from streams.membership import Membership
from streams.stages import partition_of
from test_app_failures import (
    NS, T, Batches, Producer, app, by_task, event, queued, step, telemetry,
)


def assign(streams: StreamsApp, topic: str, *partitions: int, caught_up: bool = True) -> None:
    """Give the app ``partitions`` of ``topic``, read to their end whenever asked (or not), its
    membership confirmed by a heartbeat the broker acknowledged just now."""
    streams.app.assignor.assigned_actives = lambda: {TP(topic, p) for p in partitions}
    streams.membership.acknowledged(time.monotonic())

    async def read_to_end(_consumer, _tp):
        return math.inf if caught_up else None

    streams._caught_up = read_to_end


def sent(producer: Producer, route: str) -> list:
    return [pair for _key, value, _p in producer.sent[f"{NS}.streams.by-{route}"]
            for pair in orjson.loads(value)]


def test_an_idle_by_task_partition_times_its_open_tasks_out_by_the_clock(tmp_path):
    """A by-task partition's event time was the newest read there: once the last records of a
    task had been read it stood still, and the task never timed out."""
    now = [T]
    producer = Producer()
    streams = app(tmp_path, producer, clock=lambda: now[0])
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|t1", step("a", T)]])])))
    assign(streams, f"{NS}.streams.by-task", 1)
    now[0] = T + 140_000  # idle long since, but its clock less 30 s is before the timeout
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []
    now[0] = T + 151_000
    asyncio.run(streams._sweep_idle())
    closes = [item[3] for key, item in sent(producer, "scope") if key == "fleet:all"]
    assert closes == [{"k": "tc", "t": T + 120_000, "o": "timed_out", "usd": 0.0}]
    assert streams.tables["tasks"].data["acme|t1"]["o"] == "timed_out"  # written back


def test_a_partition_still_read_or_not_read_to_its_end_is_not_idle(tmp_path):
    now = [T]
    producer = Producer()
    streams = app(tmp_path, producer, clock=lambda: now[0])
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|t1", step("a", T)]])])))
    assign(streams, f"{NS}.streams.by-task", 1, caught_up=False)  # a backlog still unread
    now[0] = T + 600_000
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []
    assign(streams, f"{NS}.streams.by-task", 1)
    # a record read 10 s ago (its own time far behind): the partition is not idle
    asyncio.run(streams._task_agent(Batches([by_task(1, 1, [["acme|t2", step("b", T)]])])))
    now[0] += 10_000
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []
    streams.app.rebalancing = True
    now[0] += 60_000
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []


def test_a_worker_whose_membership_is_not_confirmed_sweeps_nothing(tmp_path):
    """Resumed from a pause past its session timeout, a worker found every partition it had
    idle, and swept those another worker had taken meanwhile."""
    now = [T]
    producer = Producer()
    streams = app(tmp_path, producer, clock=lambda: now[0])
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|t1", step("a", T)]])])))
    assign(streams, f"{NS}.streams.by-task", 1)
    streams.membership = Membership(6.0)  # no heartbeat acknowledged since
    now[0] = T + 600_000
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []
    streams.membership.acknowledged(time.monotonic() - 6.0)  # sent a session timeout ago
    asyncio.run(streams._sweep_idle())
    assert sent(producer, "scope") == []
    streams.membership.acknowledged(time.monotonic())
    asyncio.run(streams._sweep_idle())
    assert [item[3]["o"] for key, item in sent(producer, "scope") if key == "fleet:all"] == [
        "timed_out"]


def test_an_idle_telemetry_partition_charges_the_attempts_of_its_crashed_worker(tmp_path):
    """The only worker of a telemetry partition crashed after its attempt ended: the end waited
    for a heartbeat at or after it, or for the partition's event time to pass the heartbeat gap,
    neither of which came, and the attempt was never charged to its task."""
    now = [T + 1_000]
    producer = Producer()
    streams = app(tmp_path, producer, clock=lambda: now[0])
    common = dict(request_id="r1", tenant="acme", model="m")
    records = [
        WorkerStatus(event_time_ms=T, worker_id="w1", slot=0, pool="h100@m", gpu_type="h100",
                     models_loaded=["m"], running=1, started_ms=T - 60_000),
        Queued(event_time_ms=T + 50, created_ms=T + 50, prompt_tokens=10, max_tokens=5,
               **common),
        Started(event_time_ms=T + 100, worker_id="w1", **common),
        WorkerStatus(event_time_ms=T + 500, worker_id="w1", slot=0, pool="h100@m",
                     gpu_type="h100", models_loaded=["m"], running=1, started_ms=T - 60_000),
        Completed(event_time_ms=T + 1_000, worker_id="w1", prompt_tokens=10, output_tokens=5,
                  e2e_s=0.95, **common)]
    keys = [getattr(m, "request_id", None) or m.worker_id for m in records]
    asyncio.run(streams._ingest_agent(Batches([
        event(f"{NS}.telemetry", partition_of(key, 4), offset, encode(message), key.encode())
        for offset, (key, message) in enumerate(zip(keys, records))])))
    relays = [event(f"{NS}.streams.by-worker", p, i, value)
              for i, (_key, value, p) in enumerate(producer.sent[f"{NS}.streams.by-worker"])]
    asyncio.run(streams._ingest_agent(Batches(relays)))
    charges = lambda: [pair for pair in sent(producer, "task") if pair[1]["k"] == "cost"]  # noqa: E731
    assert charges() == []  # the end waits for the worker's next heartbeat
    assign(streams, f"{NS}.telemetry", *range(4))
    now[0] = T + 36_000  # idle 35 s: its event time moves to 6 s, past the heartbeat's + 5 s
    asyncio.run(streams._sweep_idle())
    [(task, charge)] = charges()
    assert (task, charge["k"], charge["rid"], charge["t"]) == ("r1", "cost", "r1", T + 1_000)
    assert charge["usd"] > 0  # its share of the worker from its start to the last heartbeat


class Consumer:
    """Faust's consumer of one partition as ``_caught_up`` asks it: the end and the position,
    the last offset delivered, and when its aiokafka consumer's latest fetch was answered."""

    def __init__(self, end, read, position, polled=None):
        self.end, self._position = end, position
        self._read_offset = defaultdict(lambda: read)  # (as Faust's: any partition)
        self.polled = polled
        self._thread = SimpleNamespace(_consumer=self)  # (the aiokafka consumer it runs)

    def highwater(self, _tp):
        return self.end

    async def position(self, _tp):
        return self._position

    def last_poll_timestamp(self, _tp):
        return self.polled


def read_until(streams: StreamsApp, consumer: Consumer, *answered: int):
    """Until when ``_caught_up`` finds the partition read, its fetches answered at each of
    ``answered`` in turn, looked at after each."""
    for at_ms in answered or (None,):  # (none: not fetched)
        consumer.polled = at_ms
        until = asyncio.run(streams._caught_up(consumer, "tp"))
    return until


def test_a_partition_is_read_to_its_end_when_its_last_record_was_delivered(tmp_path):
    """As of when the fetch before its latest was answered (``infra.bus.FetchAnswers``)."""
    streams = app(tmp_path, Producer())
    assert read_until(streams, Consumer(10, 9, 10), T + 100, T + 200) == T + 100
    assert read_until(streams, Consumer(10, 8, 10), T + 300) is None  # fetched, not delivered
    assert read_until(streams, Consumer(10, None, 10), T + 400) == T + 300  # nothing since
    assert read_until(streams, Consumer(10, None, 7), T + 500) is None
    assert read_until(streams, Consumer(10, 9, 9), T + 600) is None  # sought back to 9: unread
    assert read_until(streams, Consumer(None, None, 7)) is None  # no fetch yet
    assert read_until(app(tmp_path, Producer()), Consumer(10, 9, 10), T + 100) is None  # once


def test_a_partition_not_fetched_for_a_while_moves_on_no_further_than_it_was_read(tmp_path):
    """Its latest fetch answered long ago (the partition paused, its fetches failing), its
    position at the end that fetch found: records stored since may wait unread. It counted as
    read to its end, and its open task timed out by the clock."""
    now = [T]
    producer = Producer()
    streams = app(tmp_path, producer, clock=lambda: now[0])
    asyncio.run(streams._task_agent(Batches([by_task(1, 0, [["acme|t1", step("a", T)]])])))
    streams.app.assignor.assigned_actives = lambda: {TP(f"{NS}.streams.by-task", 1)}
    streams.membership.acknowledged(time.monotonic())
    streams.app.consumer = consumer = Consumer(1, 0, 1)
    timed_out = lambda: [item[3]["t"] for key, item in sent(producer, "scope")  # noqa: E731
                         if key == "fleet:all" and item[3].get("o") == "timed_out"]
    for polled, at in ((T + 8_000, T + 151_000), (T + 9_000, T + 152_000),
                       (T + 160_000, T + 161_000)):
        consumer.polled, now[0] = polled, at
        asyncio.run(streams._sweep_idle())
        assert timed_out() == []  # (read to its end as of T + 9 s at most)
    consumer.polled, now[0] = T + 161_000, T + 162_000  # fetched again, twice
    asyncio.run(streams._sweep_idle())
    assert timed_out() == [T + 120_000]


def test_the_sweep_after_a_batch_sees_the_tasks_that_batch_wrote(tmp_path):
    """Task t1's step 1 of 2 at T, then task t2's at T + 121 s, in one by-task partition: the
    sweep after the batch that read both is past t1's idle timeout (120 s). It looked only at
    tasks filed as written back by earlier batches, so t1 timed out where a batch ended between
    the two records and stayed open where one batch held both."""
    def closes(*batches) -> list:
        producer = Producer()
        streams = app(tmp_path, producer)
        asyncio.run(streams._task_agent(Batches(*batches)))
        return [item[3] for key, item in sent(producer, "scope") if key == "fleet:all"]

    first = by_task(1, 0, [["acme|t1", step("a", T)]])
    second = by_task(1, 1, [["acme|t2", step("b", T + 121_000)]])
    timed_out = [{"k": "tc", "t": T + 120_000, "o": "timed_out", "usd": 0.0}]
    assert closes([first], [second]) == timed_out
    assert closes([first, second]) == timed_out


def test_a_task_past_its_idle_timeout_times_out_before_the_batchs_later_records_reach_it(
        tmp_path):
    """Task t1's step 1 of 2 at T, task t2's at T + 121 s (past t1's idle timeout, 120 s), then
    t1's step 2: read one at a time, t1 timed out after t2's record, before its step 2. In one
    batch the sweep ran after the whole batch, when step 2 had kept t1 open."""
    def closes(*batches) -> list:
        producer = Producer()
        streams = app(tmp_path, producer)
        asyncio.run(streams._task_agent(Batches(*batches)))
        return [item[3]["o"] for key, item in sent(producer, "scope")
                if key == "fleet:all" and item[3]["k"] == "tc"]

    records = [by_task(1, 0, [["acme|t1", step("a", T)]]),
               by_task(1, 1, [["acme|t2", step("b", T + 121_000)]]),
               by_task(1, 2, [["acme|t1", {**step("a2", T + 121_500), "step": 2}]])]
    one_at_a_time = closes(*([record] for record in records))
    assert one_at_a_time == ["timed_out"]
    assert closes(records) == one_at_a_time


def test_a_request_forgotten_by_then_is_forgotten_for_the_batchs_later_records(tmp_path):
    """r1 completes at T; r2 (its partition's) is queued at T + 301 s, past the requests'
    retention (300 s); then r1's completion is read again (re-sent). One at a time, the sweep
    after r2's record forgot r1 and the copy counted as a completion of its own; in one batch
    the sweep ran after the copy, which found r1 and was dropped."""
    def completions(*batches) -> list:
        producer = Producer()
        streams = app(tmp_path, producer, clock=lambda: T + 400_000)
        asyncio.run(streams._ingest_agent(Batches(*batches)))
        return [item[3]["t"] for key, item in sent(producer, "scope")
                if key == "fleet:all" and item[3]["k"] == "c"]

    done = Completed(event_time_ms=T, request_id="r1", worker_id="w1", prompt_tokens=1,
                     output_tokens=1, e2e_s=0.1, tenant="acme")
    records = [telemetry(done, 0), telemetry(queued("r2", T + 301_000), 1), telemetry(done, 2)]
    one_at_a_time = completions(*([record] for record in records))
    assert one_at_a_time == [T, T]
    assert completions(records) == one_at_a_time


def test_a_record_read_after_an_idle_move_finds_its_task_as_at_the_moved_time(tmp_path):
    """Task A failed at T; its by-task partition goes idle and the clock moves its event time
    past A's retention (600 s), then a retry of A's step is read. The app kept the moved time
    for its sweeps, the stages their own for the books, moved only by a sweep: moved in one
    step (its sweep due, A forgotten) the retry opened a task of its own; moved in two, the
    second less than the sweeps' second apart (none due), it revived A. Either way now it
    finds A forgotten, as the partition's time says."""
    def retried(idle_moves: list[int]) -> list[str]:
        now = [T]
        producer = Producer()
        streams = app(tmp_path, producer, clock=lambda: now[0])
        failed = by_task(1, 0, [["acme|A", step("a1", T, steps=1, o="failed")]])
        asyncio.run(streams._task_agent(Batches([failed])))
        assign(streams, f"{NS}.streams.by-task", 1)
        for moved_to in idle_moves:  # the clock less the allowed lateness (30 s)
            now[0] = moved_to + 30_000
            asyncio.run(streams._sweep_idle())
        producer.sent.clear()
        retry = by_task(1, 1, [["acme|A", step("a2", T + 2_000, steps=1)]])
        asyncio.run(streams._task_agent(Batches([retry])))
        return [item[3]["k"] for key, item in sent(producer, "scope") if key == "fleet:all"]

    assert retried([T + 600_500]) == retried([T + 599_999, T + 600_500]) == ["tc"]
