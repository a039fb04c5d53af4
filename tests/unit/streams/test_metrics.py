"""Prometheus gauges of the published signals: no stale series, bounded label values."""

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schemas.events import (Completed, FirstToken, Queued, Rejected, SignalSnapshot, Started,
                            WorkerStatus)
from streams.metrics import OTHER, SignalMetrics
from streams.pipeline import Pipeline
from streams.settings import StreamsSettings
from streams.signals.window import ADDITIVE, agg, initialize, result

T = 1_700_000_000_000


def _value(metrics, name, scope, key, window="total"):
    return metrics.registry.get_sample_value(f"governor_{name}",
                                             {"scope": scope, "key": key, "window_s": window})


def _keys(metrics, scope):
    return {s.labels["key"] for family in metrics.registry.collect() for s in family.samples
            if s.labels.get("scope") == scope}


def test_a_value_a_newer_snapshot_lacks_is_no_longer_exported():
    """The 10 s window's TTFT p99 stayed at 8.94 s 100 s after the last first token."""
    pipeline, metrics = Pipeline(), SignalMetrics()
    pipeline.send(Queued(event_time_ms=T, request_id="r", prompt_tokens=1, max_tokens=1,
                         created_ms=T),
                  FirstToken(event_time_ms=T + 9_000, request_id="r", worker_id="w1", ttft_s=9.0))
    metrics.publish(pipeline.snapshots())
    assert _value(metrics, "ttft_p99_seconds", "fleet", "all", "10") == pytest.approx(9.0, rel=0.01)
    for i in range(1, 200):  # 100 s of heartbeats, no first token
        pipeline.send(WorkerStatus(event_time_ms=T + 9_000 + i * 500, worker_id="w1", slot=0,
                                   pool="h100@m", gpu_type="h100", started_ms=T))
    metrics.publish(pipeline.snapshots())
    assert _value(metrics, "ttft_p99_seconds", "fleet", "all", "10") is None
    assert _value(metrics, "ttft_p99_seconds", "fleet", "all") == pytest.approx(9.0, rel=0.01)


def _snapshot(scope, key, **values):
    return SignalSnapshot(event_time_ms=T, scope=scope, key=key, window_s=10.0,
                          window_end_ms=T, values=values)


def test_keys_missing_from_a_publication_lose_their_series():
    """A worker's partitions moved to another worker: it no longer publishes their keys."""
    metrics = SignalMetrics()
    metrics.publish([_snapshot("pool", "a", running=1.0), _snapshot("pool", "b", running=2.0)])
    metrics.publish([_snapshot("pool", "a", running=3.0)])
    assert _keys(metrics, "pool") == {"a"} and _value(metrics, "running", "pool", "a", "10") == 3


def test_client_named_tenants_and_models_beyond_the_bound_fold_into_other():
    """2,000 made-up tenant and model names made 288,072 series."""
    pipeline, metrics = Pipeline(), SignalMetrics(max_keys=5)
    for i in range(200):
        pipeline.send(Rejected(event_time_ms=T + i, request_id=f"r{i}", tenant=f"t{i:03d}",
                               model=f"m{i:03d}", reason="rate_limited", retry_after_s=1.0))
    metrics.publish(pipeline.snapshots())
    for scope in ("tenant", "model"):
        assert _keys(metrics, scope) == {f"{scope[0]}{i:03d}" for i in range(5)} | {OTHER}
        assert _value(metrics, "rejected", scope, OTHER) == 195
        assert _value(metrics, "success_rate", scope, OTHER) is None  # a ratio: not summed
    series = sum(len(family.samples) for family in metrics.registry.collect())
    assert series < 2_000
    metrics.publish(pipeline.snapshots())  # the keys admitted keep their series
    assert _keys(metrics, "tenant") == {f"t{i:03d}" for i in range(5)} | {OTHER}


def test_tenants_idle_past_the_scope_retention_give_their_series_to_an_active_one():
    """Idle keys were published for ever, so the earliest two tenants kept the only two series
    and the one active tenant was folded into ``~other`` for good (here on partitions of their
    own, which receive nothing after them: they are not published though not yet forgotten)."""
    pipeline = Pipeline(StreamsSettings(scope_retention_s=600))
    metrics = SignalMetrics(max_keys=2)
    for i, tenant in enumerate(["old-a", "old-b"]):
        pipeline.send(Rejected(event_time_ms=T + i, request_id=f"o{i}", tenant=tenant,
                               reason="load_shed"))
    metrics.publish(pipeline.snapshots())
    for i in range(0, 700, 10):  # from 100 s to 800 s later, only "big"
        pipeline.send(Rejected(event_time_ms=T + 100_000 + i * 1000, request_id=f"b{i}",
                               tenant="big", reason="load_shed"))
        metrics.publish(pipeline.snapshots())
    assert _keys(metrics, "tenant") == {"big"}
    assert _value(metrics, "rejected", "tenant", "big") == 70


