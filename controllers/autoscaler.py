"""Autoscaler per pool (GPU type x model): a pure, ticked, level-triggered controller.

Each tick it recomputes the absolute size every pool should have:
- demand of a model: the most pressing of the sequences its workers run and queue (plus the
  requests the router holds for want of a worker), the KV blocks they use, and their prefill
  backlog against the TTFT SLO, projected one cold start ahead along its recent growth (a worker
  asked for now serves only after its weights load);
- capacity of one worker: ``target_utilisation`` x the largest batch whose decode step (from the
  performance model, ``perf_model``, at the tensor parallelism the pool's live workers report,
  or, where none is alive or they report several, the one declared for it: ``degree``)
  stays within the inter-token latency target, so a full worker still meets the latency SLO;
- the model's demand is met by its cheapest pools first (dollars per unit of capacity: a
  worker's price is that of all its GPUs, as its workers last reported them, and at least
  those its model needs on that GPU type), each
  between its bounds: ``min_replicas`` and ``max_replicas``, or the pool's own in ``pools`` (a
  cap lowered live applies at once; a pool capped at 0 is not used);
- it scales out at once and in slowly: one worker less only after demand has stayed below the
  current size for ``scale_in_window_s``, from the dearest pool first, but never the model's
  last worker that way, its window standing still while the model's multi-step tasks in
  progress (accepted, their last step not yet) are clearly more (a tenth, and twice the square
  root of the count) than 30 s before: conversations starting faster than they end
  bring later steps the sequences running now do not show (on ``benchmarks.workflow_bursts``'
  base load it scaled in at 61 s, with the conversations still ramping up, and shed 39
  requests, failing their conversations, while the second worker loaded again);
- a pool is commanded from a heartbeat timeout after this process first heard of it (a
  heartbeat, ``autoscaler.pools`` in the configuration, or a size an earlier process commanded,
  read back), once its workers have all been heard: a restarted autoscaler keeps the pools as
  they are (at the size last commanded, where it reads one back: a worker still starting has
  not been heard, one cut may still serve), and wakes a configured pool left at zero;
- growth is that of the demand that lasts (the least of each 5 s: a burst of long prompts that
  the fleet prefills in seconds buys no cold start), measured only from 30 s after the model's
  pools last changed size (the sequences a fleet holds depend on its size: with one worker less
  each holds more for a while, and that is not growth);
- a worker out of service (``Breakers.out_of_service``: its breaker opened again after its
  probe) is no capacity: its pool is given one more worker while its other warm workers are
  fewer than the demand wants, and none once they are (a scale-in then takes one, and the local
  supervisor drains the worker behind the open breaker first); one its pool's cap leaves
  unreplaced sends its share of the demand to the next pool;
- a model idle for ``idle_to_zero_s`` (no demand, no request started, none accepted and not
  ended: the end of an attempt a later one replaced is not its request's, ``ended``; counted
  from when the autoscaler was last enabled, at the earliest) scales to zero (the pools whose
  least is 0) and is woken, one worker of its cheapest pool in use, by a
  request waiting for it: held for want of a worker (``Rejected`` ``no_capacity``), or
  accepted (``Queued``) and not ended.
New workers start cold; the router sends them nothing until they are warm.
"""

import logging
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass, field

from controllers.router.candidates import perf_model, worker_gpus
from controllers.router.fleet import FleetView, WorkerView
from schemas.commands import ScalePool, command_id
from schemas.config import AutoscalerConfig, unpriced_gpu_price
from schemas.limits import pool_name

logger = logging.getLogger(__name__)

