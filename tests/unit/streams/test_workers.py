"""The worker book: provisioned spend, attribution by share of GPU time, deltas, fleet view."""

import copy
import random

import orjson
import pytest

from schemas.events import WorkerStatus
from schemas.limits import MAX_ATTEMPTS, MAX_ID_CHARS, MAX_NAME_CHARS, MAX_RECORD_BYTES
from streams.signals import window
from streams.signals.workers import HELD, PENDING, RETENTION_S, UNHEARD_S, WorkerBook

T = 1_700_000_000_000
PRICE_S = 3.6 / 3600  # $3.60 per GPU-hour: $0.001 per second


def _hb(t_s, running=0, waiting=0, state="warm", pq=0, ph=0, worker="w0", started_ms=T):
    return WorkerStatus(event_time_ms=T + int(t_s * 1000), worker_id=worker, slot=0,
                        pool="h100@m", gpu_type="h100", models_loaded=["m"], running=running,
                        waiting=waiting, state=state, prefix_cache_queries=pq,
                        prefix_cache_hits=ph, started_ms=started_ms)


def _end(rid, s, e, attempt=1):
    return {"k": "end", "rid": rid, "task": rid, "tn": "t", "a": attempt,
            "s": T + int(s * 1000), "e": T + int(e * 1000)}


def _obs(outs):
    return [o.payload for o in outs if o.route == "scope" and o.key == "worker:w0"]


def _costs(outs):
    return {o.payload["rid"]: o.payload["usd"] for o in outs if o.route == "task"}


@pytest.fixture
def book():
    return WorkerBook({}, {"h100": 3.6}, max_gap_s=5)


def test_spend_is_price_times_provisioned_time_and_silences_count_up_to_the_cap(book):
    first = _obs(book.heartbeat(_hb(0)))[0]
    second = _obs(book.heartbeat(_hb(0.5, running=1)))[0]
    third = _obs(book.heartbeat(_hb(1.5)))[0]
    after_gap = _obs(book.heartbeat(_hb(10)))[0]     # 8.5 s of silence: 5 s (the cap) counted
    assert first["dt"] == 0 and second["dt"] == 0.5 and third["dt"] == 1.0
    assert third["usd"] == pytest.approx(1.0 * PRICE_S)
    assert (second["busy"], third["busy"]) == (0, 1)  # sample and hold: state at the start
    assert after_gap["dt"] == 5 and after_gap["usd"] == pytest.approx(5 * PRICE_S)
    assert book.heartbeat(_hb(1.5)) == []            # an old heartbeat delivered late


def test_no_time_is_provisioned_across_a_restart_or_after_a_stop(book):
    book.heartbeat(_hb(0))
    book.heartbeat(_hb(0.5))
    restarted = _obs(book.heartbeat(_hb(2.5, started_ms=T + 2_000)))[0]  # a new run: no gap
    book.heartbeat(_hb(3, state="stopped", started_ms=T + 2_000))
    after_stop = _obs(book.heartbeat(_hb(4, started_ms=T + 2_000)))[0]
    assert restarted["dt"] == 0 and after_stop["dt"] == 0


def test_attempts_share_each_interval_equally_among_resident_requests(book):
    book.heartbeat(_hb(0, running=1))                   # 0-2 s: one resident
    book.relay("w0", _end("a", 0, 3))
    book.heartbeat(_hb(2, running=2))                   # 2-4 s: two residents
    outs = book.heartbeat(_hb(4, running=1, waiting=0))
    # a (0-3 s): 2 s alone + 1 s shared by two = 2.5 GPU-seconds.
    assert _costs(outs) == {"a": pytest.approx(2.5 * PRICE_S)}
    # b (2-4 s): 2 s shared by two = 1 GPU-second; a heartbeat at 4 s is known: settle now.
    outs = book.relay("w0", _end("b", 2, 4))
    assert _costs(outs) == {"b": pytest.approx(1.0 * PRICE_S)}
    # The same end re-sent later is charged again: the task book drops the repeat (by request
    # and attempt), so it counts once in task costs and attributed spend.
    assert _costs(book.relay("w0", _end("b", 2, 4))) == {"b": pytest.approx(1.0 * PRICE_S)}


