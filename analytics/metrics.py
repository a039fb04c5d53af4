"""Prometheus metrics of the analytics sink, read off its ``SinkStats`` when scraped
(``governor sink --metrics-port P``)."""

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from analytics.sink import SinkStats

#: The counters of ``SinkStats``, by the name each is exported under (``<name>_total``).
COUNTERS = {
    "governor_sink_records": ("records", "Records read from Kafka (read again after a "
                                         "rebalance: counted again)."),
    "governor_sink_rows_written": ("rows_written", "Rows the store took in completed flushes."),
    "governor_sink_flushes": ("flushes", "Flushes completed."),
    "governor_sink_replayed_rows": ("replayed_rows", "Rows of a crashed run's unfinished "
                                                     "flushes, written again."),
    "governor_sink_store_failures": ("store_failures", "Store actions that failed (retried)."),
    "governor_sink_kafka_failures": ("kafka_failures", "Kafka reads that failed (retried)."),
}


class SinkCollector(Collector):
    def __init__(self, stats: Callable[[], SinkStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator:
        stats = self.stats()
        for name, (field, text) in COUNTERS.items():
            yield CounterMetricFamily(name, text, value=getattr(stats, field))
        yield GaugeMetricFamily("governor_sink_partitions",
                                "Partitions assigned to this sink (several split them).",
                                value=stats.partitions)
        yield GaugeMetricFamily("governor_sink_store_ok",
                                "1 while the store's last action succeeded.",
                                value=int(stats.store_ok))
        yield GaugeMetricFamily("governor_sink_pending_records",
                                "Records read that the store does not hold yet: the batch being "
                                "filled and the flush in flight (a full batch stops the reads).",
                                value=stats.pending_records)
        yield GaugeMetricFamily("governor_sink_last_flush_timestamp_seconds",
                                "When the last flush landed in the store, in seconds since the "
                                "epoch (0: none since the sink started).",
                                value=stats.last_flush_s)


def sink_registry(stats: Callable[[], SinkStats],
                  registry: CollectorRegistry | None = None) -> CollectorRegistry:
    registry = registry or CollectorRegistry()
    registry.register(SinkCollector(stats))
    return registry
