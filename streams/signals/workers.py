"""Per-worker state from heartbeats, keyed by worker_id like the telemetry topic. Pure.

From each WorkerStatus it derives one heartbeat observation (for the worker's ``worker:``,
``pool:``, ``model:`` and ``fleet:all`` scopes): provisioned seconds since the previous heartbeat
and what they cost, whether the worker was busy, the prefix-cache counter deltas, and the latest
gauges (running, waiting, KV blocks).

GPU spend: ``price per GPU-hour x GPUs x provisioned time`` (``gpus``: a worker serving with
tensor parallelism over four GPUs costs four; a heartbeat without the field, one). A worker is
provisioned from each heartbeat to the next (busy, idle, loading or warming alike), a silence
counting up to
``max_gap_s``; not from a ``stopped`` heartbeat, nor across a restart (a new ``started_ms``): the
cost report's rule (``analytics/cost.py``), so that both give one figure. Prices come from config (``DEFAULT_GPU_PRICES_USD_PER_HOUR`` by GPU
type unless set, followed live: ``streams.config_feed``); an interval is charged at the price in
force at its first heartbeat. A GPU type without a price costs nothing and is logged by the
adapter.

Attribution by share of GPU time: between two heartbeats the state the first one reported holds
(sample and hold). Over that interval the worker's spend (all its GPUs') is split equally among
its resident requests (``running + waiting``), so each resident request accrues ``price / max(1, resident)``
per second; idle intervals are attributed to nobody. The book keeps that accrual as a piecewise
linear running sum and charges an attempt ``sum(end) - sum(start)`` once a heartbeat at or after
its end has been seen (or the worker stopped, or went silent: then up to its last heartbeat).
Whether a heartbeat came after an end is decided on event time only, never on the order in which
the by-worker and telemetry records happen to be read (which differs in a catch-up after a crash).

Bounds (a worker's entry is one changelog record, under the 1 MB record limit): it keeps at most
``HELD`` observations for a pool not known yet and ``PENDING`` attempt ends waiting for a
heartbeat, each the newest (an older one is given up), and a worker never heard from is forgotten
``UNHEARD_S`` after the newest record relayed to it (its sweep notices). What is given up is
counted, as a ``lost`` observation of the worker's scope and the fleet's:
``pool_observations_dropped`` (observations its pool's signals lack; its own scope has them) and
``attempts_uncharged`` (attempt ends never charged to their tasks). A tombstone of the worker
forgotten unheard (digests of what it gave up) stays ``UNHEARD_S`` more, or as long as a crash's
replay may read behind its partition's event time if that is longer (``replay_s``), so that a
replay relaying one of them again is dropped, not counted given up twice. A worker heard from
keeps the digests of the ends it gave up as long, past its partition's event time at the last.

A worker heard from is deleted once its last heartbeat is ``retention_s`` behind its partition's
event time (silent, stopped or crashed alike; its sweep notices, after charging what waited), so
that worker ids that change with every restart do not grow the table, its changelog and every
pass over it for good. An attempt looks its worker up only when its end is relayed, and charges
only what accrued up to the worker's last heartbeat; the request book keeps an attempt open at
most ``idle_retention_s`` after its request's last event (an hour), and a relay is read up to
``EXACT_S`` behind the worker's partition, so ``retention_s`` defaults to their sum. An end or
observation relayed later still finds no entry: it waits as for a worker never heard from and is
given up ``UNHEARD_S`` later (``attempts_uncharged``, ``pool_observations_dropped``), or, if the
worker id heart-beats again meanwhile, is charged from that heartbeat on (nothing, for an attempt
that ended before it). A heartbeat read after the deletion starts a new entry (nothing
provisioned before it), deleted again at the next sweep when it is as old. A new entry's first
heartbeat counts its prefix-cache counters from zero, but those of a worker that started over
``retention_s`` before it: the same run, heard again after a silence that deleted its entry (or
first read that long after its start), whose counts until then were counted (or are of no
window read); they are its baseline (before 7 Dec they counted from zero: all again). Every
heartbeat and relayed record finds the entry as the sweep would leave it at its partition's
event time (``expire``), whether or not one has run since.
"""

import bisect
import hashlib
from collections.abc import Mapping, MutableMapping
from typing import Any, get_args

from schemas.config import GovernorConfig
from schemas.events import WorkerState, WorkerStatus
from streams.signals.outputs import FLEET, Out, scope_key
from streams.signals.requests import IDLE_RETENTION_S

