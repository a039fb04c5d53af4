"""The sink's Prometheus metrics are its ``SinkStats`` as they stand when scraped."""

from analytics.metrics import COUNTERS, sink_registry
from analytics.sink import SinkStats


def test_the_sinks_metrics_read_its_stats_when_scraped():
    stats = SinkStats()
    registry = sink_registry(lambda: stats)
    value = registry.get_sample_value
    assert value("governor_sink_rows_written_total") == 0
    assert value("governor_sink_store_ok") == 0
    stats.records, stats.rows_written, stats.flushes, stats.partitions = 10, 7, 2, 3
    stats.store_ok, stats.store_failures, stats.kafka_failures = True, 1, 4
    assert value("governor_sink_records_total") == 10
    assert value("governor_sink_rows_written_total") == 7
    assert value("governor_sink_flushes_total") == 2
    assert value("governor_sink_partitions") == 3 and value("governor_sink_store_ok") == 1
    assert value("governor_sink_kafka_failures_total") == 4
    counted = {field for field, _ in COUNTERS.values()}
    numbers = {name for name, kind in SinkStats.__annotations__.items() if kind in ("int", int)}
    assert counted == numbers - {"partitions", "pending_records"}  # every counter is exported
