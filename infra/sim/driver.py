"""The offline simulator's event loop: a fleet of simulated engines in virtual time, driven by the
same ``RouterCore`` (and slow controllers) as the live system. No Kafka, no wall clock.

Events, in time order (at equal times: heartbeats, deliveries, arrivals, ticks):
- arrival (``infra.sim.arrivals``: a request without a task id, and a task's first, at its time
  over ``rate_scale``; a later step once the step before it has ended, its offset in its task
  unscaled): the request goes to ``RouterCore.route``; a dispatch reaches its worker's engine
  ``bus_latency_s`` later (then the worker reports ``Started``), a denial becomes ``Rejected``,
  and a request no live worker can take yet is held and routed again on every heartbeat that
  brings a newly warm worker and on every tick, until ``hold_timeout_s`` (``Rejected``,
  ``no_capacity``), each model's in the order they came (one that comes while its model's
  requests are held is held behind them); one held with no live worker of its model is told to
  the controllers at once (``WAITING_FOR_WORKER``, as the router does live), which wakes a pool
  at zero;
- heartbeat: each worker's ``WorkerStatus`` every ``status_interval_s``, with its own phase;
- tick: the controllers' commands (to the core; ``ScalePool`` to the fleet), then
  ``RouterCore.resume`` (continuations, cancellations, failures), held requests, drained workers.
Before any event the engines it concerns are advanced to its time and what they did goes back to
the core and the controllers (``infra.sim.feedback``).
"""

import gc
import heapq
import logging
from collections.abc import Callable, Sequence
from time import perf_counter, process_time

import numpy as np

from controllers.router.core import NO_CAPACITY_RETRY_S, Decision, RouterCore
from infra.sim.arrivals import Arrivals
from infra.sim.controllers import governor_controllers
from infra.sim.feedback import Feedback, ms as _ms
from infra.sim.fleet import VirtualFleet, VirtualWorker
from infra.sim.messages import construct
from infra.sim.options import SimOptions
from infra.sim.outcomes import COMPLETED, FAILED, REJECTED, Outcomes
from infra.sim.requests import answer_hashes, inference_request, previous_steps, request_specs
from infra.stack import parse_fleet
from infra.traces import TraceRequest
from schemas import commands
from schemas.base import Message
from schemas.events import Failed, Queued, Requeued, Started, about, waiting_for_worker
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from workers.engine import CapacityError, EngineRequest
from workers.sim.models import check_spelling

logger = logging.getLogger(__name__)

_STATUS, _DELIVER, _ARRIVE, _TICK = 0, 1, 2, 3

Progress = Callable[[int, int, float], None]  # (arrived, total, virtual time)