def test_charges_wait_for_a_heartbeat_after_the_end_or_settle_when_the_worker_stops(book):
    book.heartbeat(_hb(0, running=1))
    assert book.relay("w0", _end("a", 0, 0.7)) == []    # no heartbeat at or after 0.7 s yet
    outs = book.heartbeat(_hb(0.5, running=1))
    assert _costs(outs) == {}
    book.relay("w0", _end("b", 0.5, 3.0))
    outs = book.heartbeat(_hb(1.0, state="stopped"))
    # a: 0-0.7 s alone; b: 0.5-1.0 s (the worker stopped at 1.0 s, nothing after).
    assert _costs(outs) == {"a": pytest.approx(0.7 * PRICE_S), "b": pytest.approx(0.5 * PRICE_S)}


def test_a_silent_worker_charges_up_to_its_last_heartbeat(book):
    book.heartbeat(_hb(0, running=1))
    book.heartbeat(_hb(1, running=1))
    assert book.relay("w0", _end("a", 0, 9)) == []      # read before later heartbeats? wait
    assert book.sweep(["w0"], T + 5_000) == []          # its partition is 4 s further: wait
    outs = book.sweep(["w0"], T + 6_500)                # 5.5 s with no heartbeat: gone
    assert _costs(outs) == {"a": pytest.approx(1.0 * PRICE_S)}


def test_a_duplicate_heartbeat_read_after_its_worker_went_silent_charges_what_waited(book):
    """Its partition's event time is past the worker's silence when a heartbeat of it is read
    again (redelivered): what waited on the worker is charged then, as its sweep would, and
    not lost (nothing is left waiting for the sweep)."""
    book.heartbeat(_hb(0, running=1))
    book.heartbeat(_hb(1, running=1))
    assert book.relay("w0", _end("a", 0, 9)) == []
    outs = book.heartbeat(_hb(1, running=1), T + 6_500)  # (5.5 s of silence)
    assert _costs(outs) == {"a": pytest.approx(1.0 * PRICE_S)}
    assert _costs(book.sweep(["w0"], T + 7_000)) == {}  # charged once


def test_prefix_cache_deltas_survive_a_counter_reset(book):
    book.heartbeat(_hb(0, pq=100, ph=40))
    delta = _obs(book.heartbeat(_hb(0.5, pq=150, ph=70)))[0]
    assert (delta["pq"], delta["ph"]) == (50, 30)
    reset = _obs(book.heartbeat(_hb(1.0, pq=20, ph=5)))[0]
    assert (reset["pq"], reset["ph"]) == (20, 5)
    # restarted (a new started_ms) and past its old counts by its first heartbeat
    again = _obs(book.heartbeat(_hb(2.0, pq=30, ph=20, started_ms=T + 1_500)))[0]
    assert (again["pq"], again["ph"]) == (30, 20)


@pytest.mark.parametrize("swept", [True, False])
def test_a_worker_heard_again_after_its_deletion_counts_its_cache_counters_once(swept):
    """Silent past the retention (its entry deleted), then heard again in the same run (the same
    ``started_ms``): its prefix-cache counters go on from where they were, not from zero."""
    table = {}
    book = WorkerBook(table, {"h100": 3.6}, max_gap_s=5, retention_s=RETENTION_S)
    counted = [_obs(book.heartbeat(_hb(t, pq=100 * t, ph=40 * t)))[0] for t in (0, 1, 2)]
    assert [(o["pq"], o["ph"]) for o in counted] == [(0, 0), (100, 40), (100, 40)]
    back = 2 + RETENTION_S + 1
    if swept:
        book.sweep(["w0"], T + int(back * 1000))
        assert "w0" not in table
    again = _obs(book.heartbeat(_hb(back, pq=250, ph=90)))[0]
    assert (again["pq"], again["ph"]) == (0, 0)  # (200, 80) counted already
    more = _obs(book.heartbeat(_hb(back + 1, pq=260, ph=95)))[0]
    assert (more["pq"], more["ph"]) == (10, 5)
    # a new run under the same id, first heard then, counts from zero
    fresh = _obs(book.heartbeat(_hb(back + 2, pq=7, ph=3, started_ms=T + int(back * 1000))))[0]
    assert (fresh["pq"], fresh["ph"]) == (7, 3)


