"""Circuit breakers per worker: a pure, ticked controller. Time is passed in.

A worker's breaker opens when
- it is slow: for ``consecutive`` heartbeats its *slowness*, the inter-token latency it reports
  (``WorkerStatus.itl_ms``) divided by what the performance model expects for the load it reports
  (its running batch, their mean context from the KV blocks they hold, and its prefill backlog: a
  worker busy with long prefills or long contexts is slow per token, not broken), exceeds
  ``itl_ratio`` times the larger of 1 and its peers' median slowness (the other workers of its
  pool, or of the fleet when it has no pool peer; as of the fleet's latest round of heartbeats,
  from a sorted snapshot rebuilt once a round, so that a heartbeat costs a bisection, not a pass
  over the fleet). Peers set the bar when the whole fleet runs
  slower than the model says (a model calibrated on other hardware); the model sets it when
  they run as fast or faster, so an overloaded fleet, whose latencies spread widely but each as
  its load predicts, opens no breaker; or
- it fails: at least ``error_rate`` of its last outcomes (at least ``min_outcomes``, within the
  last 60 s; an attempt's end counted once, however often it is read) were failures. An outcome
  is placed at the time it happened (the event's own, no later than when it is read), not when
  it is read: one read late (a lagging consumer, a writer that sent it late) counts only while
  it is within those 60 s, and not at all once older, nor from before the breaker last opened
  or went half-open.
After ``cooldown_s`` an open breaker goes half-open: the router sends it one probe at a time. A
half-open worker that reports a normal latency (or a success) closes; a slow or failing one opens
again (a probe is the attempt started while half-open: an earlier attempt's end is not its).
A breaker never opens when that would leave no warm worker with a closed breaker for the model.

Each tick returns the changes, and the state of every worker it hears of for the first time
(a router may hold an open state an earlier controller process commanded); every restatement
the whole desired state of every breaker that is not closed: ``SetBreakerState`` commands with
the signals and thresholds behind them. A restarted process continues from the states its
predecessor commanded (``continue_from``, read back from the control topic): an open breaker
stays open until its cooldown, counted from when it opened, is over.
"""

import bisect
from collections import deque
from dataclasses import dataclass, field

from controllers.router.candidates import CHUNK_TOKENS, perf_model
from controllers.router.fleet import FleetView, WorkerView, heard_ms
from schemas.commands import SetBreakerState, command_id
from schemas.config import BreakerConfig
from schemas.events import WorkerStatus

_OUTCOME_WINDOW_MS = 60_000
#: Outcomes kept a worker: its latest, at least ``min_outcomes`` of them (``observe_outcome``).
OUTCOMES_KEPT = 50
#: Tokens per KV block (vLLM's default block size, which the workers report blocks in).
KV_BLOCK_TOKENS = 16


_GONE = ("stopped", "crashed")  # states of a worker that will not serve again
#: A worker silent this long, and past its heartbeat timeout, is gone: its breaker is forgotten.
FORGET_MS = 300_000
RESTATED = "periodic restatement"  # what a restated state's reason begins with


@dataclass
class _Breaker:
    state: str = "closed"
    since_ms: int = 0
    slow_streak: int = 0
    last_itl_ms: float | None = None
    last_ratio: float | None = None
    last_expected_ms: float | None = None  # the expected latency at the previous heartbeat
    outcomes: deque = field(default_factory=lambda: deque(maxlen=OUTCOMES_KEPT))  # (time_ms, ok)
    #: the attempts whose ends it counted, (request id, attempt), the latest as many as it keeps
    #: outcomes (``observe_outcome``: one attempt's end read twice is one outcome)
    counted: dict = field(default_factory=dict)
    last_failure_ms: int | None = None  # the time of the latest failure observed
    #: outcomes that happened before this are not counted: opening, or going half-open, cleared
    #: the evidence gathered before (``_set``; ``continue_from``: since the state read back)
    evidence_from_ms: int = 0
    #: the attempts started on it while half-open, request id -> attempt (None: not said)
    probes: dict[str, int | None] = field(default_factory=dict)
    probe_succeeded: bool = False  # one of them completed
    probe_failed: bool = False  # one of them failed
    reason: str = ""
    heard_ms: int | None = None  # the latest heartbeat judged (a duplicate is not judged again)
    started_ms: int | None = None  # the worker's start, as its heartbeats say
    #: its state was told since this controller first heard of the worker (a router may still
    #: hold a state an earlier controller process commanded)
    announced: bool = False
    #: opened again after a probe since it was last closed: out of service (``out_of_service``)
    reopened: bool = False
    #: the time of the latest command read back of its state (``continue_from``; None: none)
    commanded_ms: int | None = None


