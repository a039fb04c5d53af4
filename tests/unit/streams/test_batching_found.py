"""What the batching property (``test_batching_property``) found, each as the smallest run of the
app's agents (or book) that shows it: a batch, or a crash's replay, that counts otherwise than
the records one at a time. Each was fixed; what the property still leaves out of its comparison
is in its ``_REPLAYABLE``."""

import asyncio

import orjson

from schemas.codec import encode
from schemas.events import WorkerStatus
from streams.signals.book import WindowBook, WindowPolicy
from streams.signals.workers import UNHEARD_S, WorkerBook
from streams.stages import partition_of
from test_app_failures import NS, T, Batches, Producer, app, event

CLOCK = T + 86_400_000  # after every event: none is refused as stamped ahead
WINDOWS = f"{NS}.streams-windows-changelog"
WORKERS = f"{NS}.streams-workers-changelog"
TIMES = f"{NS}.streams-times-changelog"


def _restored(tmp_path, producer: Producer, **changelogs: list):
    """A new worker, given each table named as the changelog records that landed hold it."""
    streams = app(tmp_path, producer, clock=lambda: CLOCK)
    for table, changelog in changelogs.items():
        store = streams.tables[table].data
        for key, value, partition in changelog:
            store[orjson.loads(key)] = orjson.loads(value)
            store._key_partition[orjson.loads(key)] = partition
    return streams


def test_an_observation_relayed_again_to_a_worker_not_heard_from_is_held_once():
    """A replay relayed an observation again to a worker whose first heartbeat was not read yet
    (its entry, written back, held the observation already): it was held twice, and the worker,
    forgotten unheard, counted both in ``pool_observations_dropped`` (the property: 5 for 3)."""
    table: dict = {}
    book = WorkerBook(table, {"h100": 3.6})
    relayed = {"k": "obs", "obs": {"k": "s", "t": T, "a": 1}, "org": ["r0:w-0", 1, 3]}
    book.relay("w-0", relayed)
    table["w-0"] = orjson.loads(orjson.dumps(table["w-0"]))  # as the changelog restores it
    book.relay("w-0", orjson.loads(orjson.dumps(relayed)))  # the replay's
    lost = book.expire("w-0", T + int(UNHEARD_S * 1000) + 1)
    assert [(out.key, out.payload["held"]) for out in lost] == [("worker:w-0", 1),
                                                                 ("fleet:all", 1)]


def _by_scope(partition: int, offset: int, pairs: list):
    return event(f"{NS}.streams.by-scope", partition, offset, orjson.dumps(pairs))


def test_a_write_back_cut_anywhere_leaves_the_replay_on_time(tmp_path):
    """One batch of by-scope records, 40 s apart in event time, each on time as it arrived. Its
    write-back is cut after each of its records in turn (a producer batch landed, the next did
    not, and the worker died), and the batch replayed from the committed offset: it counts as
    the batch did. Before 7 Dec the partition's watermark (``~wm|p``, staged first) was written
    first: cut after it, the replay found the watermark of the batch's end and no trace of its
    observations, and judged the first one late: out of the windows, ``late_events`` one up
    (the property: model and tenant keys of a request whose completion came 40 s after its
    queueing, crashed in the windows' write-back)."""
    key = "tenant:acme"
    partition = partition_of(key, 4)
    batch = [_by_scope(partition, 0, [[key, ["t0", 0, 0, {"k": "q", "t": T}]]]),
             _by_scope(partition, 1, [[key, ["t0", 1, 0, {"k": "q", "t": T + 40_000}]]])]
    producer = Producer()
    first = app(tmp_path / "first", producer, clock=lambda: CLOCK)
    asyncio.run(first._window_agent(Batches(batch)))
    written = list(producer.sent[WINDOWS])
    counted = first.tables["windows"].data[f"{key}|total"]["b"]["c"]
    replayed = []
    for cut in range(1, len(written)):
        second = _restored(tmp_path / f"cut-{cut}", producer, windows=written[:cut])
        asyncio.run(second._window_agent(Batches(batch)))
        replayed.append(second.tables["windows"].data[f"{key}|total"]["b"]["c"])
    assert replayed == [counted] * (len(written) - 1)


