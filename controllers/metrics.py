"""Prometheus metrics of the control-plane processes: the router and the controllers.

Both are read off what the process emits (``Outbox(observe=...)``): a metric moves when the
message is handed to the producer (one the broker then refuses is counted all the same): every
message by type, every terminal event by reason; and off what it reads: every record it
dead-letters, by the topic it was read from and why (``TypedConsumer(counted=...)``, once the
broker has the dead letter). A worker counts these three too (``EmittedMetrics``), beside its
vLLM-named ones;
and, for the router, its dispatches (first placements and continuations) and the requests it is
answerable for; for the controllers, the desired state their last commands set (load-shed level,
pool sizes, breaker states, routing weights; a worker's breaker series goes once the controllers
forget the worker: stopped, crashed or silent), and the changes of breaker states and pool sizes
they commanded. ``governor router|controllers --metrics-port P``
serves them on 127.0.0.1.
"""

from collections.abc import Callable, Collection

from prometheus_client import CollectorRegistry, Counter, Gauge

from schemas.base import Message
from schemas.events import DeadLetter

#: A breaker's state as a number (a gauge holds numbers): closed 0, half-open 1, open 2.
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}


def dead_letters_counter(registry: CollectorRegistry) -> Counter:
    """``governor_dead_letters_total{topic,reason}``, which every component that reads serves
    alike."""
    return Counter("governor_dead_letters", "Records this process read and sent to the "
                   "dead-letter topic, by the topic they were read from and why.",
                   ["topic", "reason"], registry=registry)


def config_partitions_gauge(registry: CollectorRegistry) -> Gauge:
    """``governor_config_topic_partitions``: the configuration topic's partition count as this
    process's reader last saw it (``ConfigPartition(seen=...)``); more than 1 is a split topic,
    read on partition 0 alone, that must be made again."""
    return Gauge("governor_config_topic_partitions", "Partitions of the configuration topic as "
                 "this process's reader last saw them (at its start, then every 10 s); more "
                 "than 1: the topic was split, only partition 0 is read, and it must be made "
                 "again.", registry=registry)


