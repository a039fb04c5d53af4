"""The streams' running totals do not depend on how the records were batched, nor on a crash's
replay: a property test.

A generated stream of heartbeats (two workers) and request lifecycles (three tenants, two tasks
of three steps, completed, failed or requeued and completed on the other worker), with event-time
gaps across the bounds that matter (the allowed lateness, the sweeps' intervals, the task idle
timeout, the request retention, ``scope_retention_s`` and the workers' retention), goes through
the app's real agents (``streams.app``, with the stand-ins of ``test_app_failures`` for Faust's
stream and producer) once a record at a time and once in batches of random sizes, each topic's
records after the one before (the same order of arrival in both); every scope key's published
running total must be the same. Then the batched run's worker crashes: a new one, given the
tables as written back, reads each telemetry partition again from a record within the allowed
lateness of its end, and the totals must not change.
"""

import asyncio
import math
import random
from collections import defaultdict

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from schemas.codec import encode
from schemas.events import Completed, Failed, FirstToken, Queued, Requeued, Started, WorkerStatus
from streams.stages import partition_of
from streams.app import StreamsApp
from streams.worker import settings_for
from test_app_failures import NS, T, Batches, Producer, event

#: Event-time gaps between the stream's moves: within a second, across a workers' sweep (5 s),
#: the allowed lateness (30 s), the forget interval (60 s), the task idle timeout (120 s), the
#: request retention (300 s), ``scope_retention_s`` (an hour) and the workers' (65 minutes).
GAPS_MS = (0, 300, 1_000, 5_500, 31_000, 61_000, 121_000, 301_000, 3_601_000, 3_901_000)
WORKERS = (("w-0", "h100"), ("w-1", "a100"))
CLOCK = T + 30 * 86_400_000  # after every event: none is refused as stamped ahead


def _heartbeats(t: int, worker: int, count: int, running: int) -> list:
    worker_id, gpu = WORKERS[worker]
    return [WorkerStatus(event_time_ms=t + i * 1000, worker_id=worker_id, slot=worker,
                         pool=f"{gpu}@m", gpu_type=gpu, models_loaded=["m"], running=running,
                         started_ms=T) for i in range(count)]


