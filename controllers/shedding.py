"""Load shedding level from the pressure on a model's workers, with hysteresis: a pure, ticked
controller, one for each model (``ShedLevels``).

Pressure is the largest of the workers' mean KV-cache use (scaled so that ``kv_high`` of it is
pressure ``high``), its mean queue depth per worker against ``queue_per_worker``, and the mean
prefill backlog in seconds (from the performance model) of its less loaded half against the
TTFT SLO: a fleet that needs most of the SLO just to reach a new request's prefill is saturated
for new low-value work, whatever its queue length says; one worker with one very long prompt
is not (a new request goes elsewhere). KV use alone counted from half full (before 5 Dec) shed
work below the autoscaler's 60% target, on a fleet that served it all in time: the Azure trace
at 3x on one H100, 79 requests, where the baselines served every one within its SLO (TTFT p99
0.30 s); ShareGPT at base load on two, 3 conversations. Above ``high`` the
shedding level (the minimum request value the router admits; see
``controllers.router.admission.request_value``) rises by ``step`` per second (in proportion to
the time since the previous tick, at most one second's worth: the live controllers tick every
0.25 s, the simulator every second) up to ``max_level``; below ``low`` it falls as fast; in
between it holds, so the level does not flap around one threshold. Lowest-value requests go
first: low priority, early in their task, without a deadline.

A restarted controllers process continues from each model's level its predecessor last
commanded (read back from the control topic, as the router holds it) and, for a heartbeat
timeout from the model's first tick, holds the level rather than lowering it while it hears no
live worker of the model: that is then its not having heard the fleet yet, not a model without
pressure.
"""

from dataclasses import dataclass, field

from controllers.router.candidates import perf_model
from controllers.router.fleet import FleetView
from schemas.commands import SetLoadShedLevel
from schemas.config import SheddingConfig


@dataclass
class Shedding:
    config: SheddingConfig = SheddingConfig()
    level: float = 0.0
    ttft_slo_s: float = 2.0
    _ticked_ms: int | None = None
    _first_ms: int | None = None  # its first tick

    def pressure(self, fleet: FleetView, now_ms: int, model: str | None = None
                 ) -> tuple[float, str]:
        """Over the live workers of ``model`` (None: every worker)."""
        workers = fleet.live(now_ms, model)
        if not workers:
            return 0.0, "no live worker"
        kv = sum(w.kv_utilisation for w in workers) / len(workers)
        kv_pressure = kv * self.config.high / self.config.kv_high
        queue = sum(w.waiting for w in workers) / len(workers) / self.config.queue_per_worker
        backlog_s = _less_loaded_half([
            perf_model(w.gpu_type, w.models[0] if w.models else "llama-3-8b", w.gpus).prefill_s(
                w.prefill_backlog_tokens) if w.prefill_backlog_tokens else 0.0
            for w in workers])
        backlog = backlog_s / self.ttft_slo_s
        return max(kv_pressure, queue, backlog), (
            f"mean KV use {kv:.0%} (pressure {kv_pressure:.2f}), mean queue {queue:.0%} of "
            f"{self.config.queue_per_worker:g}, prefill backlog {backlog_s:.2f}s on the less "
            f"loaded half of the workers against a {self.ttft_slo_s:g}s TTFT SLO")

    def tick(self, now_ms: int, fleet: FleetView, model: str | None = None) -> SetLoadShedLevel:
        """The level of ``model``'s requests from its workers' pressure (None: every model's,
        from every worker's)."""
        cfg = self.config
        pressure, why = self.pressure(fleet, now_ms, model)
        since_s = 1.0 if self._ticked_ms is None else (now_ms - self._ticked_ms) / 1000
        self._ticked_ms = now_ms
        if self._first_ms is None:
            self._first_ms = now_ms
        step = cfg.step * min(1.0, max(0.0, since_s))
        if pressure >= cfg.high:
            self.level = min(cfg.max_level, round(self.level + step, 6))
            verdict = f"pressure {pressure:.2f} >= high {cfg.high}"
        elif pressure <= cfg.low and now_ms - self._first_ms < fleet.heartbeat_timeout_ms \
                and not fleet.live(now_ms, model):
            verdict = (f"pressure {pressure:.2f}, no live worker heard for a heartbeat "
                       "timeout since this level was first ticked: hold")
        elif pressure <= cfg.low:
            self.level = max(0.0, round(self.level - step, 6))
            verdict = f"pressure {pressure:.2f} <= low {cfg.low}"
        else:
            verdict = f"pressure {pressure:.2f} between low {cfg.low} and high {cfg.high}: hold"
        self.level = min(self.level, cfg.max_level)  # a cap lowered live applies at once
        return SetLoadShedLevel(event_time_ms=now_ms, command_id=f"shed-{now_ms}",
                                issued_by="shedding", min_value=self.level, model=model,
                                reason=f"{verdict} ({why}); level {self.level:.2f}")