@dataclass
class _Peers:
    """The slowness of the workers that can be peers, at one moment, sorted: per pool, over the
    fleet, and each worker's own (its pool and value) so that it can be left out of its median."""
    by_pool: dict[str, list[float]] = field(default_factory=dict)
    fleet: list[float] = field(default_factory=list)
    own: dict[str, tuple[str, float]] = field(default_factory=dict)
    judged: set[str] = field(default_factory=set)  # workers judged against it since it was built


def _median_without(values: list[float], drop: float | None) -> float | None:
    """The median of the sorted ``values`` less one occurrence of ``drop`` (which they hold;
    None: none left out), or None when nothing is left."""
    skip = len(values) if drop is None else bisect.bisect_left(values, drop)
    n = len(values) - (drop is not None)
    if n <= 0:
        return None

    def at(k: int) -> float:
        return values[k + (k >= skip)]
    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2


class Breakers:
    def __init__(self, config: BreakerConfig = BreakerConfig()) -> None:
        self.config = config
        self._workers: dict[str, _Breaker] = {}
        self._fleet: FleetView | None = None
        self._peers: _Peers | None = None
        self._ticks = 0

    def known(self) -> set[str]:
        """The workers whose breakers it tracks (``desired`` forgets those gone)."""
        return set(self._workers)

    def state(self, worker_id: str) -> str:
        b = self._workers.get(worker_id)
        return b.state if b else "closed"

    def _breaker(self, worker_id: str) -> _Breaker:
        # not setdefault(worker_id, _Breaker()): that builds a breaker on every heartbeat
        b = self._workers.get(worker_id)
        if b is None:
            b = self._workers[worker_id] = _Breaker()
        return b

    def observe_status(self, status: WorkerStatus, fleet: FleetView,
                       now_ms: int | None = None) -> None:
        """A heartbeat, heard at ``now_ms`` (the controller's clock; None: trust the heartbeat's
        own time, which counts at most ``MAX_AHEAD_MS`` ahead of it): update the worker's
        slowness streak against its peers."""
        self._fleet = fleet
        b = self._breaker(status.worker_id)
        at_ms = heard_ms(status, now_ms)
        if b.heard_ms is not None and at_ms <= b.heard_ms:
            return  # delivered twice, or late: judged once, in order
        if b.started_ms is not None and b.started_ms != status.started_ms or \
                b.started_ms is None and b.state != "closed" and status.started_ms > b.since_ms:
            # started again under its id (since the state read back was commanded, too): judged
            # afresh, closed (the router drops its state too)
            b = self._workers[status.worker_id] = _Breaker()
        b.heard_ms, b.started_ms = at_ms, status.started_ms
        expected = _expected_itl_ms(status)
        previous, b.last_expected_ms = b.last_expected_ms, expected
        if status.itl_ms is None or status.running == 0:
            return  # nothing ran: no evidence either way
        if not status.steps:
            # Judged by the load as of now while the latency covers the interval since the
            # previous heartbeat: a long prefill that ended in between slowed the interval
            # without showing. (With the interval's steps, a step still running at the heartbeat
            # counts in the next interval, its time in this one: one heartbeat at most looks
            # slower than it is, and a breaker needs ``consecutive`` of them.)
            expected = max(expected, previous or 0.0)
        b.last_itl_ms = status.itl_ms / expected
        median = self._peer_median(status, fleet, at_ms)
        if median is None:
            return
        ratio = b.last_itl_ms / max(median, 1.0)
        b.last_ratio = ratio
        b.slow_streak = b.slow_streak + 1 if ratio > self.config.itl_ratio else 0

    def continue_from(self, command: SetBreakerState) -> None:
        """A state an earlier controller process commanded, read back from the control topic in
        order: the breaker is in that state since the first command of it in a row (a state is
        restated every few seconds), and opened again after its probe where it went from
        half-open to open. Its evidence (latencies, outcomes, probes) is gathered afresh."""
        b = self._breaker(command.worker_id)
        if command.state != b.state or b.commanded_ms is None:
            if command.state == "closed" or command.state == "open" and b.state == "half_open":
                b.reopened = command.state == "open"
            b.state, b.since_ms = command.state, command.event_time_ms
            if b.state != "closed":
                b.evidence_from_ms = b.since_ms
        b.commanded_ms, b.reason = command.event_time_ms, command.reason.removeprefix(
            f"{RESTATED}: ")

    def summary(self) -> str:
        """The breakers that are not closed, and their states (for a log line)."""
        return ", ".join(f"{wid} {b.state}" for wid, b in sorted(self._workers.items())
                         if b.state != "closed")

    def observe_outcome(self, worker_id: str, ok: bool, now_ms: int,
                        request_id: str = "", attempt: int | None = None,
                        happened_ms: int | None = None) -> None:
        """The end of ``request_id``'s ``attempt`` on the worker (a hand-back its engine caused
        counts as a failure), read at ``now_ms`` (the controller's clock), happened at
        ``happened_ms`` (the event's own time; None: when read). An attempt's end counts once:
        read again (a record its writer sent twice; the router's ``Completed`` of an attempt
        whose worker it lost, with the whole answer streamed, and the worker's own) it is not
        counted again, or a failure read three times would open a breaker that three successes
        in four keep closed. An end that names no attempt (a ``Failed`` of a writer older than
        the field) counts each time, as it did before.

        The error rate is judged by when the outcomes happened, taken no later than ``now_ms``
        (a writer's clock ahead must not keep a failure recent longer). One that happened more
        than the window (60 s) before it is read, or before the breaker last opened or went
        half-open (whose evidence that cleared), or before every one of the worker's latest
        outcomes kept, does not count at all: not in the rate, not as its latest failure. Before
        7 Dec each was placed when read, so failures read late (a consumer lagging, a writer
        sending late) counted as recent: they could open the breaker of a worker healthy by
        then, or open a half-open one again. Such an end still closes out a probe (an attempt
        started while half-open): it is the probe's answer however late it is read."""
        b = self._breaker(worker_id)
        key = (request_id, attempt) if request_id and attempt is not None else None
        if key is not None and key in b.counted:
            return
        if request_id in b.probes and (attempt is None or b.probes[request_id] in (None, attempt)):
            b.probe_succeeded, b.probe_failed = b.probe_succeeded or ok, b.probe_failed or not ok
        at_ms = now_ms if happened_ms is None else min(happened_ms, now_ms)
        if at_ms < max(now_ms - _OUTCOME_WINDOW_MS, b.evidence_from_ms):
            return  # (not remembered as counted either: that would push out those that count)
        if b.outcomes.maxlen < self.config.min_outcomes:  # (set above what it keeps: before
            # 7 Dec, 50 kept, a min_outcomes of 51 or more never let the error rate count)
            b.outcomes = deque(b.outcomes, maxlen=self.config.min_outcomes)
        outcomes = b.outcomes
        if outcomes and at_ms < outcomes[-1][0]:  # read out of order: kept in time order, so
            # that the latest kept are the latest that happened
            if len(outcomes) == outcomes.maxlen:
                if at_ms < outcomes[0][0]:
                    return  # older than every one kept
                outcomes.popleft()
            outcomes.insert(bisect.bisect_right(outcomes, at_ms, key=_time_of), (at_ms, ok))
        else:
            outcomes.append((at_ms, ok))
        if key is not None:
            b.counted[key] = None
            if len(b.counted) > max(OUTCOMES_KEPT, self.config.min_outcomes):
                del b.counted[next(iter(b.counted))]
        if not ok:
            b.last_failure_ms = max(at_ms, b.last_failure_ms or at_ms)

    def observe_started(self, worker_id: str, request_id: str,
                        attempt: int | None = None) -> None:
        """An attempt of a request began on a worker: while its breaker is half-open, that is a
        probe, which only that attempt's end closes out. An earlier attempt of the request on
        the worker, from before the breaker opened (the router continues a request on the
        worker of a replaced attempt where no other can take it), may end late: that is no
        probe's end. (An end that names no attempt, from an older writer, is told by request.)"""
        b = self._workers.get(worker_id)
        if b is not None and b.state == "half_open":
            b.probes[request_id] = attempt

    def _peer_median(self, status: WorkerStatus, fleet: FleetView, at_ms: int) -> float | None:
        """The median slowness of the closed breakers' live workers but ``status``'s: of its
        pool, or of every pool when it has no pool peer (None: no peer at all). Read from a
        snapshot of the fleet rebuilt the first time a worker is judged again since it was built:
        once per round of heartbeats, not on each."""
        snapshot = self._peers
        if snapshot is None or status.worker_id in snapshot.judged:
            snapshot = self._peers = self._snapshot(at_ms, fleet)
        snapshot.judged.add(status.worker_id)
        me = fleet.get(status.worker_id)
        pool = me.pool if me is not None else None  # None: every peer is of another pool
        own_pool, own = snapshot.own.get(status.worker_id, (None, None))
        median = _median_without(snapshot.by_pool.get(pool, []), own if own_pool == pool else None)
        return median if median is not None else _median_without(snapshot.fleet, own)

    def _snapshot(self, at_ms: int, fleet: FleetView) -> _Peers:
        horizon = at_ms - fleet.heartbeat_timeout_ms  # a silent one is no peer
        peers = _Peers()
        for worker_id, b in self._workers.items():
            if b.last_itl_ms is None or b.state != "closed":
                continue
            w = fleet.get(worker_id)
            if w is not None and w.last_seen_ms >= horizon and w.state not in _GONE:
                peers.by_pool.setdefault(w.pool, []).append(b.last_itl_ms)
                peers.fleet.append(b.last_itl_ms)
                peers.own[worker_id] = (w.pool, b.last_itl_ms)
        for values in (*peers.by_pool.values(), peers.fleet):
            values.sort()
        return peers

    def tick(self, now_ms: int, fleet: FleetView) -> list[SetBreakerState]:
        cfg = self.config
        alive = fleet.alive(now_ms)
        changed: list[SetBreakerState] = []
        for w in alive:
            b = self._breaker(w.worker_id)
            failing, failure_note = self._failing(b, now_ms)
            slow = b.slow_streak >= cfg.consecutive
            if b.state == "closed" and (slow or failing):
                if self._last_closed(w, alive):
                    continue  # never open every worker of a model
                b.reason = failure_note if failing else (
                    f"inter-token latency {b.last_itl_ms:.2f}x what its load predicts is "
                    f"{b.last_ratio:.1f}x the larger of 1 and its peers' median (threshold "
                    f"{cfg.itl_ratio}x) for {b.slow_streak} heartbeats")
                self._set(b, "open", now_ms, changed, w.worker_id)
            elif b.state == "open" and now_ms - b.since_ms >= cfg.cooldown_s * 1000:
                b.reason = f"cooldown of {cfg.cooldown_s}s over: probing"
                b.slow_streak = 0
                # only the probe's own evidence closes it: a latency measured from now on, or a
                # request started from now on that completes
                b.last_itl_ms = b.last_ratio = None
                b.probes, b.probe_succeeded, b.probe_failed = {}, False, False
                self._set(b, "half_open", now_ms, changed, w.worker_id)
            elif b.state == "half_open":
                if (slow or failing or b.probe_failed) and self._last_closed(w, alive):
                    # never open every worker of a model: its peers left while it was open
                    # (scaled in, crashed), and opened again it served one probe a cooldown
                    b.reason = ("its model's last warm worker: closed though its probe was "
                                "slow or failed (no other worker of the model takes requests)")
                    self._set(b, "closed", now_ms, changed, w.worker_id)
                elif slow or failing or b.probe_failed:
                    b.reopened = True
                    b.reason = "probe was slow or failed: " + (
                        failure_note or ("a probe failed" if b.probe_failed else
                                         f"inter-token latency {b.last_ratio:.1f}x the larger "
                                         f"of 1 and its peers' median (threshold "
                                         f"{cfg.itl_ratio}x) for {b.slow_streak} heartbeats"))
                    self._set(b, "open", now_ms, changed, w.worker_id)
                elif b.last_ratio is not None and b.last_ratio <= cfg.itl_ratio and b.slow_streak == 0:
                    b.reason = f"probe healthy: latency {b.last_ratio:.1f}x its peers' median"
                    self._set(b, "closed", now_ms, changed, w.worker_id)
                elif b.probe_succeeded:
                    b.reason = "probe succeeded"
                    self._set(b, "closed", now_ms, changed, w.worker_id)
            if not b.announced:
                b.announced = True
                if b.state == "closed" and (not changed or changed[-1].worker_id != w.worker_id):
                    b.reason = "heard: closed (new to this controller, or back after it was gone)"
                    changed.append(_command(w.worker_id, b, now_ms, b.reason))
        self._ticks += 1
        return changed

    def desired(self, now_ms: int, reason: str = RESTATED) -> list[SetBreakerState]:
        """The state of every breaker that is not closed (level-triggered restatement); a worker
        that stopped, crashed or has been silent for ``forget_after_ms`` is forgotten, and so is one
        that never heart-beat whose last outcome is that old."""
        fleet = self._fleet
        for wid in [w for w in self._workers if fleet is not None and self._gone(w, now_ms)]:
            del self._workers[wid]
        return [
            _command(wid, b, now_ms, f"{reason}: {b.reason}")
            for wid, b in sorted(self._workers.items()) if b.state != "closed"
        ]

    def _gone(self, worker_id: str, now_ms: int) -> bool:
        view = self._fleet.get(worker_id)
        if view is None:  # (one read back is kept as long as one with outcomes)
            b = self._workers[worker_id]
            last = max(b.outcomes[-1][0] if b.outcomes else -1, b.commanded_ms or -1)
            return last < now_ms - FORGET_MS
        return view.state in _GONE or view.last_seen_ms < now_ms - forget_after_ms(self._fleet)

    def _failing(self, b: _Breaker, now_ms: int) -> tuple[bool, str]:
        # Every tick asks for every worker; most have too few outcomes or no recent failure
        # (error_rate > 0: no failure, no rate to reach), and need no pass over their outcomes.
        if len(b.outcomes) < self.config.min_outcomes or b.last_failure_ms is None \
                or now_ms - b.last_failure_ms > _OUTCOME_WINDOW_MS:
            return False, ""
        recent = [ok for t, ok in b.outcomes if now_ms - t <= _OUTCOME_WINDOW_MS]
        if len(recent) < self.config.min_outcomes:
            return False, ""
        rate = recent.count(False) / len(recent)
        if rate >= self.config.error_rate:
            return True, (f"{recent.count(False)} of its last {len(recent)} requests failed "
                          f"(threshold {self.config.error_rate:.0%})")
        return False, ""

    def _last_closed(self, worker: WorkerView, alive: list[WorkerView]) -> bool:
        """Whether no other warm worker of its models has a closed breaker (one loading,
        draining or asleep takes no request)."""
        others = [w for w in alive if w.worker_id != worker.worker_id and w.state == "warm"
                  and set(w.models) & set(worker.models) and self.state(w.worker_id) == "closed"]
        return not others

    def out_of_service(self) -> set[str]:
        """The workers whose breaker opened again after a probe and has not closed since: not
        a passing slowness but a worker to replace (the autoscaler counts it as no capacity)."""
        return {wid for wid, b in self._workers.items() if b.reopened and b.state != "closed"}

    def _set(self, b: _Breaker, state: str, now_ms: int, out: list, worker_id: str) -> None:
        b.state, b.since_ms = state, now_ms
        if state == "closed":
            b.reopened = False
        else:
            b.outcomes.clear()
            b.evidence_from_ms = now_ms
        out.append(_command(worker_id, b, now_ms, b.reason))