def test_heartbeats_feed_worker_pool_model_and_fleet_and_the_fleet_view(book):
    outs = book.heartbeat(_hb(0, running=3, waiting=2))
    assert {o.key for o in outs} == {"worker:w0", "pool:h100@m", "model:m", "fleet:all"}
    view = book.fleet_view("w0", T + 2_000, timeout_ms=3_000)
    assert view["running"] == 3 and view["queue_depth"] == 2 and view["age_s"] == 2.0
    assert view["live"] == 1 and view["state_code"] == 2  # warm
    assert book.fleet_view("w0", T + 4_000, timeout_ms=3_000)["live"] == 0
    assert book.fleet_view("nobody", T, 3_000) is None


def test_a_worker_not_live_has_no_load_in_the_fleet_view(book):
    """SIGKILLed with 19 requests running (the router moved them on): before 6 Dec its fleet
    view kept ``running`` 19 and its KV blocks, beside ``live`` 0, so that
    ``sum(governor_running{window_s="now"})`` counted them as long as the streams ran. Its load
    is left out (its series go); what it last said of itself stays. A stopped one likewise."""
    book.heartbeat(_hb(0, running=19, waiting=4))
    view = book.fleet_view("w0", T + 10_000, timeout_ms=3_000)
    assert view["live"] == 0 and view["age_s"] == 10.0 and view["state_code"] == 2
    assert not {"running", "queue_depth", "kv_blocks_used", "kv_blocks_free"} & view.keys()
    book.heartbeat(_hb(1, state="stopped", worker="w1"))
    stopped = book.fleet_view("w1", T + 1_500, timeout_ms=3_000)
    assert stopped["live"] == 0 and "running" not in stopped


def test_relayed_observations_go_to_the_worker_and_its_pool(book):
    book.heartbeat(_hb(0))
    outs = book.relay("w0", {"k": "obs", "obs": {"k": "f", "t": T, "v": 0.1},
                             "org": ["r1:w0", 7, 2]})
    assert [(o.key, o.origin) for o in outs] == [("worker:w0", ("r1:w0", 7, 2)),
                                                 ("pool:h100@m", ("r1:w0", 7, 2))]


def test_observations_relayed_before_the_first_heartbeat_reach_the_pool_when_it_is_known(book):
    obs = {"k": "f", "t": T, "v": 0.1}
    early = book.relay("w0", {"k": "obs", "obs": obs, "org": ["r2:w0", 3, 0]})
    assert [o.key for o in early] == ["worker:w0"]
    outs = book.heartbeat(_hb(0))
    held = [o for o in outs if o.payload == obs]
    assert [(o.key, o.origin) for o in held] == [("pool:h100@m", ("r2:w0", 3, 0))]
    assert "held" not in book.table["w0"]


def test_an_attempt_longer_than_the_exact_history_is_charged_from_its_start(book):
    # one request resident for 200 s (400 heartbeats), a companion making the count 1, 2, 1, 2
    book.relay("w0", _end("long", 0, 200))
    charged = {}
    for i in range(401):
        charged.update(_costs(book.heartbeat(_hb(i * 0.5, running=1 + i % 2))))
    # every 0.5 s interval is held at the count of its first heartbeat: 1 or 2 residents
    assert charged["long"] == pytest.approx(sum(0.5 / (1 + i % 2) for i in range(400)) * PRICE_S)


WID = "w" * MAX_ID_CHARS  # the longest ids and names make the largest entry


def _completed_obs(t):
    return {"k": "c", "t": t, "e2e": 2.345678, "in": 4000, "out": 512, "ok": 1, "slo": 1,
            "itl": 0.0123456789}


def _long_end(i, t):
    rid = f"{'r' * (MAX_ID_CHARS - 6)}{i:06d}"
    return {"k": "end", "rid": rid, "task": f"{'n' * MAX_NAME_CHARS}|{rid}",
            "tn": "n" * MAX_NAME_CHARS, "a": MAX_ATTEMPTS, "s": t, "e": t}