#: Inter-token latency a full worker must still meet (seconds per decode step).
ITL_TARGET_S = 0.05
#: Demand history the growth projection compares (two halves), and keeps.
_GROWTH_MIN_SPAN_MS, _GROWTH_SPAN_MS = 5_000, 10_000
#: How long after a change of size the fleet's sequences take to settle.
_SETTLE_MS = 30_000
#: Longest a request counts as open without an end seen (one whose end was lost).
OPEN_FOR_MS = 3_600_000
#: A multi-step task counts as in progress until its last step is accepted, or for this long
#: after its latest step was (its client gone); its model's count of them is compared with the
#: count this long before (``tasks_growing``).
TASK_GONE_MS, TASK_GROWTH_MS = 600_000, 30_000
#: Growth of the tasks in progress that holds a scale-in: this share of the count, at least.
TASK_GROWTH_SHARE = 0.1
#: Tasks in progress kept at most (the oldest forgotten first): a bound for any traffic.
MAX_TASKS = 100_000
#: A pool size read back is continued from if commanded this recently: a live process restates
#: it every few seconds, so an older one is a stopped stack's, whose workers are gone.
CONTINUED_WITHIN_MS = 30_000
_ENDED_FIRST_KEPT = 10_000
_NAMED_MAX = 20  # workers a warning names, at most
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class _Pool:
    name: str
    gpu_type: str
    model: str
    replicas: int
    below_since_ms: int | None = None
    decided_ms: int | None = None  # its last tick
    known: bool = False  # replicas taken from the workers seen
    heard_ms: int | None = None  # when this process first heard of it (None: decide at once)
    commanded: bool = False  # its size read back, as an earlier process last commanded it
    #: GPUs a worker it is planned at (``Autoscaler.degree``)
    gpus: int = 1
    #: GPUs a worker as its live workers last reported (``WorkerStatus.gpus``; None: none heard)
    reported: int | None = None
    #: the disagreement last warned of (``Autoscaler.degree``): each is logged once
    warned: tuple = ()