def _request(t: int, n: int, tenant: int, worker: int, task: tuple | None, outcome: str,
             run_ms: int) -> list:
    worker_id = WORKERS[worker][0]
    task_id, step = task or (None, 1)
    common = dict(request_id=f"r{n}", tenant=f"tenant-{tenant}", model="m", created_ms=t,
                  task_id=task_id)
    events = [Queued(event_time_ms=t, prompt_tokens=10, max_tokens=20, step=step,
                     steps_total=3 if task_id else 1, **common),
              Started(event_time_ms=t + 10, worker_id=worker_id, **common)]
    attempt, begin = 1, t + 10
    if outcome == "requeued":
        events.append(Requeued(event_time_ms=t + 50, worker_id=worker_id, tokens_done=0,
                               **common))
        worker_id, attempt, begin = WORKERS[1 - worker][0], 2, t + 60
        events.append(Started(event_time_ms=begin, worker_id=worker_id, attempt=2, **common))
    end = begin + run_ms
    if outcome == "failed":
        return events + [Failed(event_time_ms=end, reason="engine_error", worker_id=worker_id,
                                **common)]
    return events + [
        FirstToken(event_time_ms=begin + run_ms // 2, worker_id=worker_id, attempt=attempt,
                   ttft_s=(begin + run_ms // 2 - t) / 1000, **common),
        Completed(event_time_ms=end, worker_id=worker_id, attempt=attempt, prompt_tokens=10,
                  output_tokens=20, e2e_s=(end - t) / 1000, **common)]


_MOVES = st.one_of(
    st.tuples(st.just("heartbeats"), st.integers(0, 1), st.integers(1, 4), st.integers(0, 2)),
    st.tuples(st.just("request"), st.integers(0, 2), st.integers(0, 1),
              st.sampled_from([None, "task-0", "task-1"]),
              st.sampled_from(["completed", "failed", "requeued"]),
              st.sampled_from([200, 2_000, 40_000])))


@st.composite
def streams_of_events(draw) -> list:
    """A stream of telemetry in event-time order."""
    t, events, steps = T, [], defaultdict(int)
    for n in range(draw(st.integers(1, 14))):
        t += draw(st.sampled_from(GAPS_MS))
        move = draw(_MOVES)
        if move[0] == "heartbeats":
            events += _heartbeats(t, *move[1:])
            continue
        _, tenant, worker, task_id, outcome, run_ms = move
        task = None
        if task_id is not None and steps[task_id] < 3:
            steps[task_id] += 1
            task = (task_id, steps[task_id])
        events += _request(t, n, tenant, worker, task, outcome, run_ms)
    return sorted(events, key=lambda m: m.event_time_ms)


def _brief(messages: list) -> list[str]:
    """The stream, a line per event (for a failing example)."""
    return [f"{m.event_time_ms - T:>9} {m.type} {getattr(m, 'worker_id', '')} "
            f"{getattr(m, 'request_id', '')} {getattr(m, 'tenant', '')} "
            f"{getattr(m, 'task_id', '') or ''}" for m in messages]


def _records(messages: list) -> list[tuple[bytes, bytes, int]]:
    out = []
    for m in messages:
        key = m.worker_id if isinstance(m, WorkerStatus) else m.request_id
        out.append((key.encode(), encode(m), partition_of(key, 4)))
    return out


class _Run:
    """The app's agents over stand-ins for Faust's streams and producer: each topic's records
    are taken in batches of ``batch_sizes()`` records, topic after topic, until nothing is
    left. Offsets go on per topic and partition, across a restart too."""

    def __init__(self, batch_sizes, tmp_path) -> None:
        self.batch_sizes, self.tmp_path = batch_sizes, tmp_path
        self.producer = Producer()
        self.offsets: dict = defaultdict(int)
        self.streams = self._app()

    def _app(self) -> StreamsApp:
        streams = StreamsApp(settings_for(NS, "127.0.0.1:1"),
                             datadir=self.tmp_path, clock=lambda: CLOCK)
        streams._producer = lambda: self.producer
        return streams

    def restart(self) -> None:
        """A new worker, which Faust gives the tables as their changelogs hold them (all
        written back: every batch's sends were acknowledged) and nothing else."""
        old, self.streams = self.streams, self._app()
        for name, table in old.tables.items():
            self.streams.tables[name].data.update(table.data)
            self.streams.tables[name].data._key_partition.update(table.data._key_partition)

    def feed(self, messages: list, replayed_ms: int | None = None) -> None:
        """Telemetry ``messages`` at their own offsets, and everything they cause; or, given
        ``replayed_ms``, those of each partition from the first as recent as that before its
        newest (a replay from the last committed offsets, which a worker commits every second:
        within the allowed lateness of the end, as the windows expect of a takeover)."""
        streams, topic = self.streams, f"{NS}.telemetry"
        agents = {topic: streams._ingest_agent, streams.names["worker"]: streams._ingest_agent,
                  streams.names["task"]: streams._task_agent,
                  streams.names["scope"]: streams._window_agent}
        records = _records(messages)
        newest: dict = defaultdict(int)
        for m, (_key, _value, partition) in zip(messages, records):
            newest[partition] = max(newest[partition], m.event_time_ms)
        at: dict = defaultdict(int)
        events, replaying = [], set()
        for m, (key, value, partition) in zip(messages, records):
            if replayed_ms is None or m.event_time_ms >= newest[partition] - replayed_ms:
                replaying.add(partition)
            if partition in replaying:
                events.append(event(topic, partition, at[partition], value, key))
            at[partition] += 1

        async def run() -> None:
            pending = {topic: events}
            while pending:
                for name, queued in pending.items():
                    await agents[name](Batches(*self._batches(queued)))
                sent = self.producer.sent
                pending = {name: self._events(name, sent.pop(name)) for name in agents
                           if sent.get(name)}

        asyncio.run(run())

    def _events(self, topic: str, sent: list) -> list:
        out = []
        for key, value, partition in sent:
            out.append(event(topic, partition, self.offsets[(topic, partition)], value, key))
            self.offsets[(topic, partition)] += 1
        return out

    def _batches(self, events: list) -> list:
        out = []
        while events:
            size = self.batch_sizes()
            out.append(events[:size])
            events = events[size:]
        return out

    def totals(self) -> dict:
        """Every scope key's running total, as published."""
        windows = set(self.streams.settings.windows_s)
        return {(s.scope, s.key): s.values
                for s in self.streams.stages.snapshots(None, CLOCK) if s.window_s not in windows}


@settings(max_examples=100, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=streams_of_events(), seed=st.integers(0, 2**32 - 1),
       largest=st.sampled_from([2, 5, 40]))
def test_the_running_totals_do_not_depend_on_the_batching(tmp_path, messages, seed, largest):
    note(_brief(messages))
    one = _Run(lambda: 1, tmp_path)
    one.feed(messages)
    one_at_a_time = one.totals()
    rng = random.Random(seed)
    batched = _Run(lambda: rng.randint(1, largest), tmp_path)
    batched.feed(messages)
    late = {key for key, values in one_at_a_time.items() if values.get("late_events")}
    assert _differences(_without(batched.totals(), late), _without(one_at_a_time, late)) == {}
    batched.restart()  # a crash, then its replay
    batched.feed(messages, replayed_ms=rng.randint(0, 30_000))
    assert _differences(_without(batched.totals(), late), _without(one_at_a_time, late)) == {}


def _differences(batched: dict, one_at_a_time: dict) -> dict:
    """(scope, key) -> field -> (batched, one at a time), where they differ."""
    out = {}
    for key in batched.keys() | one_at_a_time.keys():
        have, want = batched.get(key, {}), one_at_a_time.get(key, {})
        fields = {name: (have.get(name), want.get(name)) for name in have.keys() | want.keys()
                  if not _same(have.get(name), want.get(name))}
        if fields:
            out[key] = fields
    return out


def _same(have: float | None, want: float | None) -> bool:
    """Equal but for rounding: a batch sums its observations into partials first, so floats
    add up in another order."""
    if have is None or want is None:
        return have == want
    return math.isclose(have, want, rel_tol=1e-9, abs_tol=1e-12)


def _without(totals: dict, late: set) -> dict:
    """``totals`` but those of the keys in ``late``, which counted an observation more than the
    allowed lateness behind their partition's newest: one less than ``scope_retention_s`` after
    its key's last continues the key's total, or starts a new one, by whether the key was
    forgotten before it, which is left to where the batches end (``Stages.forget_idle``); a
    forgotten key takes the identities of what it counted with it, so one replayed counts again.
    A key late only in the batched run is compared: whether an observation is late does not
    depend on the batching."""
    return {key: values for key, values in totals.items() if key not in late}