def heartbeat(worker_id: str, t: int, offset: int = 0):
    message = WorkerStatus(event_time_ms=t, worker_id=worker_id, slot=0, pool="h100@m",
                           gpu_type="h100", models_loaded=["m"], started_ms=T)
    return event(f"{NS}.telemetry", partition_of(worker_id, 4), offset, encode(message),
                 worker_id.encode())


def test_a_restarted_worker_charges_a_relayed_end_as_the_crashed_one_would(tmp_path):
    """w-0 heart-beat at T; w-1, on its telemetry partition, 5.5 s later: w-0 had gone silent
    by its partition's event time. Its attempt's end, relayed then, is charged at once (the
    relay expires the worker at that time first). A worker that crashed after the heartbeats'
    offsets were committed and before the relay's restarts with the tables, the partition's
    event time (the ``times`` table) among them, and charges it at once too. Before 7 Dec the
    event times were kept in memory only: the new worker had none for the partition, the relay
    waited for its next record or sweep (an idle sweep: at least the allowed lateness later),
    and the charge reached the windows late (the property: ``late_events`` two up on
    ``fleet:all`` and the tenant, the charge's ``ch`` and ``tl``)."""
    assert partition_of("w-0", 4) == partition_of("w-1", 4)
    partition = partition_of("w-0", 4)
    end = {"k": "end", "rid": "r2", "task": "r2", "tn": "acme", "a": 1, "s": T + 5_510,
           "e": T + 5_710}
    obs = {"k": "obs", "obs": {"k": "s", "t": T + 5_510, "a": 1}, "org": ["r0:w-0", 1, 3]}
    relay = event(f"{NS}.streams.by-worker", partition, 0,
                  orjson.dumps([["w-0", end], ["w-0", obs]]))
    producer = Producer()
    first = app(tmp_path / "first", producer, clock=lambda: CLOCK)
    asyncio.run(first._ingest_agent(Batches([heartbeat("w-0", T), heartbeat("w-1", T + 5_500)])))
    written = {"workers": list(producer.sent[WORKERS]), "times": list(producer.sent[TIMES])}
    asyncio.run(first._ingest_agent(Batches([relay])))
    charged = producer.sent.pop(f"{NS}.streams.by-task", [])
    assert charged  # the crashed worker's
    second = _restored(tmp_path / "second", producer, **written)
    asyncio.run(second._ingest_agent(Batches([relay])))
    assert producer.sent.pop(f"{NS}.streams.by-task", []) == charged


def test_a_workers_sweep_sees_the_entry_its_batch_created(tmp_path):
    """An observation relayed to w-0, never heard from, then w-1's heartbeat 400 s later on the
    same telemetry partition: its sweep forgets w-0 (nothing relayed to it for ``UNHEARD_S``),
    counting the observation it held as ``pool_observations_dropped`` at that time, when the two
    records come in two batches. In one batch the sweep listed the partition's keys from the
    table's store, which holds what earlier batches wrote back and not w-0, staged by this one:
    w-0 was kept, and forgotten by its next heartbeat or sweep instead, whose later time put
    the count in another running total (the property: after an hour's gap, in none), or its
    relayed ``lost`` late."""
    assert partition_of("w-0", 4) == partition_of("w-1", 4)
    relay = event(f"{NS}.streams.by-worker", partition_of("w-0", 4), 0, orjson.dumps(
        [["w-0", {"k": "obs", "obs": {"k": "s", "t": T, "a": 1}, "org": ["r0:w-0", 1, 3]}]]))
    later = heartbeat("w-1", T + int(UNHEARD_S * 1000) + 100_000)
    kept = []
    for batches in ([[relay], [later]], [[relay, later]]):
        streams = app(tmp_path / str(len(batches)), Producer(), clock=lambda: CLOCK)
        asyncio.run(streams._ingest_agent(Batches([heartbeat("w-1", T)])))
        asyncio.run(streams._ingest_agent(Batches(*batches)))
        kept.append({key: "held" in entry for key, entry in streams.tables["workers"].data.items()})
    assert kept == [{"w-0": False, "w-1": False}] * 2  # w-0: a tombstone (nothing held)