_STATES = list(get_args(WorkerState))
HELD = 1_000  # relayed observations kept for a worker whose first heartbeat is not read yet
PENDING = 500  # attempt ends kept waiting for a heartbeat at or after them (a worker
# heart-beats every 0.5 s: that is 1,000 attempts ended a second)
UNHEARD_S = 300.0
#: Digests a tombstone keeps (its newest): all that a worker forgotten unheard can have held.
GONE = HELD + PENDING
#: Breakpoints of the running cost sum are kept exactly for ``EXACT_S`` of event time behind the
#: worker's newest heartbeat, so an attempt end read up to that far behind it is charged
#: exactly: a streams worker catching up after an outage reads a worker's own partition ahead
#: of the ends relayed to it. Older points are thinned (every other one) once there are more
#: than ``_MAX_OLD_POINTS``, so an attempt of any length is charged from a sum that still
#: reaches back to its start (interpolated between the points kept). At most ``_MAX_POINTS``
#: in all (a worker heart-beating faster than every 0.3 s has its older half thinned), so the
#: entry stays far under the record limit. (Before 6 Dec 240 points were kept, about 2 minutes
#: at 2 heartbeats/s, thinned past that: ends read minutes behind were charged from an
#: interpolated sum.)
EXACT_S = UNHEARD_S
#: A worker heard from is kept this long after its last heartbeat: an attempt stays open at most
#: ``IDLE_RETENTION_S`` after its request's last event, and its end is relayed up to ``EXACT_S``
#: behind the worker's partition.
RETENTION_S = IDLE_RETENTION_S + EXACT_S
_MAX_OLD_POINTS = 120
_MAX_POINTS = 1_000


def _time(point: list) -> int:
    return point[0]


def _current(st: dict) -> dict:
    """An entry written before 5 Dec (its pending ends a list, searched linearly) in today's
    form: a dict by request and attempt."""
    if isinstance(st["pend"], list):
        st["pend"] = {f"{p['rid']}:{p['a']}": p for p in st["pend"]}
    return st


def _held_digest(payload: dict) -> str | None:
    """An observation's digest: of its origin (none without one: it cannot be told again)."""
    org = payload.get("org")
    return None if org is None else _digest("o|%s|%s|%s" % tuple(org))


def _end_digest(ident: str) -> str:
    return _digest(f"e|{ident}")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _given_up(st: dict, digest: str | None) -> bool:
    """Whether the worker's tombstone names ``digest``: counted lost already."""
    return digest is not None and digest in st.get("gone", ())


def _note_given_up(st: dict, digest: str | None) -> None:
    """Name ``digest`` in the tombstone ``st`` keeps (its newest ``GONE``): what a worker gave
    up to keep within bounds, counted lost then, is dropped when a crash's replay relays it
    again (before 7 Dec it was held, and counted lost, again; a heard worker's end waited anew,
    pushing out the next, until later that day)."""
    if digest is None:
        return
    gone = st.setdefault("gone", {})
    gone[digest] = 1
    if len(gone) > GONE:
        del gone[next(iter(gone))]


def _note_relayed(st: dict, t: int) -> None:
    """``t``, of what was just held for a worker never heard from, is the newest relayed to it,
    which it is forgotten ``UNHEARD_S`` after: a tombstone's own time (of its forgetting) is
    not, once it holds something again."""
    newly = len(st.get("held", ())) + len(st["pend"]) == 1
    st["relayed"] = t if newly else max(st.get("relayed", 0), t)


def _tombstone(st: dict, watermark_ms: int) -> dict:
    """What stays of a worker forgotten unheard: the digests of what it gave up (and of what a
    tombstone before it named), so that a crash's replay relaying one again drops it rather
    than holding it and counting it lost again (before 7 Dec it did). It is an entry never
    heard from that holds nothing, relayed to at ``watermark_ms``: forgotten by this book
    when a replay can no longer reach it (``WorkerBook.tombstone_ms``), and ``UNHEARD_S``
    later by an older one, which takes it for a worker never heard from (its ``lost`` counts
    nothing)."""
    tombstone = {"first": None, "pend": {}, "relayed": watermark_ms,
                 "gone": dict(st.get("gone", {}))}  # (those of a tombstone before it first)
    for _obs, org in st.get("held", ()):
        _note_given_up(tombstone, _held_digest({"org": org}))
    for ident in _current(st)["pend"]:
        _note_given_up(tombstone, _end_digest(ident))
    return tombstone