@dataclass
class Autoscaler:
    config: AutoscalerConfig = AutoscalerConfig()
    prices: dict[str, float] = field(default_factory=dict)
    pools: dict[str, _Pool] = field(default_factory=dict)
    ttft_slo_s: float = 2.0
    #: GPUs a worker of a pool runs on, by pool name, as the fleet that starts its workers
    #: declares it at start-up (``governor controllers --pool-gpus``: the local stack's
    #: ``--fleet``, the simulator's); a pool's ``gpus`` in the configuration
    #: (``autoscaler.pools``) overrides it (``declared``).
    degrees: dict[str, int] = field(default_factory=dict)
    #: When the fleet it sizes was started, epoch ms (``governor controllers
    #: --fleet-started-ms``: ``governor up``'s and ``demo``'s start): a size commanded before
    #: then is an earlier stack's, and is not continued from (``continue_from``); 0: none said.
    fleet_started_ms: int = 0
    _history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    _resized_ms: dict[str, int] = field(default_factory=dict)  # model -> last change of size
    #: model -> when it last had demand or started a request (a request that starts and ends
    #: between two heartbeats shows in no demand, but the model is not idle)
    _busy_ms: dict[str, int] = field(default_factory=dict)
    #: requests the router accepted that have not ended: request id -> (model, accepted at,
    #: its newest attempt seen: ``attempted``)
    _open: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    _open_by_model: Counter = field(default_factory=Counter)
    #: the newest requests seen ending before they were seen accepted (a ``Queued`` a restarted
    #: router sends late, for a request that has run): request id -> the attempt that ended
    #: (None: the request); not opened when their ``Queued`` comes, unless a later attempt has
    #: started since (``_started_first``)
    _ended_first: OrderedDict = field(default_factory=OrderedDict)
    #: the newest requests seen starting before they were seen accepted (the router sends a
    #: ``Queued`` once its ``Dispatch`` is on the broker, and a worker may start before, or a
    #: restarted router send it late): request id -> its newest attempt started, opened at that
    #: attempt when the ``Queued`` comes, so that an earlier attempt's end is not its end
    _started_first: OrderedDict = field(default_factory=OrderedDict)
    #: the newest accepted requests an attempt's ``Failed`` or ``Cancelled`` ended: request id
    #: -> (model, that attempt), oldest first; open again if a later attempt of one starts
    #: (``attempted``), never by their ``Queued`` read again (``accepted``)
    _ended_by: OrderedDict = field(default_factory=OrderedDict)
    #: the newest accepted requests a ``Completed`` ended (request id -> None), oldest first:
    #: their ``Queued`` read again (a record its writer sent twice) opens nothing
    _completed: OrderedDict = field(default_factory=OrderedDict)
    #: multi-step tasks whose last step has not been accepted: (tenant, task id) -> (model,
    #: when its latest step was), oldest first; their count by model, and its recent history
    _tasks: OrderedDict = field(default_factory=OrderedDict)
    _tasks_by_model: Counter = field(default_factory=Counter)
    _task_counts: dict[str, deque] = field(default_factory=dict)

    def started(self, model: str, at_ms: int) -> None:
        """A request of ``model`` started on a worker."""
        self._busy_ms[model] = max(self._busy_ms.get(model, at_ms), at_ms)

    def accepted(self, request_id: str, model: str, at_ms: int) -> None:
        """The router accepted a request (``Queued``): until it ends, its model is not idle,
        and a model left without workers is woken for it (a request dispatched to a worker
        that drained before reading it waits for a continuation, not in any queue). Those open
        past ``OPEN_FOR_MS`` are let go here too, not only on ticks: while the autoscaler is
        off (the default) it does not tick, and they would be kept for good. A request seen
        starting before (``attempted``) is opened at the newest attempt seen; one seen ending
        before is not opened, unless a later attempt of it started than the one that ended.
        A request seen ending is not opened again by its ``Queued`` read again (a record its
        writer sent twice): before 7 Dec it was, and kept its model from idling to zero for
        ``OPEN_FOR_MS``. One whose end was read before its ``Queued`` is remembered as ended
        from then on (``_ended``), so that a continuation seen starting after it opens it again
        (``attempted``): before, nothing did."""
        if request_id in self._completed or request_id in self._ended_by:
            return
        started = self._started_first.pop(request_id, 1)
        if request_id in self._ended_first:
            ended = self._ended_first.pop(request_id)
            if ended is None or ended >= started:
                self._ended(request_id, model, ended)
                return
        if request_id not in self._open:
            self._open[request_id] = (model, at_ms, started)
            self._open_by_model[model] += 1
            self._expire_open(at_ms)

    def task_step(self, key: tuple[str, str], model: str, step: int, steps_total: int,
                  at_ms: int) -> None:
        """Step ``step`` of ``steps_total`` of the task ``key`` was accepted (``Queued``)."""
        if steps_total <= 1:
            return
        known = self._tasks.pop(key, None)
        if known is not None:
            self._tasks_by_model[known[0]] -= 1
        if step < steps_total:
            self._tasks[key] = (model, at_ms)
            self._tasks_by_model[model] += 1
            if len(self._tasks) > MAX_TASKS:
                self._tasks_by_model[self._tasks.popitem(last=False)[1][0]] -= 1

    def tasks_growing(self, model: str, now_ms: int) -> tuple[bool, str]:
        """Whether ``model``'s multi-step tasks in progress are clearly more than
        ``TASK_GROWTH_MS`` before (the oldest count kept, early on): conversations are still
        starting faster than they end, and their later steps, sent as the earlier ones are
        answered, are demand the sequences running now do not show yet. And what it counted."""
        while self._tasks:
            key = next(iter(self._tasks))
            model_of, at_ms = self._tasks[key]
            if at_ms >= now_ms - TASK_GONE_MS:
                break
            del self._tasks[key]
            self._tasks_by_model[model_of] -= 1
        count = self._tasks_by_model[model]
        history = self._task_counts.setdefault(model, deque())
        history.append((now_ms, count))
        while len(history) > 1 and history[1][0] <= now_ms - TASK_GROWTH_MS:
            history.popleft()
        before = history[0][1]
        # more than the noise of tasks starting and ending at random (Poisson: about the square
        # root of the count) and a tenth: in steady state the count goes up half the time
        growing = count - before > max(TASK_GROWTH_SHARE * before, 2 * math.sqrt(before), 1)
        return growing, f"{count} multi-step tasks in progress, {before} before"

    def attempted(self, request_id: str, attempt: int, at_ms: int) -> None:
        """Attempt ``attempt`` of a request started (``Started``; a continuation's is above 1):
        an earlier attempt's end read from now on is not the request's (``ended``). A request
        such an end already closed is open again, from ``at_ms``: the router had continued it
        when it read that end (the controllers do not read the dispatches), and it runs on. A
        request not seen accepted yet is remembered with its newest attempt for its ``Queued``
        (``accepted``): before 7 Dec it was not, and a continuation started before the
        ``Queued`` was read had its request closed by the replaced attempt's end read late (or
        not opened at all, that end read before the ``Queued``) while it ran."""
        opened = self._open.get(request_id)
        if opened is not None:
            if attempt > opened[2]:
                self._open[request_id] = (opened[0], opened[1], attempt)
            return
        closed = self._ended_by.get(request_id)
        if closed is not None:
            if attempt > closed[1]:
                del self._ended_by[request_id]
                self._open[request_id] = (closed[0], at_ms, attempt)
                self._open_by_model[closed[0]] += 1
            return
        started = self._started_first
        started[request_id] = max(attempt, started.pop(request_id, attempt))  # (newest last)
        if len(started) > _ENDED_FIRST_KEPT:
            started.popitem(last=False)

    def ended(self, request_id: str, attempt: int | None = None) -> None:
        """A request's end. ``attempt``: the one attempt it ends (a ``Failed`` or ``Cancelled``
        names it), which is not the request's end where a later attempt of it has started (a
        replaced attempt's end read late: before 7 Dec it closed the request while its
        continuation ran); None: the request's, whichever attempt ran (a ``Completed``, whose
        answer is whole; an end from a writer older than ``attempt``)."""
        opened = self._open.get(request_id)
        if opened is not None and attempt is not None and attempt < opened[2]:
            return
        opened = self._open.pop(request_id, None)
        if opened is not None:
            self._open_by_model[opened[0]] -= 1
            self._ended(request_id, opened[0], attempt)
        elif attempt is None or attempt >= self._started_first.get(request_id, attempt):
            # (not the end of an attempt a later one, seen starting, replaced)
            ended_first = self._ended_first
            before = ended_first.pop(request_id, attempt)
            ended_first[request_id] = None if attempt is None or before is None else max(
                attempt, before)
            if attempt is None:
                self._started_first.pop(request_id, None)
            if len(ended_first) > _ENDED_FIRST_KEPT:
                ended_first.popitem(last=False)

    def _ended(self, request_id: str, model: str, attempt: int | None) -> None:
        """Remember an accepted request's end: by ``Completed`` (``attempt`` None: whole), or by
        the end of ``attempt``, which a later attempt seen starting opens again."""
        ended = self._completed if attempt is None else self._ended_by
        ended[request_id] = None if attempt is None else (model, attempt)
        if len(ended) > _ENDED_FIRST_KEPT:
            ended.popitem(last=False)

    def _expire_open(self, now_ms: int) -> None:
        """Requests open longer than ``OPEN_FOR_MS`` are taken to have ended unseen."""
        while self._open:
            rid = next(iter(self._open))
            if self._open[rid][1] >= now_ms - OPEN_FOR_MS:
                break
            self.ended(rid)

    def add_pool(self, gpu_type: str, model: str, replicas: int,
                 heard_ms: int | None = None) -> None:
        """A pool to size; ``heard_ms``: when this process first heard of it (a heartbeat, or
        the configuration). For a heartbeat timeout from then its size is at least the workers
        heard so far, and it is not commanded: a restarted autoscaler would otherwise command
        every pool down to the workers heard in its first tick."""
        name = pool_name(gpu_type, model)
        if name not in self.pools:  # every heartbeat asks: build the pool only the first time
            self.pools[name] = _Pool(name, gpu_type, model, replicas, heard_ms=heard_ms,
                                     gpus=self.declared(name) or 1)

    def continue_from(self, command: ScalePool, heard_ms: int) -> None:
        """The size an earlier process commanded a pool (read back from the control topic, in
        order; ``heard_ms``: when): the pool continues from that size, not from the workers
        heard (one started for it may not heart-beat yet; one cut may not drain yet); its
        scale-in window starts afresh. Not one older than ``CONTINUED_WITHIN_MS``, nor one
        from before the fleet was started (``fleet_started_ms``): a ``governor up --fleet
        h100:1`` within 30 s of a stack whose autoscaler had scaled the pool to zero continued
        from that 0, and stopped the worker its ``--fleet`` had just started."""
        if heard_ms - command.event_time_ms > CONTINUED_WITHIN_MS or \
                command.event_time_ms < self.fleet_started_ms:
            return
        pool = self.pools.get(command.pool)
        if pool is None:
            pool = self.pools[command.pool] = _Pool(command.pool, command.gpu_type, command.model,
                                                    command.replicas, heard_ms=heard_ms,
                                                    gpus=self.declared(command.pool) or 1)
        pool.replicas, pool.known, pool.commanded = command.replicas, True, True

    def sizes_held(self, fleet: FleetView, now_ms: int) -> dict[str, int]:
        """Each pool's size as it stands before this process commands it: the size an earlier
        process commanded, else its workers alive and not draining (what a first command
        changes; the size it plans while it learns the pool is no size the pool has had)."""
        serving = Counter(w.pool for w in fleet.alive(now_ms) if w.state != "draining")
        return {pool.name: pool.replicas if pool.commanded else serving[pool.name]
                for pool in self.pools.values()}

    def declared(self, pool: str) -> int | None:
        """GPUs a worker of ``pool`` is declared to run on: its ``gpus`` in the configuration
        (``autoscaler.pools``), else the fleet's at start-up (``degrees``); None: neither says."""
        own = self.config.pools.get(pool)
        return own.gpus if own is not None and own.gpus is not None else self.degrees.get(pool)

    def degree(self, pool: _Pool, alive: list[WorkerView]) -> int:
        """GPUs a worker of ``pool`` is planned at (its capacity, cold start and price), given
        its live workers: the degree they report (``WorkerStatus.gpus``), and where they report
        several (workers started by hand with different ``--tp``), the declared one, else the
        largest; with none alive, the declared, else the one last reported, else 1 (the least
        that holds its model: ``perf_model``). Logged once (a warning) each time the workers'
        degrees disagree with each other, or with the declared one."""
        declared = self.declared(pool.name)
        reports = sorted({w.gpus for w in alive})
        if not reports:
            pool.warned = ()
            return declared or pool.reported or 1
        pool.reported = max(reports)
        planned = declared if len(reports) > 1 and declared else pool.reported
        disagree = len(reports) > 1 or declared not in (None, pool.reported)
        key = (tuple(reports), declared) if disagree else ()
        if key and key != pool.warned:
            named = sorted(alive, key=lambda w: (w.gpus, w.worker_id))
            logger.warning(
                "autoscaler: pool %s: its live workers run on %s GPUs a worker (%s%s), %s: "
                "planned at %d", pool.name, " and ".join(map(str, reports)),
                ", ".join(f"{w.worker_id} {w.gpus}" for w in named[:_NAMED_MAX]),
                " and more" if len(named) > _NAMED_MAX else "",
                f"declared {declared}" if declared else
                f"none declared (autoscaler.pools.{pool.name}.gpus)", planned)
        pool.warned = key
        return planned

    def resume(self) -> None:
        """Enabled (again) after it was disabled: it ticked not at all meanwhile, so each pool's
        scale-in window and each model's idle time start afresh, from its first tick (a window
        begun before it was disabled took a worker on the first tick after, as if demand had
        been watched below capacity all along; and a model idle since a request seen while it
        was disabled, or since its last tick before, for ``idle_to_zero_s`` was scaled to zero
        on that tick, without a warning)."""
        for pool in self.pools.values():
            pool.below_since_ms = pool.decided_ms = None
        self._busy_ms.clear()  # (a model not in it is busy as of the next tick)

    def capacity(self, gpu_type: str, model: str, gpus: int = 1) -> float:
        """Sequences one worker of this kind (on ``gpus`` GPUs: ``perf_model``) serves within
        the latency target."""
        perf = perf_model(gpu_type, model, gpus)
        batch = max((b for b in _BATCHES if perf.decode_step_s(b, 1024) <= ITL_TARGET_S), default=1)
        return self.config.target_utilisation * batch

    def demand(self, model: str, fleet: FleetView, now_ms: int, held: int) -> tuple[float, str]:
        """Demand in units of one worker's capacity of the model's cheapest kind: the most
        pressing of sequences, KV blocks and prefill backlog (long prompts fill KV and the
        prefill queue long before they fill a batch)."""
        workers = [w for w in fleet.alive(now_ms) if model in w.models]
        kind = self._cheapest_kind(model)
        seqs = (sum(w.running + w.waiting for w in workers) + held) / self.capacity(*kind)
        kv_total = sum(w.kv_blocks_used + w.kv_blocks_free for w in workers) / max(len(workers), 1)
        kv = (sum(w.kv_blocks_used for w in workers) / (self.config.target_utilisation * kv_total)
              if kv_total else 0.0)
        backlog_s = sum(perf_model(w.gpu_type, model, w.gpus).prefill_s(w.prefill_backlog_tokens)
                        for w in workers if w.prefill_backlog_tokens)
        prefill = backlog_s / (self.config.target_utilisation * self.ttft_slo_s)
        now_demand = max(seqs, kv, prefill) * self.capacity(*kind)
        history = self._history.setdefault(model, [])
        if now_ms - self._resized_ms.get(model, now_ms - _SETTLE_MS) < _SETTLE_MS:
            history.clear()  # still settling: what changes now is not growth
        history.append((now_ms, now_demand))
        while history and now_ms - history[0][0] > _GROWTH_SPAN_MS:
            history.pop(0)
        slope = _sustained_growth(history, now_ms)
        lead_s = perf_model(*kind).load_s()
        projected = now_demand + slope * lead_s
        return projected, (f"demand {now_demand:.0f} sequence-equivalents now (sequences "
                           f"{seqs:.1f}, KV {kv:.1f}, prefill backlog {prefill:.1f} workers' worth), "
                           f"growing {slope:.1f}/s, {projected:.0f} expected after a {lead_s:.0f}s "
                           "cold start")

    def _cheapest_kind(self, model: str) -> tuple[str, str, int]:
        """The model's cheapest kind of worker per unit of capacity, as ``capacity`` takes it
        (GPU type, model, GPUs): demand is counted in its workers' capacity."""
        pools = [p for p in self.pools.values() if p.model == model]
        if not pools:
            return "h100", model, 1
        pool = min(pools, key=self._cost)
        return pool.gpu_type, model, pool.gpus

    def tick(self, now_ms: int, fleet: FleetView, held: dict[str, int] | None = None,
             out_of_service: Collection[str] = ()) -> list[ScalePool]:
        """``out_of_service``: workers whose breaker keeps them from serving (``Breakers.
        out_of_service``): a pool is given one more worker for each until its other workers
        that are warm meet its demand, and then none, so that a scale-in takes it (the local
        supervisor drains a worker whose breaker is open first)."""
        held = held or {}
        cfg = self.config
        out = []
        alive = fleet.alive(now_ms)
        learning = set()  # pools whose workers may not all have been heard yet: not commanded
        for pool in self.pools.values():
            pool.gpus = self.degree(pool, [w for w in alive if w.pool == pool.name])
            if pool.heard_ms is not None and now_ms - pool.heard_ms < fleet.heartbeat_timeout_ms:
                learning.add(pool.name)
            if (not pool.known or pool.name in learning) and not pool.commanded:
                # (a draining worker is leaving: counted, a restart during a scale-in commanded
                # it back, and the supervisor started a cold worker in its place)
                seen = sum(1 for w in alive if w.pool == pool.name and w.state != "draining")
                pool.replicas = max(pool.replicas, seen) if pool.known else seen
                pool.known = True
        self._expire_open(now_ms)
        for model in sorted({p.model for p in self.pools.values()}):
            projected, why = self.demand(model, fleet, now_ms, held.get(model, 0))
            growing, tasks = self.tasks_growing(model, now_ms)
            waiting = held.get(model, 0) + self._open_by_model[model]
            if projected != 0 or self._open_by_model[model] or model not in self._busy_ms:
                self._busy_ms[model] = now_ms
            idle_ms = now_ms - self._busy_ms[model]
            pools = sorted((p for p in self.pools.values() if p.model == model), key=self._cost)
            need = projected
            asleep = sum(p.replicas for p in pools) == 0  # a request waiting wakes the cheapest
            in_use = [p for p in pools if cfg.bounds(p.name)[1] > 0]
            wants = []
            for pool in pools:  # the demand fills the cheapest pools first
                cap = self.capacity(pool.gpu_type, model, pool.gpus)
                low, high = cfg.bounds(pool.name)
                serving = min(high, max(low, math.ceil(need / cap)))
                replacing = _to_replace(pool.name, alive, out_of_service, serving)
                want = min(high, serving + replacing)
                # (a worker out of service that its pool's cap leaves unreplaced is no
                # capacity either: its share goes on to the next pool)
                need = max(0.0, need - max(0, want - replacing) * cap)
                wants.append((pool, cap, want, (low, high), replacing))
            for pool, cap, want, bounds, replacing in reversed(wants):  # the dearest first
                before = pool.replicas
                woken = asleep and bool(in_use) and pool is in_use[0] and waiting > 0
                last = sum(p.replicas for p in pools) == pool.replicas  # the model's only pool
                reason = self._decide(pool, want, bounds, projected, idle_ms, woken, last, now_ms,
                                      tasks if growing else None)
                if replacing:
                    reason += (f"; {replacing} out of service (breaker open again after its "
                               "probe) counted as no capacity")
                if pool.replicas != before:
                    self._resized_ms[model] = now_ms
                if pool.name in learning:
                    continue
                up = sum(1 for w in alive if w.pool == pool.name)
                if up < pool.replicas:  # (cold starts; or an actuator that cannot give them)
                    reason += f"; {up} of {pool.replicas} up"
                out.append(ScalePool(
                    event_time_ms=now_ms, command_id=command_id("scale", pool.name, now_ms),
                    issued_by="autoscaler", pool=pool.name, gpu_type=pool.gpu_type, model=model,
                    replicas=pool.replicas,
                    reason=f"{why}; {cap:.0f} sequences per {pool.gpu_type} worker; {reason}"))
        return out

    def _cost(self, pool: _Pool) -> float:
        """A worker's price an hour, all its GPUs' (``worker_gpus``: as its workers last said,
        and at least the tensor parallelism its model is modelled at), per unit of its
        capacity."""
        price = self.prices.get(pool.gpu_type, unpriced_gpu_price(self.prices))
        perf = perf_model(pool.gpu_type, pool.model, pool.gpus)
        return price * worker_gpus(pool.gpus, perf) / self.capacity(pool.gpu_type, pool.model,
                                                                    pool.gpus)

    def _decide(self, pool: _Pool, want: int, bounds: tuple[int, int], projected: float,
                idle_ms: int, woken: bool, last: bool, now_ms: int,
                tasks_growing: str | None = None) -> str:
        """``bounds``: the pool's least and most workers; ``idle_ms``: how long the model has
        had no demand, no open request and started no request; ``woken``: a request waits for
        it (held, or accepted and not ended) and none of its pools has a worker; ``last``: this
        pool holds every worker the model has."""
        cfg = self.config
        low, high = bounds
        since_last_ms = now_ms - (pool.decided_ms if pool.decided_ms is not None else now_ms)
        pool.decided_ms = now_ms
        if woken:
            pool.replicas = max(1, want)
            return "woken by a request waiting for a worker"
        if pool.replicas > high:  # a cap lowered live applies at once
            pool.replicas = high
            pool.below_since_ms = None
            return f"max_replicas lowered: cut to {high}"
        if want > pool.replicas:
            pool.below_since_ms = None
            pool.replicas = want
            return f"scaled out to {want} at once"
        if projected == 0 and low == 0 and pool.replicas > 0 and \
                idle_ms >= cfg.idle_to_zero_s * 1000:
            pool.replicas = 0
            return f"idle for {cfg.idle_to_zero_s:g}s: scaled to zero"
        if projected == 0 and last and pool.replicas == 1:
            pool.below_since_ms = None  # only idle_to_zero_s takes a model's last worker
            return f"idle: holding the model's last worker until idle for {cfg.idle_to_zero_s:g}s"
        if want < pool.replicas and tasks_growing is not None:
            # The window stands still while they grow, and runs on when they stop (it is not
            # started again: growth that comes and goes, a batch of tasks now and then, would
            # otherwise hold every worker for good).
            pool.below_since_ms = now_ms if pool.below_since_ms is None else min(
                now_ms, pool.below_since_ms + since_last_ms)
            return (f"holding {pool.replicas} (wants {want}): the tasks in progress still grow "
                    f"({tasks_growing}), their later steps to come")
        if want < pool.replicas:
            if pool.below_since_ms is None:
                pool.below_since_ms = now_ms
            if now_ms - pool.below_since_ms >= cfg.scale_in_window_s * 1000:
                pool.replicas -= 1
                pool.below_since_ms = now_ms
                return f"demand below capacity for {cfg.scale_in_window_s:g}s: one worker less"
            return f"holding {pool.replicas} (wants {want}) until the scale-in window passes"
        pool.below_since_ms = None
        return f"holding {pool.replicas}"


def _to_replace(pool: str, alive: list[WorkerView], out_of_service: Collection[str],
                serving: int) -> int:
    """How many of the pool's workers out of service to replace: each of them, until the
    pool's other warm workers are as many as its demand wants serving."""
    if not out_of_service:
        return 0
    broken = [w for w in alive if w.pool == pool and w.worker_id in out_of_service
              and w.state != "draining"]
    warm = sum(1 for w in alive if w.pool == pool and w.state == "warm"
               and w.worker_id not in out_of_service)
    return len(broken) if broken and warm < serving else 0


def _sustained_growth(history: list[tuple[int, float]], now_ms: int) -> float:
    """Growth per second of the demand that lasted: the least demand of the last 5 s against the
    least of the 5 s before. A burst of long prompts that the fleet prefills within seconds is
    not growth worth a cold start; a rise that holds is."""
    half = _GROWTH_MIN_SPAN_MS
    recent = [d for t, d in history if now_ms - t < half]
    older = [d for t, d in history if now_ms - t >= half]
    if not recent or not older:
        return 0.0
    return max(0.0, (min(recent) - min(older)) / (half / 1000))
