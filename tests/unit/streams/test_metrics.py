"""Prometheus gauges of the published signals: no stale series, bounded label values."""

import pytest

from schemas.events import FirstToken, Queued, Rejected, SignalSnapshot, WorkerStatus
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
    assert _value(metrics, "ttft_p99_s", "fleet", "all", "10") == pytest.approx(9.0, rel=0.01)
    for i in range(1, 200):  # 100 s of heartbeats, no first token
        pipeline.send(WorkerStatus(event_time_ms=T + 9_000 + i * 500, worker_id="w1", slot=0,
                                   pool="h100@m", gpu_type="h100", started_ms=T))
    metrics.publish(pipeline.snapshots())
    assert _value(metrics, "ttft_p99_s", "fleet", "all", "10") is None
    assert _value(metrics, "ttft_p99_s", "fleet", "all") == pytest.approx(9.0, rel=0.01)


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
    for name, unit in (("ttft_p99_s", "seconds"), ("last_seen_ms", "milliseconds since the epoch"),
                       ("slo_attainment", "fraction"), ("spend_usd", "US dollars"),
                       ("tokens_out_per_s", "per second"), ("state_code", "6 stopped"),
                       ("completed", "count"), ("gpu_hours", "GPU-hours")):
        assert unit in helps[f"governor_{name}"], (name, helps[f"governor_{name}"])
