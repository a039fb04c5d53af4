"""The controllers process: slow, ticked, level-triggered loops around pure policy objects.

Every ``tick_s`` it recomputes the desired state from what it has seen on ``governor.telemetry``
(worker heartbeats, request outcomes) and ``governor.signals`` (pool signals) and publishes
commands to ``governor.control``: circuit breaker states, the load-shedding level, routing
weights per pool and, when enabled, pool sizes — changes at once, everything every ``restate_s``;
and it restates the operator's ``SetAdmissionLimits`` and ``SetRetryBudget`` commands while they
hold (``controllers.overrides``), which it follows on ``governor.control``.
Each command carries the signals and thresholds behind it. The configuration comes from the
compacted ``governor.config`` topic, as the router's does. On start it reads back what it last
commanded on ``governor.control`` (``READ_BACK_S``) and continues from it: the load-shed levels,
the breakers' states, the pools' sizes, the routing weights and the operator's commands. What
the controllers derived from an earlier stack's workers is not continued from: levels, weights
and sizes commanded before its fleet started (``fleet_started_ms``), and a breaker whose worker
has started again since (``Breakers.observe_status``); the operator's commands are.
"""

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from controllers.autoscaler import Autoscaler
from controllers.breakers import Breakers, forget_after_ms
from controllers.live_config import LiveConfig
from controllers.metrics import ControllerMetrics
from controllers.overrides import CommandRefused, OperatorOverrides
from controllers.router.candidates import configure_models
from controllers.router.fleet import FleetView
from controllers.shedding import ShedLevels
from controllers.weights import RoutingWeights
from infra.bus import (ConfigPartition, Decoded, HeardUntil, Outbox, TypedConsumer,
                       assign_at_ends, handle_each, make_producer, now_ms, partitions_of,
                       read_back, read_to_end, take_on_added, track_topics)
from infra.bus import follower as make_follower
from infra.serving import say_serving
from schemas.codec import DecodeError, decode
from schemas.commands import (ScalePool, SetAdmissionLimits, SetBreakerState, SetLoadShedLevel,
                              SetRetryBudget, SetRoutingWeights, target)
from schemas.config import ConfigSet, GovernorConfig
from schemas.events import (
    TERMINAL_EVENT_TYPES, WAITING_FOR_WORKER, Completed, Failed, Queued, Rejected, Requeued,
    SignalSnapshot, Started, WorkerStatus,
)
from schemas.topics import TopicCatalog
from workers.sim.models import model_specs

logger = logging.getLogger(__name__)

#: How long a request held for want of a worker counts as demand (one a router says waits with
#: no live worker of its model, ``WAITING_FOR_WORKER``, for at most its wait; or one refused
#: ``no_capacity``): not longer, since once placed it counts among its worker's requests too.
#: Counted from when the router said so (the message's time, no later than when it is read):
#: before 7 Dec from when it was read, so a controllers process reading behind took requests
#: that had waited long before for demand now, and woke or grew a pool for them.
_HELD_FOR_MS = 30_000
_HELD_AT_ONCE = 100_000  # requests one router's signal may say began to wait, at most
#: How far back a starting process looks on the control topic for what its predecessor last
#: commanded (which it restates every ``restate_s``; the router reads back as far). A restarted
#: process started at level 0 and, before it had heard any worker, commanded level 0 on its
#: first tick ("no live worker"): low-value work was admitted during an overload until the
#: level climbed back. It announced every breaker it heard closed, an open one too (the routers
#: sent requests to the worker they had broken out until it failed enough to open again), and
#: took a pool for the workers it heard within a heartbeat timeout: one still starting was
#: stopped by the size it commanded.
READ_BACK_S = 600.0


def _said_ms(message, now: int) -> int:
    """When ``message`` was said: its own time, or ``now`` (when it is read) if that is earlier
    (a writer's clock ahead)."""
    return min(message.event_time_ms, now)


