"""The virtual fleet: one simulated engine per worker, pools that grow cold and shrink by
draining, heart-beats as live workers send them, and what the fleet costs.

A worker runs on its pool's ``tp`` GPUs (the degree ``--fleet`` names, ``h100:8/tp4@...``, or the
least tensor parallelism whose GPUs hold its model: one for Llama-3-8B, two H100s for Llama-2-70B),
its engine on the performance model of that degree. It costs its GPUs' price per hour from the
moment it is provisioned until it stops, whether it is busy, idle, loading weights or draining.
Workers of the starting fleet are provisioned warm at time 0; a worker added by a ``ScalePool``
starts cold and serves only after its model loads (``PerfModel.load_s``, about 28 s for Llama-3-8B,
54 s for Llama-2-70B on two H100s). A worker removed by a ``ScalePool`` drains: it takes no new
work (its status says ``draining``), finishes what it holds, then stops; a scale-out before it
stops takes it back instead of starting a cold one.
"""

from dataclasses import dataclass, field

from infra.stack import PoolSpec, worker_tp
from infra.sim.messages import Template
from schemas.events import WorkerStatus
from workers.engine import interval_report
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.models import gpu_spec
from workers.sim.perf import PerfModel


@dataclass(slots=True, eq=False)
class VirtualWorker:
    worker_id: str
    slot: int
    pool: PoolSpec
    engine: SimEngine
    price_per_hour: float
    started_s: float
    stopped_s: float | None = None
    draining: bool = False
    drained_s: float = 0.0  # when it was last told to drain
    in_transit: int = 0  # dispatches on their way to it (on the bus)
    completed: int = 0
    attempts: dict[str, int] = field(default_factory=dict)  # request id -> attempt it runs
    # inter-token latency since the last status, as the live worker measures it
    seq_seconds: float = 0.0
    decode_seconds: float = 0.0
    tokens: int = 0
    last_advance_s: float = 0.0
    #: the engine's steps and prefilled tokens at the previous heartbeat
    work_reported: tuple[int | None, int | None] = (None, None)
    _status: Template | None = None  # the fields every heartbeat of this worker shares

    @property
    def stopped(self) -> bool:
        return self.stopped_s is not None

    @property
    def busy(self) -> bool:
        """It holds work, or work is on its way to it."""
        return self.in_transit > 0 or self.engine.next_event_s() is not None

    def hours(self, end_s: float) -> float:
        """Its hours provisioned until ``end_s`` (one worker's, not its GPUs')."""
        until = min(self.stopped_s, end_s) if self.stopped else end_s
        return max(0.0, until - self.started_s) / 3600

    def status(self, now_s: float) -> WorkerStatus:
        engine = self.engine
        fields = engine.status_fields()  # (no EngineStats between: ~113k heartbeats a run)
        if self.stopped:
            fields["state"] = "stopped"
        elif self.draining and fields["state"] == "warm":
            fields["state"] = "draining"
        # (the engine counts its steps and prefilled tokens as an EngineStats names them)
        fields.update(interval_report(self.seq_seconds, self.tokens, self.work_reported, engine,
                                      decode_seconds=self.decode_seconds))
        self.work_reported = (engine.steps, engine.prefilled_tokens)
        self.seq_seconds, self.decode_seconds, self.tokens = 0.0, 0.0, 0
        if self._status is None:
            self._status = Template(
                WorkerStatus, worker_id=self.worker_id, slot=self.slot, pool=self.pool.name,
                gpu_type=self.pool.gpu_type, gpus=self.pool.tp,
                started_ms=int(self.started_s * 1000), max_model_len=engine.max_model_len)
        fields["event_time_ms"] = int(now_s * 1000)
        fields["models_loaded"] = [self.pool.model]
        fields["requests_completed"] = self.completed
        return self._status.of(fields)


