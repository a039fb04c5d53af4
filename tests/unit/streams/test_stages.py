"""The stages' routing: the identities their outputs carry to the window book."""

import pytest

from streams.settings import StreamsSettings
from streams.signals.book import TOTAL
from streams.stages import SUB_INDEX, Stages

T = 1_700_000_000_000


def _step(rid: str, steps: int, t: int) -> dict:
    return {"k": "step", "rid": rid, "step": 1, "steps": steps, "o": "ok", "t": t, "tn": "acme"}


@pytest.mark.parametrize("pair", [0, 999, 1000, 3500])
def test_a_sweep_and_the_record_before_it_never_share_an_identity(pair):
    """A by-task record of up to 500 KB holds thousands of payloads; the ``pair``-th one's
    outputs start at index ``pair * SUB_INDEX``. Sweep outputs used index 1,000,000 of the same
    source and offset, so at pair 1000 a task closed by the record and one the sweep timed out
    had one identity, and the window book dropped the second."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.ingest("k", 0, 1, "acme/B", _step("b1", 2, T))  # task B: step 1 of 2, then silence
    offset, now = 7, T + 200_000
    sends = stages.ingest("k", 0, offset, "acme/A", _step("a1", 1, now), pair * SUB_INDEX)
    sends += stages.sweep_tasks(["acme/B"], now, 0)
    fleet = [send.value for send in sends if send.key == "fleet:all"]
    assert [obs["o"] for *_identity, obs in fleet] == ["succeeded", "timed_out"]
    assert len({tuple(identity) for *identity, _obs in fleet}) == 2
    for send in sends:
        stages.observe(0, send.key, [send.value])
    total = stages.window_book.snapshots("fleet:all", now)[-1][2]
    assert (total["tasks_closed"], total["tasks_succeeded"], total["tasks_timed_out"]) == (2, 1, 1)


def test_a_close_due_before_the_sweep_before_it_is_counted_not_taken_for_seen():
    """A task's close has the identity of the task and its close time, which the window book
    expects to grow from one sweep to the next; a task heard of late (its last step more than
    the idle timeout behind the partition's event time) closes behind an earlier close."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.ingest("k", 0, 0, "acme|A", _step("a1", 2, T + 200_000))  # due at T + 320 s
    first = stages.sweep_tasks(["acme|A"], T + 400_000, 0)
    stages.ingest("k", 0, 1, "acme|B", _step("b1", 2, T + 100_000))  # due at T + 220 s
    second = stages.sweep_tasks(["acme|B"], T + 401_000, 0, after_ms=T + 400_000)
    assert {send.value[0] for send in first} == {"k0:sweep"}
    assert {send.value[0] for send in second} == {"k0:late"}
    for send in first + second:
        stages.observe(0, send.key, [send.value])
    total = stages.window_book.snapshots("fleet:all", T + 401_000)[-1][2]
    assert (total["tasks_closed"], total["tasks_timed_out"]) == (2, 2)


def test_a_worker_silent_past_the_scope_retention_leaves_the_fleet_view():
    """A worker gone for good (scaled in, or a pod whose id never comes back) was published in
    the fleet view at every tick for as long as the streams ran: a series set per worker ever
    seen. It goes once silent for ``scope_retention_s`` (an hour), as an idle scope key does."""
    from schemas.events import WorkerStatus

    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    for worker, t in (("w-gone", T), ("w-new", T + 3_600_000)):
        stages.worker_book.heartbeat(WorkerStatus(
            event_time_ms=t, worker_id=worker, slot=0, pool="h100@m", gpu_type="h100",
            models_loaded=["m"], started_ms=t))

    def published(now_ms: int) -> list[str]:
        return sorted(s.key for s in stages.fleet_view(None, now_ms))

    assert published(T + 3_600_000) == ["w-gone", "w-new"]
    assert published(T + 3_600_001) == ["w-new"]


def _fleet_total_after(batches) -> dict:
    """fleet:all's running total once ``batches`` (lists of (scope key, items) applied as the
    app's windows stage does a batch) are observed on by-scope partition 0."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    for batch in batches:
        for key, items in batch:
            stages.observe(0, key, items)
    return stages.window_book.snapshots("fleet:all", T + 3_700_000)[-1][2]


def test_a_total_idle_past_the_retention_restarts_however_the_records_were_batched():
    """A worker heard once, then after more than an hour (``scope_retention_s``) of silence
    another: fleet:all's total kept the first worker's time when both came in one batch, and
    lost it when the second's came in a batch of their own behind its ``worker:`` key, which
    moved the partition's event time on and forgot fleet:all as idle first (1 run in 12 of
    ``tests/integration/test_streams_gone_workers.py``). Its total restarts either way."""
    def heartbeats(worker: str, t: int, offset: int) -> list[list]:
        return [["t0", offset + i, 0, {"k": "h", "t": t + i * 1000, "w": worker, "dt": float(i > 0),
                                        "busy": 0, "usd": 0.0, "pq": 0, "ph": 0, "run": 0,
                                        "wait": 0, "kvu": 0, "kvf": 0}] for i in range(5)]

    gone, live = heartbeats("gone", T, 0), heartbeats("live", T + 3_660_000, 5)
    together = _fleet_total_after([[("worker:live", live), ("fleet:all", gone + live)]])
    apart = _fleet_total_after([[("fleet:all", gone)],
                                [("worker:live", live), ("fleet:all", live)]])
    assert together["provisioned_s"] == apart["provisioned_s"] == 4.0
    assert together["workers"] == apart["workers"] == 1


def _heartbeat_obs(offset: int, t: int) -> list:
    return ["t0", offset, 0, {"k": "h", "t": t, "w": "w", "dt": 1.0, "busy": 0, "usd": 0.0,
                              "pq": 0, "ph": 0, "run": 0, "wait": 0, "kvu": 0, "kvf": 0}]


def test_observations_applied_together_are_each_late_only_behind_those_read_before_them():
    """Two heartbeats of one worker 31 s apart: read one at a time, neither is late; applied
    in one batch, the first was judged against the second's time, more than the allowed
    lateness (30 s) behind it: out of its window, counted as late, the rates' span cut short."""
    together = Stages(StreamsSettings(), {}, {}, {}, {})
    together.observe(0, "worker:w", [_heartbeat_obs(0, T), _heartbeat_obs(1, T + 31_000)])
    apart = Stages(StreamsSettings(), {}, {}, {}, {})
    for offset, t in ((0, T), (1, T + 31_000)):
        apart.observe(0, "worker:w", [_heartbeat_obs(offset, t)])
    for stages in (together, apart):
        assert "late_events" not in stages.window_book.table[f"worker:w|{TOTAL}"]["b"]["c"]
    assert together.window_book.snapshots("worker:w", T + 31_000) == \
        apart.window_book.snapshots("worker:w", T + 31_000)