class ControllersService:
    def __init__(self, bootstrap: str, catalog: TopicCatalog, *, tick_s: float = 0.25,
                 restate_s: float = 5.0, config: GovernorConfig = GovernorConfig(),
                 registry: CollectorRegistry | None = None,
                 pool_gpus: dict[str, int] | None = None, fleet_started_ms: int = 0) -> None:
        """``registry``: where its Prometheus metrics go (``controllers.metrics``);
        ``pool_gpus``: GPUs a worker of each pool, as the fleet that starts them declares it
        (``Autoscaler.degrees``: under a pool's ``gpus`` in the configuration);
        ``fleet_started_ms``: when that fleet started (``Autoscaler.fleet_started_ms``: a pool
        size commanded before then is not continued from, nor a load-shed level or routing
        weights, ``observe``; 0: none said)."""
        self.bootstrap = bootstrap
        self.fleet_started_ms = fleet_started_ms
        self.catalog = catalog
        self.metrics = ControllerMetrics(registry)
        self.tick_s = tick_s
        self.restate_s = restate_s
        self.live_config = LiveConfig("controllers", config,
                                      check=lambda candidate: model_specs(candidate.models))
        configure_models(config.models)
        self.fleet = FleetView(int(config.worker_heartbeat_timeout_s * 1000))
        self.breakers = Breakers(config.breaker)
        self.shedding = ShedLevels(config.shedding, ttft_slo_s=config.slo.ttft_slo_s)
        self.autoscaler = Autoscaler(config.autoscaler, dict(config.gpu_prices_usd_per_hour),
                                     ttft_slo_s=config.slo.ttft_slo_s,
                                     degrees=dict(pool_gpus or {}),
                                     fleet_started_ms=fleet_started_ms)
        #: model -> until when each request of it held for want of a worker counts as demand
        self._held: dict[str, list[int]] = {}
        self._pools_known = False  # the configuration's pools handed to the autoscaler
        self._scale_sent: dict[str, int] = {}
        self.weights = RoutingWeights(config.slo.ttft_slo_s)
        self._weights_sent: dict[str, float] | None = None
        self.overrides = OperatorOverrides()

    def apply_config(self, config: GovernorConfig) -> None:
        configure_models(config.models)  # (the autoscaler's capacities; checked when taken)
        self.breakers.config = config.breaker
        self.shedding.configure(config.shedding, config.slo.ttft_slo_s)
        if config.autoscaler.enabled and not self.autoscaler.config.enabled:
            self.autoscaler.resume()  # (it saw nothing while disabled: windows, idle time afresh)
        if not config.autoscaler.enabled:
            self.metrics.autoscaler_disabled()
        self.autoscaler.config = config.autoscaler
        self._pools_known = False  # (it may name new ones)
        self.autoscaler.prices = dict(config.gpu_prices_usd_per_hour)
        self.autoscaler.ttft_slo_s = config.slo.ttft_slo_s
        self.weights.ttft_slo_s = config.slo.ttft_slo_s
        self.fleet.heartbeat_timeout_ms = int(config.worker_heartbeat_timeout_s * 1000)

    def observe(self, message, now: int, written_ms: int | None = None) -> None:
        """``written_ms``: when the message's record was written (its Kafka timestamp), which an
        operator's command's stamp is judged against (None: ``now``)."""
        if message.type in TERMINAL_EVENT_TYPES and message.type != "rejected":
            # (a rejected request was never accepted: no Queued comes for it, and each one
            # kept as ended before its Queued would push out those whose Queued may come) A
            # Failed or Cancelled ends the attempt it names, the request's end unless a later
            # attempt runs; a Completed ends the request whichever attempt's (the router ends
            # it too: the answer is whole)
            self.autoscaler.ended(message.request_id,
                                  None if message.type == "completed" else message.attempt)
        match message:
            case WorkerStatus():
                self.fleet.observe(message, now)
                self.breakers.observe_status(message, self.fleet, now)
                for model in message.models_loaded:
                    self.autoscaler.add_pool(message.gpu_type, model, 1, heard_ms=now)
                self.weights.observe_pool(message.pool, now)
            case SignalSnapshot(scope="model", key=model, values=values) \
                    if WAITING_FOR_WORKER in values:  # a router's requests wait for a worker
                requests = min(int(values[WAITING_FOR_WORKER]), _HELD_AT_ONCE)
                until = _said_ms(message, now) + min(int(message.window_s * 1000), _HELD_FOR_MS)
                if until > now:
                    self._held.setdefault(model, []).extend([until] * requests)
            case SignalSnapshot():
                self.weights.observe(message)
            case SetLoadShedLevel() | SetRoutingWeights() if \
                    message.event_time_ms < self.fleet_started_ms:
                pass  # (read back) derived from an earlier stack's workers: not this fleet's
            case SetLoadShedLevel():  # (read back from the control topic at start)
                self.shedding.continue_from(message)  # the level in force: continued from
            case SetBreakerState():  # (read back too) the states an earlier process commanded
                self.breakers.continue_from(message)
            case ScalePool():  # (read back too) the size an earlier process last commanded
                self.autoscaler.continue_from(message, now)
            case SetRoutingWeights():  # (read back too) the weights an earlier process commanded
                self.weights.continue_from(message)
            case SetAdmissionLimits() | SetRetryBudget():  # the operator's (read back, followed)
                try:
                    self.overrides.take(message, now if written_ms is None else written_ms)
                except CommandRefused as exc:  # (the routers dead-letter it)
                    logger.warning("controllers: %s", exc)
            case Rejected(reason="no_capacity", model=model):
                until = _said_ms(message, now) + _HELD_FOR_MS
                if until > now:
                    self._held.setdefault(model, []).append(until)
            case Queued(request_id=rid, model=model):
                self.autoscaler.accepted(rid, model, now)
                if message.task_id:
                    self.autoscaler.task_step((message.tenant, message.task_id), model,
                                              message.step, message.steps_total, now)
            case Started(worker_id=wid, request_id=rid):
                self.breakers.observe_started(wid, rid, message.attempt)
                self.autoscaler.started(message.model, now)  # (its clock, not the worker's)
                self.autoscaler.attempted(rid, message.attempt, now)
            case Completed(worker_id=wid, request_id=rid):  # (judged by when it happened)
                self.breakers.observe_outcome(wid, True, now, rid, message.attempt,
                                              message.event_time_ms)
            case Failed(worker_id=wid, reason=reason) if wid and reason == "engine_error":
                self.breakers.observe_outcome(wid, False, now, message.request_id,
                                              message.attempt, message.event_time_ms)
            case Requeued(worker_id=wid, engine_failed=True):  # (a server failing every
                # request while its metrics answer would otherwise never be broken out)
                self.breakers.observe_outcome(wid, False, now, message.request_id,
                                              message.attempt, message.event_time_ms)

    def tick(self, now: int, restate: bool) -> list:
        commands = self.breakers.tick(now, self.fleet) + self.overrides.restatements(now)
        if restate:
            commands += self.breakers.desired(now)
            self.metrics.keep_breakers(self.breakers.known())  # (those it forgot: series gone)
            self._forget_gone_workers(now)
        before = {model: shedding.level for model, shedding in self.shedding.by_model.items()}
        for shed in self.shedding.tick(now, self.fleet):
            if restate or shed.model is None or shed.min_value != before.get(shed.model, 0.0):
                commands.append(shed)
        weights = self.weights.tick(now, forget_after_ms(self.fleet))
        if weights is not None and (restate or weights.weights != self._weights_sent):
            self._weights_sent = weights.weights
            commands.append(weights)
        for model in list(self._held):  # (kept only while they count, whether or not autoscaling)
            self._held[model] = [until for until in self._held[model] if until > now]
            if not self._held[model]:
                del self._held[model]
        if self.autoscaler.config.enabled:
            if not self._pools_known:  # known before any worker of theirs is heard, so that
                self._pools_known = True  # one left at zero can be woken
                for name in self.autoscaler.config.pools:
                    gpu_type, _, model = name.partition("@")
                    self.autoscaler.add_pool(gpu_type, model, 0, heard_ms=now)
            held = {model: len(times) for model, times in self._held.items()}
            self.metrics.pool_sizes_held(self.autoscaler.sizes_held(self.fleet, now))
            for scale in self.autoscaler.tick(now, self.fleet, held,
                                              self.breakers.out_of_service()):
                if restate or self._scale_sent.get(scale.pool) != scale.replicas:
                    self._scale_sent[scale.pool] = scale.replicas
                    commands.append(scale)
        return commands

    def _forget_gone_workers(self, now: int) -> None:
        """Drop from the fleet view the workers silent for ``forget_after_ms``, as their
        breakers were: worker ids that change at every restart (pods) would grow it, and every
        tick's passes over it, without bound. Heard again, one is new."""
        horizon = self.fleet.judged(now) - forget_after_ms(self.fleet)
        gone = [w.worker_id for w in self.fleet.workers() if w.last_seen_ms < horizon]
        if gone:
            self.fleet.forget(gone)

    async def _read_back(self, reader: AIOKafkaConsumer) -> None:
        """Observe the ``SetLoadShedLevel``, ``SetBreakerState``, ``ScalePool``,
        ``SetRoutingWeights``, ``SetAdmissionLimits`` and ``SetRetryBudget`` commands of the last
        ``READ_BACK_S`` on the control topic (its one partition keeps their order): each level,
        breaker, pool and weight continues from the last, and the operator's commands are
        restated while they hold. ``reader`` (a started consumer outside any group) is left at
        the end it read to, to follow the topic from there."""
        c = self.catalog
        until = await reader.end_offsets(partitions_of(reader, c, [c.control]))
        since = now_ms() - int(READ_BACK_S * 1000)
        async for record in read_back(reader, c.control, since, until):
            try:
                message = decode(c.spec(c.control), record.value)
            except DecodeError:
                continue  # dead-lettered by the router when it read it
            if isinstance(message, SetLoadShedLevel | SetBreakerState | ScalePool
                          | SetRoutingWeights | SetAdmissionLimits | SetRetryBudget):
                self.observe(message, now_ms(), record.timestamp)
        reader.assign(list(until))
        for tp, offset in until.items():
            reader.seek(tp, offset)
        logger.info("controllers: read back load-shed levels %s; breakers not closed %s; pool "
                    "sizes %s; operator's commands %s", ", ".join(
                        f"{model} {shedding.level:.2f}" for model, shedding
                        in self.shedding.by_model.items()) or "none",
                    self.breakers.summary() or "none", ", ".join(
                        f"{pool.name} {pool.replicas}" for pool in self.autoscaler.pools.values())
                    or "none", self.overrides.summary() or "none")

    async def run(self, stop: asyncio.Event) -> None:
        producer = make_producer(self.bootstrap)
        outbox = Outbox(producer, observe=self.metrics.emitted)
        c = self.catalog
        # followed by assignment, the partitions added since taken on (``take_on_added``)
        telemetry, control = make_follower(self.bootstrap), make_follower(self.bootstrap)
        config_partition = await ConfigPartition.start(self.bootstrap, c, "controllers",
                                                       seen=self.metrics.config_partitions.set)
        config = config_partition.consumer
        await producer.start()
        track_topics(producer, c.topics())  # (as the router: every topic it may write, known)
        await control.start()
        await self._read_back(control)
        await telemetry.start()
        # liveness judged as of what was read (a process reading behind, short of CPU, would
        # take live workers for gone: scale out, or size demand on too few); telemetry is read
        # from its ends as of its start, so heard until before then to begin with
        started_ms = now_ms()
        followed = await assign_at_ends(telemetry, c, [c.telemetry, c.signals])
        heard = HeardUntil([tp for tp in followed if tp.topic == c.telemetry],
                           since_ms=started_ms)
        events, settings, commanded = (
            TypedConsumer(consumer, c, producer, name, counted=self.metrics.dead_lettered)
            for consumer, name in ((telemetry, "controllers"), (config, "controllers-config"),
                                   (control, "controllers-control")))

        def configured(item: Decoded) -> None:
            if isinstance(item.message, ConfigSet):
                before = self.live_config.config
                verdict = self.live_config.apply(
                    item.message, item.record.offset, now_ms(), item.record.key,
                    written_ms=item.record.timestamp)
                if verdict.type == "config_applied":
                    self.overrides.configured(before, self.live_config.config, item.message)
                    self.apply_config(self.live_config.config)
                outbox.emit(c.telemetry, verdict, verdict.key)

        # The configuration in force before the first tick (not each of its history's steps).
        if not await read_to_end(settings, c.config, configured):
            logger.warning("controllers: the configuration topic was not read to its end in 30 s")
        await outbox.flush()
        say_serving("controllers", c.telemetry, self.bootstrap, f"tick {self.tick_s:g} s")
        loop = asyncio.get_running_loop()
        next_tick = next_restate = loop.time()
        try:
            while not stop.is_set():
                timeout = max(0, int((next_tick - loop.time()) * 1000))
                await take_on_added(telemetry, heard)
                await take_on_added(control)
                items = await events.fetch(timeout)
                self.fleet.heard_until_ms = await heard.update(
                    telemetry, (item.record for item in items))
                for item in items:
                    self.observe(item.message, now_ms())
                await handle_each(await settings.fetch(0), configured)
                config_partition.watch()
                for item in await commanded.fetch(0, dead_letter=False):  # (the router's to)
                    if isinstance(item.message, SetAdmissionLimits | SetRetryBudget):
                        self.observe(item.message, now_ms(), item.record.timestamp)
                if loop.time() >= next_tick:
                    restate = loop.time() >= next_restate
                    for command in self.tick(now_ms(), restate):
                        if command.type == "set_breaker_state":
                            logger.info("breaker %s -> %s: %s", command.worker_id, command.state,
                                        command.reason)
                        outbox.emit(c.control, command, target(command))
                    next_tick = loop.time() + self.tick_s
                    if restate:
                        next_restate = loop.time() + self.restate_s
                await outbox.flush()
        finally:
            await config.stop()
            await telemetry.stop()
            await control.stop()
            await producer.stop()