def test_the_additive_values_are_values_the_windows_give():
    bucket = initialize()
    for kind in ("c", "h", "ch", "tc", "lost", "rqe"):
        obs = {"k": kind, "t": T, "e2e": 1.0, "in": 1, "out": 1, "ok": 1, "slo": 1, "w": "w",
               "dt": 1.0, "busy": 1, "usd": 1.0, "pq": 1, "ph": 1, "run": 1, "wait": 1,
               "kvu": 1, "kvf": 1, "o": "succeeded", "held": 1, "ends": 1}
        agg(bucket, obs, T)
    bucket["c"]["late_events"] = 1.0
    assert ADDITIVE <= set(result(bucket, 10.0))


def test_each_signal_gauge_says_its_unit_in_its_help():
    """Before 6 Dec every gauge's help was ``signal <name>``: nothing said that ``_s`` is
    seconds, ``_ms`` an epoch time in milliseconds, a rate a fraction, or what a state code
    means."""
    metrics = SignalMetrics()
    values = {"ttft_p99_s": 0.2, "last_seen_ms": T, "slo_attainment": 0.9, "spend_usd": 1.0,
              "tokens_out_per_s": 5.0, "state_code": 2, "completed": 3, "gpu_hours": 0.1}
    metrics.publish([SignalSnapshot(event_time_ms=T, scope="pool", key="h100@m", window_s=10,
                                    window_end_ms=T, values=values)])
    helps = {f.name: f.documentation for f in metrics.registry.collect()}
    for name, unit in (("ttft_p99_seconds", "seconds"),
                       ("last_seen_timestamp_seconds", "seconds since the epoch"),
                       ("slo_attainment", "fraction"), ("spend_usd", "US dollars"),
                       ("tokens_out_per_second", "per second"), ("state_code", "6 stopped"),
                       ("completed", "count"), ("gpu_seconds", "GPU-seconds")):
        assert unit in helps[f"governor_{name}"], (name, helps[f"governor_{name}"])


def _scrape(metrics) -> dict[str, tuple[str, dict[tuple, float]]]:
    """The registry's exposition as a scraper reads it: by metric name, the signal value named
    first in its help (``Signal <value name> (...``) and its samples by labels."""
    families = text_string_to_metric_families(generate_latest(metrics.registry).decode())
    return {f.name: (f.documentation.split(" ")[1] if f.documentation.startswith("Signal ")
                     else "",
                     {tuple(sorted(s.labels.items())): s.value for s in f.samples})
            for f in families}


def test_signal_gauges_are_named_and_valued_in_prometheus_base_units():
    """Before 6 Dec (evening) the gauges were named as the signals' values are: ``_s``, ``_ms``
    (an epoch time in milliseconds) and ``_per_s``, against Prometheus's naming conventions
    (base units, spelled out: ``_seconds``, ``_timestamp_seconds``, ``_per_second``), which
    dashboards' unit inference and ``promtool check metrics`` go by."""
    t0 = 1_800_000_000_000
    pipeline, metrics = Pipeline(), SignalMetrics()
    heartbeat = dict(worker_id="w1", slot=0, pool="h100@m", gpu_type="h100", started_ms=t0)
    pipeline.send(WorkerStatus(event_time_ms=t0, **heartbeat),
                  Queued(event_time_ms=t0, request_id="r", prompt_tokens=10, max_tokens=5,
                         created_ms=t0),
                  Started(event_time_ms=t0 + 100, request_id="r", worker_id="w1"),
                  FirstToken(event_time_ms=t0 + 300, request_id="r", worker_id="w1",
                             ttft_s=0.3),
                  Completed(event_time_ms=t0 + 900, request_id="r", worker_id="w1",
                            prompt_tokens=10, output_tokens=5, e2e_s=0.9),
                  WorkerStatus(event_time_ms=t0 + 1_000, **heartbeat))
    now = t0 + 1_500  # the streams worker publishes its windows and its fleet view together
    metrics.publish(pipeline.snapshots(now) + pipeline.stages.fleet_view(None, now))
    scraped = _scrape(metrics)
    signals = {value: name for name, (value, _) in scraped.items() if value}
    assert {"ttft_p99_s", "age_s", "provisioned_s", "last_seen_ms", "last_event_ms",
            "tokens_out_per_s", "gpu_hours", "price_usd_per_hour"} <= signals.keys()
    for name in scraped:
        assert not name.endswith(("_s", "_ms", "_per_s", "_hours", "_per_hour")), name
    for value, name in signals.items():
        if value.endswith("_ms"):  # a time since the epoch
            assert name.endswith("_timestamp_seconds"), (value, name)
        elif value.endswith("_per_s"):
            assert name.endswith("_per_second"), (value, name)
        elif value.endswith(("_s", "_hours")):  # a time
            assert name.endswith("_seconds"), (value, name)
    worker = (("key", "w1"), ("scope", "fleet"), ("window_s", "now"))
    assert scraped[signals["last_seen_ms"]][1][worker] == 1.8e9 + 1
    assert scraped[signals["age_s"]][1][worker] == 0.5
    pool = (("key", "h100@m"), ("scope", "pool"), ("window_s", "total"))
    assert scraped[signals["last_event_ms"]][1][pool] == pytest.approx(1.8e9 + 0.9)
    assert scraped[signals["gpu_hours"]][1][pool] == pytest.approx(1.0)  # GPU-seconds
    price = StreamsSettings().gpu_prices_usd_per_hour["h100"]
    assert scraped[signals["price_usd_per_hour"]][1][worker] == pytest.approx(price / 3600)
