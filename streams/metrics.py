"""Prometheus metrics of the streams component: every published signal, and its own counters.

Each value of a ``SignalSnapshot`` becomes the gauge ``governor_<value name>`` with the labels
``scope``, ``key`` and ``window_s`` (``running total`` windows are labelled ``total``), its unit
in Prometheus's base units (``_s`` as ``_seconds``, an epoch time in ``_ms`` as
``_timestamp_seconds`` in seconds, ``_per_s`` as ``_per_second``, ``gpu_hours`` as
``gpu_seconds``), e.g. ``governor_ttft_p99_seconds{scope="pool",key="h100@llama-3-8b",
window_s="10"}``. One mapping, here (``_UNITS``), from signal names and values to metric names
and values; the signals topic keeps the signals' own names and units.

A publication (``publish``) replaces the previous one: a series it does not set is removed, so a
value a window no longer has (no first token in the last 10 s: no TTFT percentile) is absent
rather than stuck at its last value, and so are the keys of partitions this worker no longer
owns. Tenant and model names come from clients, so their series are bounded: the first
``max_keys`` keys of each of those scopes (in the order first published, sorted within a
publication) have series of their own; the others are folded into ``key="~other"`` (no tenant
or model can be named so), which carries the sums of their additive values (counts and sums,
``window.ADDITIVE``) and nothing else. Every key is still on the signals topic.
"""

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge

from controllers.metrics import config_partitions_gauge, dead_letters_counter
from schemas.events import SignalSnapshot
from streams.signals.window import ADDITIVE

_LABELS = ("scope", "key", "window_s")
#: The streams' sources by the code their records are deduplicated under, as ``source`` names
#: them: the telemetry and requests topics, and the internal worker, task and scope topics.
SOURCES = {"t": "telemetry", "q": "requests", "w": "worker", "k": "task", "s": "scope"}
#: The scopes whose keys clients name, and the key their keys beyond the bound are folded into.
FOLDED_SCOPES = ("tenant", "model")
OTHER = "~other"


class Unit(NamedTuple):
    """A signal value's unit, known by the end of the value's name (or the whole name), and how
    its gauge has it: Prometheus's naming conventions (prometheus.io/docs/practices/naming) ask
    for base units, spelled out in the plural at the end of the name (seconds, not milliseconds
    or hours; an epoch time in seconds, ``_timestamp_seconds``), which dashboards' unit
    inference and ``promtool check metrics`` go by."""

    end: str
    text: str  #: what the gauge's values are, for its help
    prometheus_end: str | None = None  #: the end of the gauge's name, where it is not ``end``
    times: float = 1  #: the gauge's value is the signal's ``* times / per``
    per: float = 1


#: The units of the values that are not counts (first match); every ``_ms`` value is a time since
#: the epoch. Currency has no base unit in Prometheus's list: US dollars keep ``_usd`` (the ISO
#: 4217 code, unambiguous where ``_dollars`` is not), a price per hour goes per second.
_UNITS = (
    Unit("state_code", "0 starting, 1 loading, 2 warm, 3 draining, 4 sleeping, 5 crashed, "
         "6 stopped"),
    Unit("live", "1 heard from within the heartbeat timeout and not stopped, else 0"),
    Unit("slot", "the worker's dispatch partition"),
    Unit("success_per_dollar", "successful requests per US dollar"),
    Unit("_usd_per_hour", "US dollars a second: the signal's per hour / 3600", "_usd_per_second",
         per=3600),
    Unit("_per_s", "per second", "_per_second"),
    Unit("_usd", "US dollars"),
    Unit("_ms", "seconds since the epoch: the signal's milliseconds / 1000",
         "_timestamp_seconds", per=1000),
    Unit("_s", "seconds", "_seconds"),
    Unit("gpu_hours", "GPU-seconds: the signal's GPU-hours * 3600", "gpu_seconds", times=3600),
    Unit("_rate", "a fraction, 0 to 1"), Unit("_ratio", "a fraction, 0 to 1"),
    Unit("_attainment", "a fraction, 0 to 1"), Unit("_utilisation", "a fraction, 0 to 1"),
)
_COUNT = Unit("", "a count")


def unit(value_name: str) -> Unit:
    return next((u for u in _UNITS if value_name.endswith(u.end)), _COUNT)


def metric_name(value_name: str) -> str:
    """The gauge of a signal value: ``governor_<value name>``, its unit's end in base units."""
    u = unit(value_name)
    if u.prometheus_end is not None:
        value_name = value_name[:len(value_name) - len(u.end)] + u.prometheus_end
    return "governor_" + re.sub(r"[^a-zA-Z0-9_]", "_", value_name)


def signal_help(value_name: str) -> str:
    """The help of a signal's gauge: its unit, and what its labels mean."""
    return (f"Signal {value_name} ({unit(value_name).text}) of a scope and key over window_s: "
            "the last 10 or 60 s, or the running total; now: a worker's fleet view.")