def _lost(outs, field):
    return sum(o.payload[field] for o in outs if o.key == "fleet:all" and o.payload["k"] == "lost")


def test_a_worker_not_heard_from_keeps_a_bounded_entry_and_counts_what_it_gives_up():
    """10,000 observations held for a worker whose first heartbeat is not read yet made a
    1.24 MB entry (over the 1 MB record limit), and its pending attempt ends grew forever."""
    table = {}
    book = WorkerBook(table, {"h100": 3.6})
    outs = []
    for i in range(3 * HELD):
        outs += book.relay(WID, {"k": "obs", "obs": _completed_obs(T + i),
                                 "org": [f"r3:{WID}", 2**40 + i, 3]})
    for i in range(3 * PENDING):
        outs += book.relay(WID, _long_end(i, T + i))
    st = table[WID]
    assert (len(st["held"]), len(st["pend"])) == (HELD, PENDING)
    assert (_lost(outs, "held"), _lost(outs, "ends")) == (2 * HELD, 2 * PENDING)
    assert len(orjson.dumps(st)) < MAX_RECORD_BYTES * 0.7  # about 550 KB
    assert st["held"][0][0]["t"] == T + 2 * HELD  # the newest are kept
    tombstone = WorkerBook(copy.deepcopy(table), {})
    tombstone.expire(WID, T + 4 * HELD + int(UNHEARD_S * 1000))  # forgotten unheard
    assert len(tombstone.table[WID]["gone"]) == HELD + PENDING
    assert len(orjson.dumps(tombstone.table[WID])) < 40_000  # about 30 KB
    released = book.heartbeat(_hb(10, worker=WID))
    assert len([o for o in released if o.key == "pool:h100@m"]) == HELD + 1  # and the heartbeat


def test_a_worker_never_heard_from_is_forgotten_with_what_waited_for_it(book):
    book.relay("w9", {"k": "obs", "obs": _completed_obs(T), "org": ["r1:w9", 7, 0]})
    book.relay("w9", _end("a", 0, 1))
    last = T + 1_000
    assert book.sweep(["w9"], last + int(UNHEARD_S * 1000)) == []
    outs = book.sweep(["w9"], last + int(UNHEARD_S * 1000) + 1)
    assert [(o.key, o.payload["held"], o.payload["ends"]) for o in outs] == [
        ("worker:w9", 1, 1), ("fleet:all", 1, 1)]
    assert book.table["w9"] == {"first": None, "pend": {}, "relayed": last + int(UNHEARD_S * 1000)
                                + 1, "gone": book.table["w9"]["gone"]}  # a tombstone
    assert len(book.table["w9"]["gone"]) == 2
    assert book.sweep(["w9"], last + 2 * int(UNHEARD_S * 1000) + 1) == []
    assert book.sweep(["w9"], last + 2 * int(UNHEARD_S * 1000) + 2) == []  # forgotten, silently
    assert "w9" not in book.table


def test_a_heard_worker_waits_for_no_more_than_PENDING_ends(book):
    book.heartbeat(_hb(0))
    outs = []
    for i in range(PENDING + 5):  # ends after its last heartbeat: they wait for the next one
        outs += book.relay("w0", _end(f"r{i}", 1, 2))
    assert len(book.table["w0"]["pend"]) == PENDING and _lost(outs, "ends") == 5
    assert len(_costs(book.heartbeat(_hb(2)))) == PENDING


def test_an_entry_written_before_5_dec_goes_on_as_it_was(book):
    book.heartbeat(_hb(0, running=1))
    book.table["w0"]["pend"] = [{k: v for k, v in _end("a", 0, 1).items() if k != "k"}]
    assert book.relay("w0", _end("a", 0, 1)) == []  # still pending: a re-send
    assert _costs(book.heartbeat(_hb(1))) == {"a": pytest.approx(1.0 * PRICE_S)}