def test_a_batch_forgets_no_key_whose_observation_it_read_in_time(tmp_path):
    """tenant:b, then tenant:c 3,599 s after its last observation (within
    ``scope_retention_s``: its running total goes on), then tenant:b 300 s later, on one
    by-scope partition. One at a time, tenant:c's total counts both; in one batch too, which
    the window stage applies grouped by key, tenant:b's first (its first came first), and
    forgets the keys idle only after every group. Before 7 Dec it forgot them after each
    group: tenant:b's newest moved the partition's event time on, and tenant:c, idle at that
    time, was forgotten before its observation was applied, which started a new total (the
    property: a tenant's total lost the 3 events before an hour's gap)."""
    assert partition_of("tenant:b", 4) == partition_of("tenant:c", 4)
    partition = partition_of("tenant:b", 4)

    def observed(offset: int, key: str, t_s: int):
        item = ["t0", offset, 0, {"k": "q", "t": T + t_s * 1000}]
        return _by_scope(partition, offset, [[key, item]])

    first = [observed(0, "tenant:c", 0)]
    batch = [observed(1, "tenant:b", 40), observed(2, "tenant:c", 3_599),
             observed(3, "tenant:b", 3_899)]
    totals = []
    for batches in ([first, *[[record] for record in batch]], [first, batch]):
        streams = app(tmp_path / str(len(batches)), Producer(), clock=lambda: CLOCK)
        asyncio.run(streams._window_agent(Batches(*batches)))
        totals.append(streams.tables["windows"].data["tenant:c|total"]["b"]["c"])
    assert totals[1] == totals[0] == {"queued": 2.0, "events": 2.0}


def test_an_observation_replayed_to_a_worker_forgotten_unheard_is_counted_dropped_once():
    """w-1, never heard from, holds an observation relayed to it; its partition's event time
    passes ``UNHEARD_S`` beyond it and the sweep forgets w-1, counting the observation in
    ``pool_observations_dropped``. The worker crashes before the by-worker record's offset is
    committed (up to the allowed lateness of wall time behind, should commits fail): the replay
    relays the observation again, and the tombstone w-1 left (``UNHEARD_S`` long) drops it.
    Before 7 Dec it found no entry, held it anew and counted it again when forgotten (the
    property: 3 for 2; an attempt end likewise in ``attempts_uncharged``: ``test_workers``).
    A scope key forgotten (``Stages.forget_idle``) is idle an hour behind the allowed lateness
    before its partition's watermark, which its changelog restores: an observation of it that a
    replay applies again is late, and starts a total of its own that is idle, so not published,
    and forgotten again at the next look (or, with a late observation after it, a total that
    says ``late_events``, left to the batching as that docstring says)."""
    table: dict = {}
    book = WorkerBook(table, {"h100": 3.6})
    relayed = {"k": "obs", "obs": {"k": "s", "t": T, "a": 1}, "org": ["r0:w-1", 1, 3]}
    forgotten_at = T + int(UNHEARD_S * 1000) + 1
    lost = book.relay("w-1", relayed) + book.expire("w-1", forgotten_at)
    lost += book.relay("w-1", relayed, forgotten_at)  # the replay's, at the partition's time
    lost += book.expire("w-1", forgotten_at + int(UNHEARD_S * 1000) + 1)
    assert sum(out.payload["held"] for out in lost
               if out.key == "worker:w-1" and out.payload["k"] == "lost") == 1


def test_a_total_restarted_after_an_idle_gap_drops_a_replay_of_what_came_before():
    """An observation of tenant:a, then one ``scope_retention_s`` later, which starts a new
    running total (the first is forgotten). A crash's replay of the first (its by-scope record
    read again from the committed offset) is dropped as seen: one at a time, the new total
    counts the second alone. Before 7 Dec the new total started with no identities and counted
    the replay again: late, which the property leaves out, or on time where the crash left the
    partition's watermark behind its keys (the property: ``model:m``'s total held a request's 4
    events from before an hour's gap again)."""
    book = WindowBook({}, WindowPolicy(windows_s=(10,), allowed_lateness_s=30))
    first = ["t0", 0, 0, {"k": "q", "t": T}]
    later = T + int(book.policy.idle_retention_ms) + 1_000
    book.observe_many("tenant:a", [first], T)
    book.observe_many("tenant:a", [["t1", 0, 0, {"k": "q", "t": later}]], later)
    counted = []
    for watermark in (later, T):  # the replay's, behind the watermark, and as the crash left it
        book.observe_many("tenant:a", [first], later, [watermark])
        counted.append(book.table["tenant:a|total"]["b"]["c"])
    assert counted == [{"queued": 1.0, "events": 1.0}] * 2