def _time_of(outcome: tuple[int, bool]) -> int:
    return outcome[0]


def forget_after_ms(fleet: FleetView) -> int:
    """How long a worker is silent before it is forgotten: ``FORGET_MS``, or its heartbeat
    timeout where that is longer (``worker_heartbeat_timeout_s`` goes up to a day), so that no
    worker still alive by it is."""
    return max(FORGET_MS, fleet.heartbeat_timeout_ms)


def _expected_itl_ms(status: WorkerStatus) -> float:
    """The step time the performance model expects for the work a heartbeat reports, decoding at
    the mean context its KV blocks hold (1,024 tokens when it reports none).

    Where the worker counts its work since the previous heartbeat (``steps``), each of those
    steps prefilled its share of the prompt tokens computed and decoded its share of the tokens
    generated: what a slow GPU did, judged as it happened. More prefilled than one chunk is taken
    for one long prompt, whose chunks attend on average to the part before them. Otherwise each
    step is taken to prefill up to one chunk of the backlog it reports now and to decode the
    running batch; a backlog longer than a chunk is one long prompt, attending to half of it."""
    model = status.models_loaded[0] if status.models_loaded else "llama-3-8b"
    running = max(status.running, 1)
    context = status.kv_blocks_used * KV_BLOCK_TOKENS / running if status.kv_blocks_used else 1024
    if status.steps:
        prefilled = status.prefilled_tokens or 0
        chunk = round(prefilled / status.steps)
        chunk_context = max(prefilled - CHUNK_TOKENS, 0) / 2
        decoding = max(round((status.generated_tokens or 0) / status.steps), 1)
    else:
        backlog = status.prefill_backlog_tokens or 0
        chunk = min(backlog, CHUNK_TOKENS)
        chunk_context = backlog / 2 if backlog > CHUNK_TOKENS else 0
        decoding = running
    perf = perf_model(status.gpu_type, model, status.gpus)
    return 1000 * perf.step_s(chunk, chunk_context, decoding, context)


def _command(worker_id: str, b: _Breaker, now_ms: int, reason: str) -> SetBreakerState:
    return SetBreakerState(event_time_ms=now_ms, command_id=command_id("breaker", worker_id, now_ms),
                           issued_by="breakers", reason=reason[:2048], worker_id=worker_id,
                           state=b.state)