class EmittedMetrics:
    """What one process emitted."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.messages = Counter("governor_messages_emitted", "Messages this process emitted.",
                                ["type"], registry=r)
        self.ended = Counter("governor_requests_ended",
                             "Terminal events this process published (a router rejects, fails "
                             "and cancels requests; a worker completes, fails and cancels "
                             "them), by reason (none "
                             "for a cancellation: its reason is its client's words).",
                             ["type", "reason"], registry=r)
        self.dead_letters = dead_letters_counter(r)

    def dead_lettered(self, letter: DeadLetter) -> None:
        self.dead_letters.labels(letter.source_topic, letter.reason).inc()

    def emitted(self, message: Message) -> None:
        self.messages.labels(message.type).inc()
        if message.type in ("rejected", "failed", "completed"):  # (reasons of closed sets)
            why = getattr(message, "reason", None) or getattr(message, "finish_reason", None)
            self.ended.labels(message.type, why or "").inc()
        elif message.type == "cancelled":
            self.ended.labels(message.type, "").inc()


class RouterMetrics(EmittedMetrics):
    def __init__(self, in_flight: Callable[[], int], registry: CollectorRegistry | None = None,
                 waiting: Callable[[], int] = lambda: 0,
                 continuations_waiting: Callable[[], int] = lambda: 0) -> None:
        """``in_flight``: how many requests in flight this router answers for
        (``RouterCore.answerable``); ``waiting``: how many requests wait for a worker of their
        model; ``continuations_waiting``: how many this router continues wait for a worker able
        to take them (``RouterCore.continuations_waiting``)."""
        super().__init__(registry)
        self.config_partitions = config_partitions_gauge(self.registry)
        self.dispatches = Counter("governor_router_dispatches",
                                  "Dispatches to workers: a request's first placement, or a "
                                  "continuation of one whose worker was lost or recalled.",
                                  ["attempt"], registry=self.registry)
        Gauge("governor_router_in_flight",
              "Requests this router placed, or adopted from a router gone, that have not ended.",
              registry=self.registry).set_function(in_flight)
        Gauge("governor_router_continuations_waiting",
              "Requests this router continues (placed by it, or adopted from a router gone) "
              "whose attempt was lost or handed back, waiting for a live worker able to take "
              "them (failed after 600 s).",
              registry=self.registry).set_function(continuations_waiting)
        Gauge("governor_router_requests_waiting",
              "Requests this router read that wait for a worker of their model (none live, or "
              "none able to take them yet).", registry=self.registry).set_function(waiting)

    def emitted(self, message: Message) -> None:
        super().emitted(message)
        if message.type == "dispatch":
            self.dispatches.labels("first" if message.attempt == 1 else "continuation").inc()


class ControllerMetrics(EmittedMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self.config_partitions = config_partitions_gauge(r)
        self.shed_level = Gauge("governor_load_shed_level",
                                "Requests of the model valued below this are shed (0: none; "
                                "model '*': every model's, sent as a controllers process "
                                "starts).", ["model"], registry=r)
        self.replicas = Gauge("governor_pool_replicas",
                              "Workers the autoscaler wants in each pool.", ["pool"], registry=r)
        self.breakers = Gauge("governor_breaker_state",
                              "Each worker's circuit breaker: closed 0, half-open 1, open 2.",
                              ["worker"], registry=r)
        self.weights = Gauge("governor_routing_weight", "Each pool's routing weight.", ["pool"],
                             registry=r)
        self.breaker_changes = Counter(
            "governor_breaker_changes", "Breaker state changes commanded, by the state entered "
            "(a restatement, or a worker first told of as closed, is none).", ["state"],
            registry=r)
        self.size_changes = Counter(
            "governor_pool_size_changes", "Changes of a pool's size the autoscaler commanded, by "
            "direction (up, down; its first command counts against the size the pool had: its "
            "workers heard, or an earlier process's command).",
            ["pool", "direction"], registry=r)
        self._breaker_states: dict[str, str] = {}  # the last commanded, by worker
        self._sizes: dict[str, int] = {}  # the last commanded, by pool
        self._held_sizes: dict[str, int] = {}  # each pool's before the autoscaler's latest tick

    def pool_sizes_held(self, sizes: dict[str, int]) -> None:
        """The size each pool has as the autoscaler ticks (``Autoscaler.sizes_held``): the first
        size it commands a pool is a change from that one, as when it scales a one-worker pool,
        idle since before it was enabled, to zero."""
        self._held_sizes = sizes

    def autoscaler_disabled(self) -> None:
        """The autoscaler wants no pool size while disabled: the sizes it last commanded go."""
        self.replicas.clear()

    def keep_breakers(self, workers: Collection[str]) -> None:
        """The controllers track the breakers of these ``workers`` only: the series of any other
        (a worker stopped, crashed or long silent, whose breaker they forgot) goes."""
        for worker in self._breaker_states.keys() - set(workers):
            self.breakers.remove(worker)
            del self._breaker_states[worker]

    def emitted(self, message: Message) -> None:
        super().emitted(message)
        match message.type:
            case "set_load_shed_level":
                self.shed_level.labels(message.model or "*").set(message.min_value)
            case "scale_pool":
                self.replicas.labels(message.pool).set(message.replicas)
                before = self._sizes.get(message.pool,
                                         self._held_sizes.get(message.pool, message.replicas))
                if message.replicas != before:
                    self.size_changes.labels(
                        message.pool, "up" if message.replicas > before else "down").inc()
                self._sizes[message.pool] = message.replicas
            case "set_breaker_state":
                self.breakers.labels(message.worker_id).set(BREAKER_STATES[message.state])
                if message.state != self._breaker_states.get(message.worker_id, "closed"):
                    self.breaker_changes.labels(message.state).inc()
                self._breaker_states[message.worker_id] = message.state
            case "set_routing_weights":  # (a pool left out has none: its series goes)
                self.weights.clear()
                for pool, weight in message.weights.items():
                    self.weights.labels(pool).set(weight)
