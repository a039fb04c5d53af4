"""Prometheus metrics of the streams component: every published signal, and its own counters.

Each value of a ``SignalSnapshot`` becomes the gauge ``governor_<value name>`` with the labels
``scope``, ``key`` and ``window_s`` (``running total`` windows are labelled ``total``), e.g.
``governor_ttft_p99_s{scope="pool",key="h100@llama-3-8b",window_s="10"}``. One mapping, here,
from signal names to metric names.
"""

import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from schemas.events import SignalSnapshot

_LABELS = ("scope", "key", "window_s")


def metric_name(value_name: str) -> str:
    return "governor_" + re.sub(r"[^a-zA-Z0-9_]", "_", value_name)


class SignalMetrics:
    def __init__(self, registry: CollectorRegistry | None = None,
                 windows_s: tuple[int, ...] = (10, 60)) -> None:
        self.registry = registry or CollectorRegistry()
        self.windows_s = set(windows_s)
        self._gauges: dict[str, Gauge] = {}
        #: Each gauge's child per labels, looked up once (``labels()`` costs microseconds, and a
        #: publication sets thousands of values).
        self._children: dict[tuple[str, str, str, str], Any] = {}
        self.records = Counter("governor_streams_records", "Records the streams agents read",
                               ["source"], registry=self.registry)
        self.observations = Counter("governor_streams_observations",
                                    "Observations applied to windows", registry=self.registry)
        self.duplicates = Counter("governor_streams_duplicates",
                                  "Observations dropped as already counted", registry=self.registry)
        self.dead_letters = Counter("governor_streams_dead_letters",
                                    "Records sent to the dead-letter topic", registry=self.registry)
        self.published = Counter("governor_streams_snapshots_published",
                                 "Signal snapshots published", registry=self.registry)

    def observe(self, snapshot: SignalSnapshot) -> None:
        window = f"{snapshot.window_s:g}" if snapshot.window_s in self.windows_s else "total"
        if snapshot.scope == "fleet" and snapshot.key != "all":
            window = "now"  # the fleet view of one worker
        for name, value in snapshot.values.items():
            labels = (name, snapshot.scope, snapshot.key, window)
            child = self._children.get(labels)
            if child is None:
                gauge = self._gauges.get(name)
                if gauge is None:
                    gauge = self._gauges[name] = Gauge(metric_name(name), f"signal {name}",
                                                       _LABELS, registry=self.registry)
                child = self._children[labels] = gauge.labels(*labels[1:])
            child.set(value)
        self.published.inc()