def test_a_price_change_is_charged_from_the_interval_after_it(book):
    """Sample and hold: an interval is charged, as spend and as attribution alike, at the price
    in force at its first heartbeat."""
    book.heartbeat(_hb(0, running=1))
    book.relay("w0", _end("a", 0, 2))
    book.prices = {"h100": 7.2}                        # twice the price, from here on
    straddling = _obs(book.heartbeat(_hb(1, running=1)))[0]
    outs = book.heartbeat(_hb(2))
    after = _obs(outs)[0]
    assert straddling["usd"] == pytest.approx(1.0 * PRICE_S)
    assert after["usd"] == pytest.approx(2.0 * PRICE_S)
    assert _costs(outs) == {"a": pytest.approx(3.0 * PRICE_S)}  # 1 s at each price
    assert book.fleet_view("w0", T + 2000, 3000)["price_usd_per_hour"] == 7.2


def test_an_end_relayed_minutes_behind_its_workers_heartbeats_is_charged_exactly(book):
    """A streams worker catching up after an outage reads a worker's own telemetry partition
    ahead of the attempt ends relayed to it (a second hop). With 240 breakpoints kept, ends read
    150 s behind were charged from a thinned, interpolated sum: in a live run (`governor up`,
    the streams killed until their restart backoff kept them down 150 s) 134 of 480 attempts
    were charged off their share by up to 80 %, 53 of 111 tasks' costs and the attributed total
    (+1.5 %) with them."""
    rng = random.Random(7)
    residents = [rng.randint(1, 4) for _ in range(401)]  # a breakpoint at most heartbeats
    for i, n in enumerate(residents):  # 200 s of heartbeats, read before the end
        book.heartbeat(_hb(i * 0.5, running=n))
    outs = book.relay("w0", _end("a", 10.25, 20.75))
    # each 0.5 s interval is held at the count of its first heartbeat
    exact = sum((min(20.75, (i + 1) * 0.5) - max(10.25, i * 0.5)) / residents[i]
                for i in range(20, 42))
    assert _costs(outs) == {"a": pytest.approx(exact * PRICE_S, rel=1e-9)}


def test_a_worker_heart_beating_fast_keeps_a_bounded_cost_history(book):
    for i in range(5_000):  # every 10 ms, the residents changing at each
        book.heartbeat(_hb(i * 0.01, running=1 + i % 2))
    assert len(book.table["w0"]["cum"]) <= 1_000


def test_a_worker_silent_past_the_retention_is_deleted_and_a_late_end_is_counted_not_charged():
    table = {}
    book = WorkerBook(table, {"h100": 3.6}, max_gap_s=5, retention_s=RETENTION_S)
    for i in range(11):
        book.heartbeat(_hb(i, running=1))
    last = T + 10_000
    deadline = last + int(RETENTION_S * 1000)
    # an attempt ending within the retention is charged exactly, from the entry still there
    assert _costs(book.relay("w0", _end("a", 0, 12))) == {}
    assert _costs(book.sweep(["w0"], deadline)) == {"a": pytest.approx(10 * PRICE_S)}
    assert "w0" in table
    book.relay("w0", _end("b", 5, 12))
    outs = book.sweep(["w0"], deadline + 1)              # charged, then deleted
    assert _costs(outs) == {"b": pytest.approx(5 * PRICE_S)} and "w0" not in table
    # an end relayed later waits as for a worker never heard from, then counts as uncharged
    assert book.relay("w0", _end("c", 5, 12)) == []
    outs = book.sweep(["w0"], deadline + 2)
    assert _costs(outs) == {} and _lost(outs, "ends") == 1 and not table["w0"]["pend"]
    # a heartbeat read after the deletion starts an entry of its own, deleted again as old
    assert _obs(book.heartbeat(_hb(11)))[0]["dt"] == 0
    book.sweep(["w0"], deadline + 1_001)
    assert "w0" not in table


