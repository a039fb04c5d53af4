"""Settings of one offline simulation run (``governor sim``)."""

from dataclasses import dataclass, field
from typing import Literal

from controllers.router.core import NO_WORKER_WAIT_S
from controllers.router.policies import POLICIES
from schemas.config import GovernorConfig
from infra.sim.slo import DEADLINES, SloRule
from workers.sim.engine import SimEngineConfig


@dataclass(frozen=True)
class SimOptions:
    """Everything but the workload. Times are virtual seconds.

    - ``policy``: one of ``controllers.router.policies.POLICIES``; it is set as the config's
      ``routing_policy``, so ``governor`` also gets its admission control.
    - ``fleet``: a fleet spec (``h100:8,a100:8``, ``h100:4@llama-3-8b``), warm at time 0.
    - ``seed``: the phases of the workers' heartbeats (live workers start at different moments);
      workload builders take their own seed. Same workload, options and seed: same result.
    - ``rate_scale``: arrivals come this many times faster (2.0 halves every arrival time), but
      for a task's later steps: each keeps its offset from its task's first request and waits
      for the step before it to end (``infra.sim.arrivals``).
    - ``controllers``: run the slow controllers (breakers, shedding, routing weights, and the
      autoscaler when ``config.autoscaler.enabled``); None: only for the ``governor`` policy, as
      the baselines have none.
    - ``status_interval_s``: heartbeat period (0.5 s, as live workers). ``tick_s``: period of the
      controllers' tick and the router's resumption tick (live: 0.25 s each; 1 s here by default
      to save time — neither has anything to do between heartbeats in a fault-free run).
    - ``bus_latency_s``: from a router's dispatch to the worker's engine (a Kafka hop).
    - ``hold_timeout_s``: how long a request that no live worker can take yet is held before it
      is rejected with ``no_capacity`` (the live router's ``no_worker_wait_s``).
    - ``drain_limit_s``: after the last arrival, how long the run goes on for work to finish;
      requests still open then are reported as ``unfinished``.
    - ``max_tokens``: what each request asks as its ``max_tokens``, the client's cap on its
      answer. ``"longest"``: the longest answer among the requests simulated, the same for
      every request (the traces' answers stop at their service's cap: 2,000 tokens in
      Mooncake's, 1,000 in Azure's), while the engines stop each answer at its length in the
      trace: the router does not know how long an answer will run. ``"answer"``: each request's own answer's length,
      which tells the router exactly (the simulator until 5 Dec 2026; for comparison).
    - ``steps_total``: what a task's requests say of its number of steps. ``"trace"``: the
      trace's ``steps_total`` (a workflow that declares its plan). ``"unknown"``: each says its
      own step, as a chat's client that cannot know whether another turn follows; a task still
      succeeds only when all of the trace's steps do.
    - ``deadlines``: the deadline of a request whose trace states none. ``"rule"``: its TTFT
      target plus 0.1 s per output token (``infra.sim.slo``). ``"config"``: ``slo.deadline_s``
      after its arrival, as the live stack judges such a request. ``"none"``: the router is
      sent only what the trace states, as by a client that states no deadline (the router
      places such a request against ``slo.ttft_slo_s`` and never rejects it for its deadline),
      and the request is judged as the live streams judge it: by ``slo.ttft_slo_s`` and
      ``slo.deadline_s`` after its arrival.
    """

    policy: str = "governor"
    fleet: str = "h100:16"
    seed: int = 0
    rate_scale: float = 1.0
    config: GovernorConfig = field(default_factory=GovernorConfig)
    slo: SloRule | None = None
    controllers: bool | None = None
    status_interval_s: float = 0.5
    tick_s: float = 1.0
    bus_latency_s: float = 0.002
    hold_timeout_s: float = NO_WORKER_WAIT_S
    drain_limit_s: float = 3600.0
    engine: SimEngineConfig = SimEngineConfig(emit_tokens=False)
    max_tokens: Literal["longest", "answer"] = "longest"
    steps_total: Literal["trace", "unknown"] = "trace"
    deadlines: Literal["rule", "config", "none"] = "rule"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose {', '.join(POLICIES)}")
        if not self.rate_scale > 0:
            raise ValueError(f"rate_scale must be > 0, got {self.rate_scale!r}")
        for name in ("status_interval_s", "tick_s", "hold_timeout_s", "drain_limit_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.bus_latency_s < 0:
            raise ValueError("bus_latency_s must be >= 0")
        if self.max_tokens not in ("longest", "answer"):
            raise ValueError(f"max_tokens must be 'longest' or 'answer', got {self.max_tokens!r}")
        if self.steps_total not in ("trace", "unknown"):
            raise ValueError(f"steps_total must be 'trace' or 'unknown', got {self.steps_total!r}")
        if self.deadlines not in DEADLINES:
            raise ValueError(f"deadlines must be one of {', '.join(DEADLINES)}, got "
                             f"{self.deadlines!r}")

    def router_config(self) -> GovernorConfig:
        data = self.config.model_dump(mode="json")
        data["routing_policy"] = self.policy
        return GovernorConfig.model_validate(data)

    @property
    def slo_rule(self) -> SloRule:
        """``slo``, or the default rule from ``config.slo.ttft_slo_s`` (what the controllers
        judge by: ``--set slo.ttft_slo_s`` moves the targets requests are judged by too), with
        ``config.slo.deadline_s`` as every deadline where ``deadlines`` is ``"config"`` (and
        ``"none"``, which sends the router only what each request states)."""
        return self.slo or SloRule.configured(self.config.slo, self.deadlines)

    @property
    def runs_controllers(self) -> bool:
        return self.policy == "governor" if self.controllers is None else self.controllers