def test_a_key_is_forgotten_only_once_no_observation_on_time_could_continue_its_total():
    """A worker heard at T, then fleet:all (its partition's) at an hour and 5 s, then the
    worker again at an hour less 10 s: on time (within the allowed 30 s) and less than
    ``scope_retention_s`` after its last, so its running total goes on. The look for idle keys
    at fleet:all's time forgot the worker: its total lost its first hour where a batch ended
    between the worker's two observations (one record at a time, as here), and kept it where
    one batch held both (grouped by key, they were applied before fleet:all's)."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    hour = 3_600_000
    stages.observe(0, "worker:w", [_heartbeat_obs(0, T)])
    stages.observe(0, "fleet:all", [_heartbeat_obs(1, T + hour + 5_000)])
    stages.observe(0, "worker:w", [_heartbeat_obs(2, T + hour - 10_000)])
    assert stages.window_book.snapshots("worker:w", T + hour)[-1][2]["provisioned_s"] == 2.0


@pytest.mark.parametrize("swept", [True, False])
def test_a_charge_read_past_its_closed_tasks_retention_opens_no_task_swept_or_not(swept):
    """Task A closed at T; task B's step at T + 601 s moves the partition past A's retention
    (600 s); then a charge of A's arrives. It is taken as for a forgotten task whether or not
    the sweep forgot A yet, and a charge opens no task: it counts as attributed spend and task
    cost (``ch``, ``tl``). Before, it opened a task of its own, which never ran and was counted
    timed out 120 s later."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.ingest("k", 0, 0, "acme|A", _step("a1", 1, T))
    stages.ingest("k", 0, 1, "acme|B", _step("b1", 2, T + 601_000))
    if swept:
        stages.sweep_tasks(["acme|A"], T + 601_000, 0)
    charge = {"k": "cost", "rid": "a1", "a": 1, "usd": 0.5, "t": T + 1_000, "tn": "acme",
              "w": "w"}
    kinds = [send.value[3]["k"] for send in stages.ingest("k", 0, 2, "acme|A", charge)]
    assert kinds == ["ch", "ch", "tl", "tl"]  # (tenant:acme and fleet:all)
    assert stages.sweep_tasks(["acme|A"], T + 900_000, 0, after_ms=T + 601_000) == []
    assert "acme|A" not in stages.task_book.table


@pytest.mark.parametrize("closed", [None, "succeeded"])
def test_a_charge_of_a_task_open_or_closed_within_its_retention_counts_for_it(closed):
    """A charge of a task still open counts in its close (``tc``); one of a task closed less
    than its retention (600 s) before counts as its cost after the close (``tl``)."""
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.ingest("k", 0, 0, "acme|A", _step("a1", 1 if closed else 2, T))
    charge = {"k": "cost", "rid": "a1", "a": 1, "usd": 0.5, "t": T + 100_000, "tn": "acme",
              "w": "w"}
    kinds = [send.value[3]["k"] for send in stages.ingest("k", 0, 1, "acme|A", charge)]
    assert kinds == (["ch", "ch", "tl", "tl"] if closed else ["ch", "ch"])
    entry = stages.task_book.table["acme|A"]
    assert (entry["o"], entry["usd"]) == (closed, 0.5)