def test_a_worker_of_several_gpus_is_charged_for_each(book):
    """A TP-4 worker (``gpus`` 4) costs four GPUs' price; a heartbeat without the field, one."""
    def beat(t_s, gpus, worker):
        return _hb(t_s, running=1, worker=worker).model_copy(update={"gpus": gpus})

    book.heartbeat(beat(0, 4, "w4"))
    book.heartbeat(beat(0, 1, "w1"))
    four = [o.payload for o in book.heartbeat(beat(1, 4, "w4")) if o.key == "worker:w4"][0]
    one = [o.payload for o in book.heartbeat(beat(1, 1, "w1")) if o.key == "worker:w1"][0]
    assert four["usd"] == pytest.approx(4 * PRICE_S) and one["usd"] == pytest.approx(PRICE_S)
    assert book.fleet_view("w4", T + 1000, 3000)["price_usd_per_hour"] == pytest.approx(4 * 3.6)
    bucket = window.initialize()
    for obs in (four, one):
        window.agg(bucket, obs, obs["t"])
    values = window.result(bucket, 60)
    assert values["gpu_hours"] == pytest.approx(5 / 3600)  # GPU-hours: 4 + 1 GPU-seconds
    assert values["provisioned_s"] == 2 and values["utilisation_ratio"] == 1  # workers' time


@pytest.mark.parametrize("swept", [True, False])
def test_a_heartbeat_past_the_retention_starts_a_new_entry_whether_or_not_swept(swept):
    """The sweep deleting a worker silent past the retention runs as its partition's event time
    passes: a heartbeat read before it (in the batch that moved that time on) continued the old
    entry, provisioning the silence up to ``max_gap_s``, where one read after it did not."""
    table = {}
    book = WorkerBook(table, {"h100": 3.6}, max_gap_s=5, retention_s=RETENTION_S)
    book.heartbeat(_hb(0, running=1))
    book.relay("w0", _end("a", 0, 12))
    back = RETENTION_S + 1
    charged = book.sweep(["w0"], T + int(back * 1000)) if swept else []
    outs = book.heartbeat(_hb(back))
    assert _obs(outs)[0]["dt"] == 0
    assert _costs(charged + outs) == {"a": 0.0}  # charged once, up to its last heartbeat
    assert table["w0"]["first"] == T + int(back * 1000)


@pytest.mark.parametrize("swept", [True, False])
def test_a_record_relayed_past_the_retention_finds_the_worker_as_its_sweep_leaves_it(swept):
    """The worker's partition is past its retention when an observation of a request it ran is
    relayed to it: read after the sweep, it waited for a heartbeat of a worker deleted; read
    before it (in the batch that moved the time on), it reached the old entry's pool."""
    table = {}
    book = WorkerBook(table, {"h100": 3.6}, max_gap_s=5, retention_s=RETENTION_S)
    book.heartbeat(_hb(0))
    now = T + int((RETENTION_S + 1) * 1000)
    if swept:
        book.sweep(["w0"], now)
    outs = book.relay("w0", {"k": "obs", "obs": {"k": "s", "t": now}}, now)
    assert [out.key for out in outs] == ["worker:w0"] and table["w0"]["first"] is None



def test_an_end_replayed_to_a_worker_forgotten_unheard_is_counted_uncharged_once(book):
    """A worker forgotten unheard leaves a tombstone of what it gave up: an attempt end that a
    crash's replay relays again is dropped, not held and counted in ``attempts_uncharged``
    again (before 7 Dec it was)."""
    forgotten_at = T + 1_000 + int(UNHEARD_S * 1000) + 1  # the end's time, and then some
    outs = book.relay("w0", _end("a", 0, 1)) + book.expire("w0", forgotten_at)
    outs += book.relay("w0", _end("a", 0, 1), forgotten_at)  # the replay's
    outs += book.expire("w0", forgotten_at + int(UNHEARD_S * 1000) + 1)
    assert _lost(outs, "ends") == 1 and "w0" not in book.table