@dataclass
class ShedLevels:
    """A shedding level for each model, from the pressure on its own workers: a burst for one
    model (a pool woken from zero handed a backlog) sheds that model's low-value requests, not
    those of a model whose workers are idle (before 5 Dec one level came from the whole fleet's
    pressure). A model is ticked while a live worker serves it or its level is above 0.

    Its first tick first sends every model's level 0 (``model`` None; a router then drops the
    levels it holds), then each model's: a router holding a level for a model this process
    knows nothing of (commanded by a process gone longer than the read-back) no longer sheds by
    it. A level of every model read back (a controllers process of before 5 Dec) is where each
    model's starts."""

    config: SheddingConfig = SheddingConfig()
    ttft_slo_s: float = 2.0
    by_model: dict[str, Shedding] = field(default_factory=dict)
    start_level: float = 0.0  # where a model's level starts: every model's level read back
    _ticked_ms: int | None = None  # its last tick

    def of(self, model: str) -> Shedding:
        """``model``'s level; one new since the last tick moves from then, as the others do
        (before 7 Dec, a whole second's step at its first tick, a quarter second later)."""
        shedding = self.by_model.get(model)
        if shedding is None:
            shedding = self.by_model[model] = Shedding(self.config, level=self.start_level,
                                                       ttft_slo_s=self.ttft_slo_s,
                                                       _ticked_ms=self._ticked_ms)
        return shedding

    def configure(self, config: SheddingConfig, ttft_slo_s: float) -> None:
        self.config, self.ttft_slo_s = config, ttft_slo_s
        for shedding in self.by_model.values():
            shedding.config, shedding.ttft_slo_s = config, ttft_slo_s

    def continue_from(self, command: SetLoadShedLevel) -> None:
        """A level commanded before this process started (read back): continued from."""
        if command.model is None:
            self.start_level = command.min_value
            for shedding in self.by_model.values():
                shedding.level = command.min_value
        else:
            self.of(command.model).level = command.min_value

    def tick(self, now_ms: int, fleet: FleetView) -> list[SetLoadShedLevel]:
        served = {model for w in fleet.live(now_ms) for model in w.models}
        for model in [m for m, s in self.by_model.items() if m not in served and not s.level]:
            del self.by_model[model]  # (nothing to shed, nothing to serve: forgotten)
        first = [] if self._ticked_ms is not None else [SetLoadShedLevel(
            event_time_ms=now_ms, command_id=f"shed-{now_ms}-all", issued_by="shedding",
            min_value=0.0, reason="controllers started: every model's level 0, then each "
                                  "model's own")]
        levels = [self.of(model).tick(now_ms, fleet, model)
                  for model in sorted(served | set(self.by_model))]
        self._ticked_ms = now_ms
        return first + levels


def _less_loaded_half(values: list[float]) -> float:
    """The mean of the smaller half of ``values`` (rounded up): what a new request, placed on
    a less loaded worker of its model, meets. One worker's backlog (one 200k-token
    prompt) is not the fleet's: averaged over every worker (before 5 Dec), one such prompt on
    one of three shed every other tenant's low-value requests for 70 s, idle workers beside
    it."""
    half = sorted(values)[: (len(values) + 1) // 2]
    return sum(half) / len(half)