def test_a_replay_relays_an_observation_under_its_first_identity_whatever_the_books_held():
    """A request's completion relays its observation to its worker after the end of its
    attempt; a crash's replay of the completion after the request was forgotten has no attempt
    to end. Its relayed observation's index was its place among all the record's outputs, one
    less in the replay: held again for a worker not heard from yet (another identity), and
    counted twice in ``pool_observations_dropped`` once the worker was forgotten."""
    from schemas.events import Completed, Queued, Started

    common = dict(request_id="r1", tenant="acme", model="m", created_ms=T)
    records = [Queued(event_time_ms=T, prompt_tokens=10, max_tokens=20, **common),
               Started(event_time_ms=T + 10, worker_id="w-1", **common),
               Completed(event_time_ms=T + 110, worker_id="w-1", prompt_tokens=10,
                         output_tokens=20, e2e_s=0.11, **common)]
    stages = Stages(StreamsSettings(), {}, {}, {}, {})

    def relayed(offset: int) -> list:
        return [send.value["org"] for send in stages.ingest("t", 0, offset, "r1", records[offset])
                if send.route == "worker" and send.value["k"] == "obs"]

    first = [relayed(offset) for offset in range(3)]
    assert stages.sweep_requests(["r1"], T + 3_600_000) == ["r1"]  # forgotten, then replayed:
    assert relayed(2) == first[2]


def test_a_tombstone_lasts_as_long_as_a_replay_may_read_behind_its_partition():
    """A crash's replay reads up to the allowed lateness (up to an hour) plus the commit
    interval behind its partition's event time. The tombstone of a worker forgotten unheard
    lasted ``UNHEARD_S`` (300 s) whatever the lateness: a replay later than that held what the
    worker had given up anew and counted it given up twice."""
    from streams.signals.workers import UNHEARD_S

    settings = StreamsSettings(allowed_lateness_s=3600)
    book = Stages(settings, {}, {}, {}, {}).worker_book
    obs = {"k": "obs", "obs": {"k": "s", "t": T, "a": 1}, "org": ["r0:w-1", 1, 0]}
    book.relay("w-1", obs)
    forgotten_at = T + int(UNHEARD_S * 1000) + 1
    outs = book.expire("w-1", forgotten_at)
    replayed_at = forgotten_at + 3_601_000  # the lateness and the 1 s commit interval behind
    outs += book.relay("w-1", obs, replayed_at)
    outs += book.expire("w-1", replayed_at + int(UNHEARD_S * 1000) + 1)
    assert sum(out.payload["held"] for out in outs
               if out.key == "fleet:all" and out.payload["k"] == "lost") == 1
    assert "w-1" not in book.table  # the tombstone went in the end


def test_a_replay_gives_a_heartbeats_observations_their_first_identities_whatever_was_held():
    """A worker's first heartbeat sends on what was relayed to it before (held: its pool was
    not known), under their own identities, between its own observations: its ``model:``
    observation's index was its place among all the heartbeat's outputs, one more when the
    relay was read before it. A crash's replay, reading the by-worker partition before the
    telemetry one where the first run read it after, sent that observation under a higher
    identity than the one counted, and the window book counted the heartbeat twice (its
    prefix-cache queries and hits) when it was its partition's last record counted."""
    from schemas.events import Started, WorkerStatus

    started = Started(event_time_ms=T, request_id="r1", tenant="acme", model="m", created_ms=T,
                      worker_id="w-1")
    [relay] = [send.value for send in Stages(StreamsSettings(), {}, {}, {}, {}).ingest(
        "t", 0, 0, "r1", started) if send.route == "worker"]
    heartbeat = WorkerStatus(event_time_ms=T + 500, worker_id="w-1", slot=0, pool="h100@m",
                             gpu_type="h100", models_loaded=["m"], started_ms=T)

    def heartbeat_identities(first: str) -> dict:
        """The heartbeat's observations' identities by scope key, its relay read ``first`` or
        after it, by a worker starting from the books as they were before both."""
        stages = Stages(StreamsSettings(), {}, {}, {}, {})
        reads = {"relay": lambda: stages.ingest("w", 0, 0, "w-1", relay),
                 "heartbeat": lambda: stages.ingest("t", 0, 1, "w-1", heartbeat)}
        sends = [send for name in (first, *(set(reads) - {first})) for send in reads[name]()]
        return {send.key: send.value[:3] for send in sends
                if send.route == "scope" and send.value[0] == "t0"}

    assert heartbeat_identities("heartbeat") == heartbeat_identities("relay")