def test_an_observation_replayed_to_a_forgotten_worker_heard_since_reaches_no_pool(book):
    """An observation counted given up when its worker was forgotten unheard, relayed again by
    a replay after the worker's first heartbeat, reaches its pool no more (the tombstone goes
    on in the worker's entry); ``UNHEARD_S`` later the tombstone goes."""
    obs = {"k": "obs", "obs": _completed_obs(T), "org": ["r1:w0", 7, 0]}
    forgotten_at = T + int(UNHEARD_S * 1000) + 1
    outs = book.relay("w0", obs) + book.expire("w0", forgotten_at)
    book.heartbeat(_hb(0), forgotten_at)
    replayed = book.relay("w0", obs, forgotten_at)
    outs += replayed + book.expire("w0", forgotten_at + 2 * int(UNHEARD_S * 1000))
    assert _lost(outs, "held") == 1
    assert [out.key for out in replayed] == ["worker:w0"]  # dropped there as seen
    assert "gone" not in book.table["w0"] and book.table["w0"]["first"] is not None


def test_what_a_tombstone_holds_anew_is_forgotten_unheard_s_after_it_was_relayed(book):
    """A tombstone's own time, when its worker was forgotten, does not keep what is relayed to
    it afterwards longer: an observation ``UNHEARD_S`` old is given up at once, as to no entry."""
    forgotten_at = T + int(UNHEARD_S * 1000) + 1
    first = {"k": "obs", "obs": _completed_obs(T), "org": ["r1:w0", 7, 0]}
    book.relay("w0", first)
    assert _lost(book.expire("w0", forgotten_at), "held") == 1
    later = {"k": "obs", "obs": _completed_obs(T), "org": ["r1:w0", 8, 0]}
    book.relay("w0", later, forgotten_at)
    assert _lost(book.expire("w0", forgotten_at), "held") == 1
    assert len(book.table["w0"]["gone"]) == 2


def test_what_a_worker_not_heard_from_gave_up_to_stay_bounded_is_dropped_when_replayed(book):
    """A worker not heard from keeps its newest ``HELD`` observations and ``PENDING`` ends,
    giving the oldest up (counted lost). A crash's replay relaying one of those again drops it:
    before 7 Dec it was held, or waited, anew, pushing out another (a second ``lost``), and
    was counted lost once more when the worker was forgotten."""
    def obs(i):
        return {"k": "obs", "obs": _completed_obs(T + i), "org": ["r1:w9", 10 + i, 0]}

    outs = [out for i in range(HELD + 1) for out in book.relay("w9", obs(i))]
    outs += [out for i in range(PENDING + 1) for out in book.relay("w9", _end(f"r{i}", 0, 1))]
    assert (_lost(outs, "held"), _lost(outs, "ends")) == (1, 1)  # the oldest of each
    replayed = book.relay("w9", obs(0)) + book.relay("w9", _end("r0", 0, 1))
    assert _lost(replayed, "held") == _lost(replayed, "ends") == 0
    assert [out.key for out in replayed] == ["worker:w9"]  # dropped there as seen
    forgotten = book.expire("w9", T + 2_000 + int(UNHEARD_S * 1000))
    assert (_lost(forgotten, "held"), _lost(forgotten, "ends")) == (HELD, PENDING)


def test_an_end_a_heard_worker_gave_up_past_PENDING_waiting_is_dropped_when_replayed(book):
    """A worker heard from keeps ``PENDING`` ends waiting for its next heartbeat, giving the
    oldest up (counted lost). A crash's replay reading the by-worker records again, over the
    entry written back after them, drops the end given up: before 7 Dec it waited anew and
    pushed out the next one, whose replay pushed out the next: every end counted lost again.
    Its digest lasts as long as a replay may read behind its partition's event time then."""
    book.heartbeat(_hb(0))
    ends, at = [_end(f"r{i}", 0.5, 1) for i in range(PENDING + 1)], T + 2_000  # relayed behind
    assert _lost([out for end in ends for out in book.relay("w0", end, at)], "ends") == 1
    assert _lost([out for end in ends for out in book.relay("w0", end, at)], "ends") == 0
    assert len(_costs(book.heartbeat(_hb(3), at + 1_000))) == PENDING
    book.expire("w0", at + int(UNHEARD_S * 1000))
    assert "gone" in book.table["w0"]
    book.expire("w0", at + int(UNHEARD_S * 1000) + 1)
    assert "gone" not in book.table["w0"] and book.table["w0"]["first"] is not None