class SignalMetrics:
    def __init__(self, registry: CollectorRegistry | None = None,
                 windows_s: tuple[int, ...] = (10, 60), max_keys: int = 100) -> None:
        self.registry = registry or CollectorRegistry()
        self.windows_s = set(windows_s)
        self.max_keys = max_keys
        self._gauges: dict[str, Gauge] = {}
        #: Each gauge's child per labels, and its value's unit, looked up once (``labels()``
        #: costs microseconds, and a publication sets thousands of values); those not set by the
        #: last publication go.
        self._children: dict[tuple[str, str, str, str], tuple[Any, Unit]] = {}
        #: Per folded scope, the keys with series of their own (a dict: in the order admitted).
        self._own: dict[str, dict[str, None]] = {scope: {} for scope in FOLDED_SCOPES}
        self.records = Counter("governor_streams_records", "Records the streams agents read, "
                               "by source topic (telemetry, requests; the internal worker, task "
                               "and scope topics)", ["source"], registry=self.registry)
        self.observations = Counter("governor_streams_observations",
                                    "Observations applied to windows", registry=self.registry)
        self.duplicates = Counter("governor_streams_duplicates",
                                  "Observations dropped as already counted", registry=self.registry)
        self.dead_letters = Counter("governor_streams_dead_letters",
                                    "Records sent to the dead-letter topic", registry=self.registry)
        self.dead_letters_by = dead_letters_counter(self.registry)
        self.config_partitions = config_partitions_gauge(self.registry)
        self.published = Counter("governor_streams_snapshots_published",
                                 "Signal snapshots published", registry=self.registry)
        self.recovering = Gauge("governor_streams_recovery_seconds",
                                "How long the tables' recovery (the changelogs read back before "
                                "anything is processed) has gone on; 0 when there is none",
                                registry=self.registry)
        self.recovery_left = Gauge("governor_streams_recovery_records_remaining",
                                   "Records the tables' recovery has still to read (of the "
                                   "changelog partitions whose highwater is known)",
                                   registry=self.registry)
        self.unread_partitions = Gauge(
            "governor_streams_unread_partitions", "Partitions of a source topic (telemetry, "
            "requests) past the streams' count, which they do not read (added while they run: "
            "the topic is to be made again)", ["topic"], registry=self.registry)

    def dead_lettered(self, topic: str, reason: str) -> None:
        """A record of ``topic`` sent to the dead-letter topic for ``reason``."""
        self.dead_letters.inc()
        self.dead_letters_by.labels(topic, reason).inc()

    def recovery_seen(self, recovering_s: float, records_left: int) -> None:
        """A look at the tables' recovery (``streams.recovery``)."""
        self.recovering.set(recovering_s)
        self.recovery_left.set(records_left)

    def unread_seen(self, topic: str, partitions: int) -> None:
        """How many partitions of source ``topic`` the streams leave unread
        (``streams.sources``)."""
        self.unread_partitions.labels(topic).set(partitions)

    def publish(self, snapshots: Iterable[SignalSnapshot]) -> None:
        """Set the values of one publication; remove every series it does not have."""
        snapshots = list(snapshots)
        self._admit(snapshots)
        values: dict[tuple[str, str, str, str], float] = {}
        for snapshot in snapshots:
            window = self._window(snapshot)
            scope, key = snapshot.scope, snapshot.key
            if scope in self._own and key not in self._own[scope]:
                for name in ADDITIVE.intersection(snapshot.values):
                    labels = (name, scope, OTHER, window)
                    values[labels] = values.get(labels, 0.0) + snapshot.values[name]
                continue
            for name, value in snapshot.values.items():
                values[(name, scope, key, window)] = value
        for labels in self._children.keys() - values.keys():
            self._gauges[labels[0]].remove(*labels[1:])
            del self._children[labels]
        for labels, value in values.items():
            child, u = self._child(labels)
            child.set(value * u.times / u.per)
        self.published.inc(len(snapshots))

    def _admit(self, snapshots: list[SignalSnapshot]) -> None:
        """Give series of their own to new keys of the folded scopes while there is room; a key
        no longer published gives its room back."""
        for scope, own in self._own.items():
            published = {s.key for s in snapshots if s.scope == scope}
            for key in [k for k in own if k not in published]:
                del own[key]
            for key in sorted(published - own.keys())[:max(0, self.max_keys - len(own))]:
                own[key] = None

    def _window(self, snapshot: SignalSnapshot) -> str:
        if snapshot.scope == "fleet" and snapshot.key != "all":
            return "now"  # the fleet view of one worker
        return f"{snapshot.window_s:g}" if snapshot.window_s in self.windows_s else "total"

    def _child(self, labels: tuple[str, str, str, str]) -> tuple[Any, Unit]:
        found = self._children.get(labels)
        if found is None:
            name = labels[0]
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._gauges[name] = Gauge(metric_name(name), signal_help(name), _LABELS,
                                                   registry=self.registry)
            found = self._children[labels] = (gauge.labels(*labels[1:]), unit(name))
        return found
