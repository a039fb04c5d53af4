"""The sweeps of partitions no record reaches any more, run from the app's timer, without a
broker (the stand-ins of ``test_app_failures``)."""

import asyncio
import time

import orjson
from faust.types import TP

from schemas.codec import encode
from schemas.events import Completed, Queued, Started, WorkerStatus
from streams.app import StreamsApp
from streams.membership import Membership
from streams.stages import partition_of
from test_app_failures import NS, T, Batches, Producer, app, by_task, event, step


def assign(streams: StreamsApp, topic: str, *partitions: int, caught_up: bool = True) -> None:
    """Give the app ``partitions`` of ``topic``, read to their end (or not), its membership
    confirmed by a heartbeat the broker acknowledged just now."""
    streams.app.assignor.assigned_actives = lambda: {TP(topic, p) for p in partitions}
    streams.membership.acknowledged(time.monotonic())

    async def read_to_end(_consumer, _tp):
        return caught_up

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
    def __init__(self, end, read, position):
        self.end, self._read_offset, self._position = end, {"tp": read}, position

    def highwater(self, _tp):
        return self.end

    async def position(self, _tp):
        return self._position


def test_a_partition_is_read_to_its_end_when_its_last_record_was_delivered():
    caught_up = StreamsApp._caught_up
    assert asyncio.run(caught_up(Consumer(10, 9, 10), "tp"))
    assert not asyncio.run(caught_up(Consumer(10, 8, 10), "tp"))  # fetched, not delivered
    assert asyncio.run(caught_up(Consumer(10, None, 10), "tp"))  # nothing since assigned
    assert not asyncio.run(caught_up(Consumer(10, None, 7), "tp"))
    assert not asyncio.run(caught_up(Consumer(10, 9, 9), "tp"))  # sought back to 9: unread
    assert not asyncio.run(caught_up(Consumer(None, None, 7), "tp"))  # no fetch yet