@dataclass
class VirtualFleet:
    pools: list[PoolSpec]
    prices: dict[str, float]
    engine_config: SimEngineConfig = SimEngineConfig(emit_tokens=False)
    workers: dict[str, VirtualWorker] = field(default_factory=dict)
    by_slot: dict[int, VirtualWorker] = field(default_factory=dict)
    #: (time_s, provisioned, serving) at every change of the fleet
    timeline: list[tuple[float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._perf: dict[tuple[str, str], PerfModel] = {}
        self._next_slot = 0
        for pool in self.pools:
            gpu_spec(pool.gpu_type)  # (an unknown GPU is no missing price: said as such)
            if pool.gpu_type not in self.prices:
                raise ValueError(f"no price for GPU type {pool.gpu_type!r}; known: "
                                 f"{', '.join(sorted(self.prices))} (config gpu_prices_usd_per_hour)")
            for _ in range(pool.count):
                self.add(pool, 0.0, warm=True)
        self.timeline.append((0.0, len(self.active()), len(self.active())))

    def perf(self, pool: PoolSpec) -> PerfModel:
        key = (pool.gpu_type, pool.model, pool.tp)
        if key not in self._perf:
            self._perf[key] = PerfModel.load(pool.gpu_type, pool.model, pool.tp)
        return self._perf[key]

    def add(self, pool: PoolSpec, now_s: float, *, warm: bool) -> VirtualWorker:
        slot = self._next_slot
        self._next_slot += 1
        engine = SimEngine(self.perf(pool), self.engine_config, now_s=now_s, warm=warm)
        worker = VirtualWorker(f"w{slot}", slot, pool, engine,
                               self.prices[pool.gpu_type] * pool.tp, now_s, last_advance_s=now_s)
        self.workers[worker.worker_id] = worker
        self.by_slot[slot] = worker
        return worker

    def active(self) -> list[VirtualWorker]:
        return [w for w in self.workers.values() if not w.stopped]

    def pool_named(self, name: str) -> PoolSpec | None:
        return next((p for p in self.pools if p.name == name), None)

    def scale(self, pool_name: str, gpu_type: str, model: str, replicas: int,
              now_s: float) -> tuple[list[VirtualWorker], list[VirtualWorker]]:
        """Make ``replicas`` workers of the pool serve or load: take back workers still draining,
        then add cold ones; or drain the surplus (those still loading first, then the least
        loaded). Returns (added, drained)."""
        pool = self.pool_named(pool_name)
        if pool is None:
            pool = PoolSpec(gpu_type, 0, model, worker_tp(gpu_type, model))
            if gpu_type not in self.prices:
                raise ValueError(f"no price for GPU type {gpu_type!r}")
            self.pools.append(pool)
        members = [w for w in self.active() if w.pool.name == pool.name and not w.draining]
        added, drained = [], []
        draining = [w for w in self.active() if w.pool.name == pool.name and w.draining]
        for worker in sorted(draining, key=lambda w: -w.slot)[:max(0, replicas - len(members))]:
            worker.draining = False  # still running: serving again beats a cold start
            members.append(worker)
        for _ in range(replicas - len(members)):
            added.append(self.add(pool, now_s, warm=False))
        surplus = len(members) - replicas
        if surplus > 0:
            def drain_order(w: VirtualWorker) -> tuple:
                stats = w.engine.stats()
                return (stats.state != "loading", stats.running + stats.waiting + w.in_transit,
                        -w.slot)
            for worker in sorted(members, key=drain_order)[:surplus]:
                worker.draining, worker.drained_s = True, now_s
                drained.append(worker)
        if added or drained:
            self.record(now_s)
        return added, drained

    def stop_idle_drained(self, now_s: float) -> list[VirtualWorker]:
        """Stop draining workers that hold no more work, as of when they last had some (their
        engine's last step, or being told to drain): a live worker stops then, not at the
        controllers' next tick."""
        stopped = []
        for w in self.active():
            if w.draining and not w.busy:
                w.stopped_s = min(now_s, max(w.drained_s, w.engine.worked_until_s))
                stopped.append(w)
        if stopped:
            self.record(now_s)
        return stopped

    def record(self, now_s: float) -> None:
        active = self.active()
        serving = sum(1 for w in active if not w.draining and w.engine.ready_s <= now_s)
        point = (round(now_s, 3), len(active), serving)
        if not self.timeline or self.timeline[-1] != point:
            self.timeline.append(point)

    def end(self, end_s: float) -> None:
        """End the timeline at the run's end ``end_s``, with the fleet as it stood then: the
        ticks after it (the one that saw the run done) may have drained, stopped or added
        workers, which the run does not pay for past ``end_s``."""
        self.timeline = [p for p in self.timeline if p[0] <= end_s]
        held = [w for w in self.workers.values()
                if w.started_s <= end_s and (w.stopped_s is None or w.stopped_s > end_s)]
        serving = sum(1 for w in held if w.engine.ready_s <= end_s
                      and (not w.draining or w.drained_s > end_s))
        point = (round(end_s, 3), len(held), serving)
        if self.timeline[-1] != point:
            self.timeline.append(point)

    def gpu_hours(self, end_s: float) -> float:
        return sum(w.hours(end_s) * w.pool.tp for w in self.workers.values())

    def cost_usd(self, end_s: float) -> float:
        return sum(w.hours(end_s) * w.price_per_hour for w in self.workers.values())

    def cache_tokens(self) -> tuple[int, int]:
        """Prefix-cache (queried, hit) prompt tokens over every engine the run used."""
        queries = sum(w.engine.kv.queries_tokens for w in self.workers.values())
        hits = sum(w.engine.kv.hits_tokens for w in self.workers.values())
        return queries, hits