class Simulation:
    def __init__(self, trace: Sequence[TraceRequest], options: SimOptions = SimOptions()) -> None:
        self.options = options
        self.config = options.router_config()
        self.core = RouterCore(self.config, router_id="sim-router")  # (declares its models)
        pools = parse_fleet(options.fleet)  # (a declared model's GPUs a worker: known now)
        for pool in pools:
            check_spelling(pool.model)
        unknown = sorted(set(self.config.autoscaler.pools) - {p.name for p in pools})
        if unknown and self.config.autoscaler.enabled and options.runs_controllers:
            raise ValueError(f"autoscaler.pools names {', '.join(unknown)}, which --fleet "
                             f"{options.fleet} has no pool of (a simulation scales the pools "
                             "of its fleet)")
        scaled = self.config.autoscaler.enabled and options.runs_controllers
        for pool in pools:  # (its workers start at the fleet's degree: one declared otherwise
            own = self.config.autoscaler.pools.get(pool.name)  # would plan others)
            if scaled and own is not None and own.gpus not in (None, pool.tp):
                raise ValueError(f"autoscaler.pools.{pool.name}.gpus is {own.gpus}, but --fleet "
                                 f"{options.fleet} runs its workers on {pool.tp} GPU"
                                 f"{'s' if pool.tp > 1 else ''} each (name the degree in "
                                 f"--fleet: {pool.gpu_type}:{pool.gpus}/tp{own.gpus}@"
                                 f"{pool.model})")
        self.fleet = VirtualFleet(pools,
                                  dict(self.config.gpu_prices_usd_per_hour), options.engine)
        self.controllers = governor_controllers(self.config, {p.name: p.tp for p in pools}) \
            if options.runs_controllers else []
        self.trace = trace
        slo = options.slo_rule
        self.outcomes = Outcomes(request_specs(trace, options.rate_scale, slo))
        self.stated_only = slo.stated_only  # the router sent only the targets a row states
        # the clients' cap on answers (None: each asks for its own answer's length)
        self.max_tokens = max((s.output_tokens for s in self.outcomes.specs), default=1) \
            if options.max_tokens == "longest" else None
        previous = previous_steps(trace)
        self.arrivals = Arrivals(self.outcomes.specs, previous)
        # the blocks each request's answer fills, as its engine caches them (a trace's hash ids
        # are its prompt's; the next step of its task re-sends the answer)
        self.answer_hashes = answer_hashes(trace, previous)
        self.rng = np.random.default_rng(options.seed)
        self.heap: list[tuple] = []
        self.seq = 0
        self.held: list[tuple[int, InferenceRequest, float]] = []
        self.resumed = 0
        self.now = 0.0
        self.end_s = 0.0
        self.interrupted = False  # stopped by ``run``'s ``stop`` before the trace's end
        self._announced: dict[str, str] = {}  # worker -> state of its last heartbeat
        self._cancel_slots: dict[int, int | None] = {}
        self._breakers: dict[str, str] = {}  # worker -> breaker state last commanded
        self.breakers_opened = 0
        # where the wall time goes: RouterCore.route/resume, the engines, the controllers' ticks
        self.wall_router_s = self.wall_controllers_s = 0.0
        self.feedback = Feedback(self.core, self.controllers, self.outcomes, trace,
                                 on_end=lambda i: self.arrivals.ended(i, self.now))
        self._advance, self._observe = self.feedback.advance, self.feedback.observe
        self._finish = self.feedback.finish

    # -- the loop --------------------------------------------------------------------------
    def run(self, progress: Progress | None = None,
            stop: Callable[[], bool] | None = None) -> "Simulation":
        """Simulate the whole trace, or until ``stop()`` says so at a tick (``interrupted``: the
        run ends there, the requests then in flight or not yet arrived unfinished)."""
        started, started_cpu = perf_counter(), process_time()
        n = len(self.outcomes)
        for w in self.fleet.active():
            self._push(0.0, _STATUS, w)
        self._push(self.options.tick_s, _TICK, None)
        # The cycle collector is off while the loop runs: the loop makes millions of short-lived
        # messages, views and tuples, which reference counting frees, and the collector's passes
        # over them (every 700 allocations, over the trace and the prefix index too at a full
        # one) took 7% of a Mooncake hour's CPU time to find the 78 objects it holds in cycles.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._loop(progress, stop)
        finally:
            if collecting:
                gc.enable()
        # The run ends when its last request does (or at its last arrival), not at the tick that
        # saw it end: the fleet is paid to then. A run given up on ends where it stopped.
        arrivals = self.arrivals
        ends = [e for e in self.outcomes.end_s if e is not None]
        self.end_s = self.now if self.interrupted else max(
            [arrivals.last_s] + ends + ([self.now] if self.done < n else []))
        self.fleet.end(self.end_s)
        self.wall_s = perf_counter() - started
        self.cpu_s = process_time() - started_cpu  # the machine may be shared: CPU time too
        if progress is not None and not self.interrupted:
            progress(n, n, self.end_s)
        return self

    def _loop(self, progress: Progress | None, stop: Callable[[], bool] | None) -> None:
        """The events in time order, until the trace is done, given up on or stopped."""
        arrivals, n = self.arrivals, len(self.outcomes)
        while True:
            due = arrivals.next()
            if due is not None and (not self.heap or (due[0], _ARRIVE) < self.heap[0][:2]):
                t = self.now = due[0]
                i = arrivals.pop()
                self._advance_all(t)
                self._arrive(i, t)
                continue
            t, kind, _, payload = heapq.heappop(self.heap)
            self.now = t
            if kind == _STATUS:
                self._heartbeat(payload, t)
            elif kind == _DELIVER:
                self._deliver(payload, t)
            else:
                self._tick(t)
                if progress is not None:  # (a sparse trace's ticks far outnumber its arrivals)
                    progress(arrivals.arrived, n, t)
                # given up on: drain_limit_s after the last arrival (a step whose previous step
                # never ended is never sent)
                if not arrivals.pending() and (self.feedback.done >= n
                                               or t > arrivals.last_s + self.options.drain_limit_s):
                    break
                if stop is not None and stop():
                    self.interrupted = True
                    break
                self._push(t + self.options.tick_s, _TICK, None)

    @property
    def done(self) -> int:
        """Requests in a terminal state."""
        return self.feedback.done

    @property
    def wall_engines_s(self) -> float:
        return self.feedback.wall_engines_s

    def _push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, payload))

    # -- engines -> router -----------------------------------------------------------------
    def _advance_all(self, t: float) -> None:
        for w in self.fleet.workers.values():
            if w.stopped_s is None:
                due = w.engine.next_event_s()
                if due is not None and due <= t:
                    self._advance(w, t)

    # -- events ----------------------------------------------------------------------------
    def _arrive(self, i: int, t: float) -> None:
        r, spec = self.trace[i], self.outcomes.specs[i]
        created = _ms(t)
        request = inference_request(i, r, spec, created, self.max_tokens,
                                    self.options.steps_total == "trace", self.stated_only)
        if self.held and any(held.model == request.model for _, held, _ in self.held):
            self._hold(i, request, t)  # behind its model's requests held before it, as live
        else:
            self._decided(i, request, self._route(request, created), t)

    def _route(self, request: InferenceRequest, now_ms: int) -> Decision:
        started = perf_counter()
        decision = self.core.route(request, now_ms)
        self.wall_router_s += perf_counter() - started
        return decision

    def _decided(self, i: int, request: InferenceRequest, decision: Decision, t: float) -> bool:
        """Act on a routing decision; False when the request must wait."""
        if decision.dispatch is not None:
            if not self.outcomes.attempts[i] and self.controllers:
                self._queued(decision.dispatch.request, t)
            self.outcomes.attempts[i] += 1
            self.fleet.workers[decision.dispatch.worker_id].in_transit += 1
            self._push(t + self.options.bus_latency_s, _DELIVER, decision.dispatch)
        elif decision.denial is not None:
            denial = decision.denial
            self._finish(i, REJECTED, t, denial.reason, retry_after_s=denial.retry_after_s)
        else:
            if request is not None:
                self._hold(i, request, t)
            return False
        return True

    def _hold(self, i: int, request: InferenceRequest, t: float) -> None:
        """A request begins to wait for a worker; with no live worker of its model the
        controllers are told at once (as the router says it live)."""
        self.held.append((i, request, t))
        if self.controllers and not self.core.fleet.live(_ms(t), request.model):
            waiting = waiting_for_worker(request.model, _ms(t), self.options.hold_timeout_s)
            for controller in self.controllers:
                controller.observe(waiting, _ms(t))

    def _queued(self, req: InferenceRequest, t: float) -> None:
        """The router accepted ``req`` (its first dispatch): the ``Queued`` the controllers
        read live (the core does not need its own answer)."""
        queued = construct(Queued, event_time_ms=_ms(t), **about(req),
                           prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                           priority=req.priority, step=req.step, steps_total=req.steps_total,
                           deadline_ms=req.deadline_ms, ttft_slo_s=req.ttft_slo_s)
        for controller in self.controllers:
            controller.observe(queued, _ms(t))

    def _deliver(self, message: Dispatch | CancelRequest, t: float) -> None:
        """A message on a worker's dispatch partition reaches the worker (in order)."""
        if isinstance(message, CancelRequest):
            w = self.fleet.by_slot.get(self._cancel_slots.pop(id(message)))
            if w is not None and w.attempts.get(message.request_id) == message.attempt:
                self._advance(w, t)
                if w.engine.abort(message.request_id):
                    del w.attempts[message.request_id]
                    # Recalled: the worker hands the request back, as a live worker does.
                    flight = self.core.in_flight.get(message.request_id)
                    self._observe(construct(
                        Requeued, event_time_ms=_ms(t), request_id=message.request_id,
                        worker_id=w.worker_id, attempt=message.attempt,
                        tokens_done=flight.tokens_done if flight else 0,
                        detail=message.reason), _ms(t))
            return
        dispatch = message
        w = self.fleet.workers[dispatch.worker_id]
        w.in_transit -= 1
        req = dispatch.request
        i = int(req.request_id[1:])
        if w.stopped_s is not None or self.outcomes.is_done(i):
            return  # a stopped worker: the router resumes the request elsewhere
        self._advance(w, t)
        now_ms = _ms(t)
        common = dict(event_time_ms=now_ms, request_id=req.request_id, task_id=req.task_id,
                      tenant=req.tenant, model=req.model, worker_id=w.worker_id)
        try:
            w.engine.add(EngineRequest(
                request_id=req.request_id, prompt_tokens=req.prompt_tokens,
                max_tokens=req.max_tokens, resume_from_token=dispatch.resume_from_token,
                prefix_hashes=tuple(req.prefix_hashes), hash_block_size=req.block_size,
                answer_tokens=self.outcomes.specs[i].output_tokens,
                answer_hashes=self.answer_hashes[i]), t)
        except CapacityError as exc:
            self._finish(i, FAILED, t, "invalid_request", w.worker_id)
            self._observe(construct(Failed, **common, attempt=dispatch.attempt,
                                    reason="invalid_request", detail=str(exc)), now_ms)
            return
        self.feedback.where[req.request_id] = w.worker_id
        w.attempts[req.request_id] = dispatch.attempt
        self._observe(construct(Started, **common, attempt=dispatch.attempt), now_ms)

    def _heartbeat(self, w: VirtualWorker, t: float) -> None:
        if w.stopped_s is not None:
            return
        self._advance(w, t)
        status = w.status(t)
        self._observe(status, _ms(t))
        newly_warm = status.state == "warm" and self._announced.get(w.worker_id) != "warm"
        if newly_warm and w.worker_id in self._announced:
            self.fleet.record(t)  # a cold worker (or a drained one taken back) serves again
        self._announced[w.worker_id] = status.state
        if newly_warm and self.held:
            self._retry_held(t)
        self._push(t + self.options.status_interval_s, _STATUS, w)

    def _tick(self, t: float) -> None:
        self._advance_all(t)
        now_ms = _ms(t)
        for controller in self.controllers:
            started = perf_counter()
            commands_ = controller.tick(now_ms)
            self.wall_controllers_s += perf_counter() - started
            for command in commands_:
                self._command(command, t)
        started = perf_counter()
        emits = self.core.resume(now_ms)
        self.wall_router_s += perf_counter() - started
        for emit in emits:
            self._resumed(emit.message, emit.slot, t)
        if self.held:
            self._retry_held(t)
        for w in self.fleet.stop_idle_drained(t):
            self._observe(w.status(t), now_ms)
            self._announced[w.worker_id] = "stopped"

    def _command(self, command: Message, t: float) -> None:
        if isinstance(command, commands.ScalePool):
            added, _ = self.fleet.scale(command.pool, command.gpu_type, command.model,
                                        command.replicas, t)
            for w in added:
                self._push(t + float(self.rng.uniform(0, self.options.status_interval_s)), _STATUS, w)
        else:
            if isinstance(command, commands.SetBreakerState):
                if command.state == "open" and self._breakers.get(command.worker_id) != "open":
                    self.breakers_opened += 1
                self._breakers[command.worker_id] = command.state
            self.core.observe(command, _ms(t))

    def _resumed(self, message: Message, slot: int | None, t: float) -> None:
        if isinstance(message, Dispatch):
            self.resumed += 1
            self._decided(int(message.request.request_id[1:]), None, Decision(dispatch=message), t)
            return
        rid = message.request_id
        if isinstance(message, CancelRequest):  # travels behind the dispatch it supersedes
            self._cancel_slots[id(message)] = slot
            self._push(t + self.options.bus_latency_s, _DELIVER, message)
        elif message.type in ("completed", "failed"):
            old = self.feedback.where.get(rid)
            if old is not None and self.fleet.workers[old].engine.abort(rid):
                self.fleet.workers[old].attempts.pop(rid, None)
            state = COMPLETED if message.type == "completed" else FAILED
            self._finish(int(rid[1:]), state, t, getattr(message, "reason", None))
            for c in self.controllers:
                c.observe(message, _ms(t))

    def _retry_held(self, t: float) -> None:
        """Route the held requests again, each model's in the order they came (one still
        waiting holds back its model's later ones, as live); refuse those held long enough."""
        held, self.held = self.held, []
        still: set[str] = set()  # models whose first request held still waits
        for i, request, since in held:
            if request.model not in still:
                if self._decided(i, None, self._route(request, _ms(t)), t):
                    continue
                still.add(request.model)
            if t - since >= self.options.hold_timeout_s:
                self._finish(i, REJECTED, t, "no_capacity", retry_after_s=NO_CAPACITY_RETRY_S)
            else:
                self.held.append((i, request, since))