class WorkerBook:
    def __init__(self, table: MutableMapping[str, Any], prices_usd_per_hour: Mapping[str, float],
                 max_gap_s: float = GovernorConfig().worker_heartbeat_timeout_s,
                 retention_s: float = RETENTION_S, replay_s: float = 0.0) -> None:
        """``replay_s``: how far behind its partition's event time a crash's replay may read
        (the allowed lateness plus the commit interval: ``streams.stages``)."""
        self.table = table
        self.prices = dict(prices_usd_per_hour)
        self.max_gap_ms = int(max_gap_s * 1000)
        self.retention_ms = int(retention_s * 1000)
        #: A tombstone lasts ``UNHEARD_S``, and at least as long as a replay may read behind
        #: (before 7 Dec ``UNHEARD_S`` whatever the allowed lateness, which may be an hour).
        self.tombstone_ms = int(max(UNHEARD_S, replay_s) * 1000)

    def heartbeat(self, status: WorkerStatus, watermark_ms: int | None = None) -> list[Out]:
        """``watermark_ms``: the event time of the worker's partition, this heartbeat's
        included (default: its own time), at which ``expire`` applies first."""
        w, t = status.worker_id, status.event_time_ms
        now = max(t, watermark_ms or t)
        charged = self.expire(w, now)
        st = _current(self.table.get(w) or {"first": None, "pend": {}})
        if st["first"] is not None and t <= st["last"]:
            # a duplicate, or an older heartbeat delivered late: nothing of its own (but what
            # ``expire`` charged first, which before 7 Dec was dropped: never charged)
            return charged
        price_ms = self.prices.get(status.gpu_type, 0.0) * status.gpus / 3_600_000
        held_price_ms = st.get("pms", price_ms)  # the interval's: its first heartbeat's price
        dt_ms = 0
        restarted = st.get("started", status.started_ms) != status.started_ms
        if st["first"] is None:
            st.update(first=t, cum=[[t, 0.0]], rate=0.0, pq=0, ph=0, run=0, stopped=False)
            if status.started_ms < now - self.retention_ms:  # counted, maybe, and deleted
                st.update(pq=status.prefix_cache_queries, ph=status.prefix_cache_hits)
        else:
            if not (st["stopped"] or restarted):  # (a gap between two runs is not provisioned)
                dt_ms = min(t - st["last"], self.max_gap_ms)
                self._extend(st, st["last"] + dt_ms, st["rate"])
            if st["last"] + dt_ms < t:
                self._extend(st, t, 0.0)
        dpq = status.prefix_cache_queries - st["pq"]
        dph = status.prefix_cache_hits - st["ph"]
        if restarted or dpq < 0 or dph < 0:  # counters restarted with the worker
            dpq, dph = status.prefix_cache_queries, status.prefix_cache_hits
        obs = {"k": "h", "t": t, "w": w, "dt": dt_ms / 1000, "busy": int(st["run"] > 0),
               "usd": held_price_ms * dt_ms, "pq": dpq, "ph": dph, "run": status.running,
               "wait": status.waiting, "kvu": status.kv_blocks_used, "kvf": status.kv_blocks_free}
        if status.gpus > 1:
            obs["g"] = status.gpus  # (its GPU-hours: ``dt`` is the worker's time)
        stopped = status.state == "stopped"
        st["view"] = [status.slot, _STATES.index(status.state), status.running, status.waiting,
                      status.kv_blocks_used, status.kv_blocks_free, status.requests_completed]
        st.update(last=t, started=status.started_ms, pool=status.pool, gpu=status.gpu_type,
                  gpus=status.gpus, pq=status.prefix_cache_queries, ph=status.prefix_cache_hits,
                  run=0 if stopped else status.running,
                  rate=price_ms / max(1, status.running + status.waiting), pms=price_ms,
                  stopped=stopped)
        outs = [Out("scope", key, obs) for key in (
            scope_key("worker", w), scope_key("pool", status.pool), FLEET)]
        outs += [Out("scope", scope_key("pool", status.pool), held,
                     tuple(origin) if origin else None) for held, origin in st.pop("held", [])]
        models = status.models_loaded or ["unknown"]
        share = {**obs, "dt": obs["dt"] / len(models), "usd": obs["usd"] / len(models)}
        outs += [Out("scope", scope_key("model", m), share) for m in models]
        outs += self._settle(st, w, lambda end: end <= t or stopped)
        self.table[w] = st
        return charged + outs

    def relay(self, worker_id: str, payload: dict, watermark_ms: int | None = None) -> list[Out]:
        """A record the request book addressed to this worker: an observation or an attempt end.
        ``watermark_ms``: the event time of the worker's partition, at which ``expire`` applies
        first (None: it does not)."""
        charged = [] if watermark_ms is None else self.expire(worker_id, watermark_ms)
        return charged + self._relay(worker_id, payload, watermark_ms)

    def _relay(self, worker_id: str, payload: dict, watermark_ms: int | None) -> list[Out]:
        st = _current(self.table.get(worker_id) or {"first": None, "pend": {}})
        if payload["k"] == "obs":
            obs = payload["obs"]
            origin = tuple(payload["org"]) if "org" in payload else None
            outs = [Out("scope", scope_key("worker", worker_id), obs, origin)]
            if _given_up(st, _held_digest(payload)):
                return outs  # a replay's (its worker and fleet scopes drop it as seen)
            if st.get("pool"):
                outs.append(Out("scope", scope_key("pool", st["pool"]), obs, origin))
            else:  # read before the worker's first heartbeat: its pool is not known yet
                held = st.setdefault("held", [])
                if origin is not None and any(org == payload["org"] for _obs, org in held):
                    # held already: relayed again by a replay, over the entry written back with
                    # it (before 7 Dec held twice, and counted twice if the worker was forgotten)
                    return outs
                held.append([obs, payload.get("org")])
                if len(held) > HELD:
                    _, evicted = held.pop(0)
                    _note_given_up(st, _held_digest({"org": evicted}))
                    outs += self._lost(worker_id, obs["t"], held=1)
                _note_relayed(st, obs["t"])
                self.table[worker_id] = st
            return outs
        ident, pend = f"{payload['rid']}:{payload['a']}", st["pend"]
        if ident in pend or _given_up(st, _end_digest(ident)):
            return []  # an end re-sent while still pending (one re-sent later is charged again
            # and dropped by the task book, which deduplicates charges by request and attempt)
        pend[ident] = {k: payload[k] for k in ("rid", "task", "tn", "a", "s", "e")}
        outs: list[Out] = []
        if st["first"] is None:
            _note_relayed(st, payload["e"])
        else:
            outs = self._settle(st, worker_id, lambda end: end <= st["last"] or st["stopped"])
        if len(st["pend"]) > PENDING:
            oldest = next(iter(st["pend"]))
            del st["pend"][oldest]
            _note_given_up(st, _end_digest(oldest))
            if st["first"] is not None:  # kept while a replay may read back to it (``expire``)
                st["relayed"] = max(st.get("relayed", 0), payload["e"], watermark_ms or 0)
            outs += self._lost(worker_id, payload["e"], ends=1)
        self.table[worker_id] = st
        return outs

    def sweep(self, keys, watermark_ms: int) -> list[Out]:
        """``expire`` each worker of ``keys`` at ``watermark_ms``, the newest event time of their
        telemetry partition."""
        return [out for worker_id in list(keys) for out in self.expire(worker_id, watermark_ms)]

    def expire(self, worker_id: str, watermark_ms: int) -> list[Out]:
        """Settle the pending charges of a worker gone silent: its telemetry partition's records
        (its own heartbeats included) are read in order, so a worker with no heartbeat for
        ``max_gap_s`` before ``watermark_ms`` has stopped. Its attempts are charged up to its
        last heartbeat. Delete a worker whose last heartbeat is ``retention_s`` before it;
        forget one never heard from ``UNHEARD_S`` after the newest record relayed to it,
        counting what waited for it, and keeping a tombstone of it as long again, or as long
        as a replay may read behind (``_tombstone``, ``tombstone_ms``).

        The sweep does it as its partition's event time passes, and so does every heartbeat
        and relayed record first, at the time it is read at: what it finds does not depend on
        whether a sweep ran since (before 7 Dec a heartbeat read in the batch whose time passed
        the retention provisioned the silence, up to ``max_gap_s``, and one read in the next
        did not; an observation relayed to the worker reached its pool or waited)."""
        st = self.table.get(worker_id)
        if not st:
            return []
        if st["first"] is None:
            kept_ms = UNHEARD_S * 1000 if st.get("held") or st["pend"] else self.tombstone_ms
            if st.get("relayed", 0) < watermark_ms - kept_ms:
                return self._forget_unheard(worker_id, st, watermark_ms)
            return []
        outs = []
        if "gone" in st and st["relayed"] < watermark_ms - self.tombstone_ms:
            del st["gone"]  # a tombstone the worker's first heartbeat found: past replays too
            self.table[worker_id] = st
        if st["pend"] and watermark_ms > st["last"] + self.max_gap_ms:
            outs = self._settle(_current(st), worker_id, lambda end: True)
        if st["last"] < watermark_ms - self.retention_ms:
            self.table.pop(worker_id, None)
        elif outs:
            self.table[worker_id] = st
        return outs

    def _forget_unheard(self, worker_id: str, st: dict, watermark_ms: int) -> list[Out]:
        """Forget a worker never heard from, counting what it held as given up. A tombstone
        stays in its place (``_tombstone``); one that held nothing is forgotten silently."""
        held, ends = st.get("held", ()), st["pend"]
        if not held and not ends:
            self.table.pop(worker_id, None)
            return []
        self.table[worker_id] = _tombstone(st, watermark_ms)
        return self._lost(worker_id, watermark_ms, held=len(held), ends=len(ends))

    @staticmethod
    def _lost(worker_id: str, t: int, held: int = 0, ends: int = 0) -> list[Out]:
        obs = {"k": "lost", "t": t, "held": held, "ends": ends}
        return [Out("scope", key, obs) for key in (scope_key("worker", worker_id), FLEET)]

    def fleet_view(self, worker_id: str, now_ms: int, timeout_ms: int) -> dict[str, float] | None:
        """The worker's last status and its age: the fleet view the router and controllers read.
        ``state_code`` indexes ``WorkerState`` (starting 0, loading 1, warm 2, draining 3,
        sleeping 4, crashed 5, stopped 6); ``live`` is 1 when heard from within ``timeout_ms``
        and not stopped. A worker not live has no load (``running``, ``queue_depth``, KV
        blocks): its last would count work it no longer holds."""
        st = self.table.get(worker_id)
        if not st or st.get("first") is None:
            return None
        slot, state, running, waiting, used, free, completed = st["view"]
        age_ms = max(0, now_ms - st["last"])
        live = age_ms <= timeout_ms and not st["stopped"]
        view = {"slot": slot, "state_code": state, "requests_completed": completed,
                "last_seen_ms": st["last"], "age_s": age_ms / 1000, "live": float(live),
                "price_usd_per_hour": self.prices.get(st["gpu"], 0.0) * st.get("gpus", 1)}
        if live:
            view.update(running=running, queue_depth=waiting, kv_blocks_used=used,
                        kv_blocks_free=free)
        return view

    def _extend(self, st: dict, t: int, rate: float) -> None:
        cum = st["cum"]
        last_t, last_c = cum[-1]
        cum.append([t, last_c + rate * (t - last_t)])
        if len(cum) >= 3:  # drop a middle point where the slope does not change
            (t0, c0), (t1, c1), (t2, c2) = cum[-3:]
            if abs((c1 - c0) * (t2 - t1) - (c2 - c1) * (t1 - t0)) <= 1e-15 * max(1.0, c2):
                del cum[-2]
        exact_from = bisect.bisect_left(cum, t - EXACT_S * 1000, key=_time)
        if exact_from > _MAX_OLD_POINTS:
            cum[:exact_from] = cum[:exact_from:2]  # the first point stays: the sum's origin
        if len(cum) > _MAX_POINTS:
            half = len(cum) // 2
            cum[:half] = cum[:half:2]

    def _accrued(self, st: dict, at_ms: int) -> float:
        """Per-resident cost accrued from the first heartbeat until ``at_ms`` (clamped to the
        known heartbeats: before the first nothing was provisioned, after the last not yet)."""
        cum = st["cum"]
        if at_ms <= cum[0][0]:
            return cum[0][1]
        if at_ms >= cum[-1][0]:
            return cum[-1][1]
        i = bisect.bisect_right(cum, at_ms, key=_time)
        (t0, c0), (t1, c1) = cum[i - 1], cum[i]
        return c0 + (c1 - c0) * (at_ms - t0) / (t1 - t0)

    def _settle(self, st: dict, worker_id: str, due) -> list[Out]:
        outs, keep = [], {}
        for ident, p in st["pend"].items():
            if st["first"] is None or not due(p["e"]):
                keep[ident] = p
                continue
            usd = max(0.0, self._accrued(st, p["e"]) - self._accrued(st, p["s"]))
            outs.append(Out("task", p["task"], {
                "k": "cost", "rid": p["rid"], "a": p["a"], "usd": usd, "t": p["e"],
                "tn": p["tn"], "w": worker_id}))
        st["pend"] = keep
        return outs
