"""The bucket aggregator against hand-computed values."""

import pytest

from streams.signals import window


def _bucket(*observations):
    bucket = window.initialize()
    for obs in observations:
        window.agg(bucket, obs, obs["t"])
    return bucket


def _completed(t, e2e, ok=1, slo=1, itl=0.01, tokens_in=100, tokens_out=50):
    return {"k": "c", "t": t, "e2e": e2e, "in": tokens_in, "out": tokens_out, "ok": ok, "slo": slo,
            "itl": itl}


def _hb(t, worker, dt, busy, usd, run=0, wait=0, kvu=0, kvf=100, pq=0, ph=0):
    return {"k": "h", "t": t, "w": worker, "dt": dt, "busy": busy, "usd": usd, "pq": pq, "ph": ph,
            "run": run, "wait": wait, "kvu": kvu, "kvf": kvf}


def test_request_counts_rates_success_and_slo():
    values = window.result(_bucket(
        {"k": "q", "t": 1}, {"k": "q", "t": 2}, {"k": "q", "t": 3}, {"k": "q", "t": 4},
        {"k": "s", "t": 5, "a": 1}, {"k": "s", "t": 6, "a": 2},
        _completed(7, 1.0), _completed(8, 2.0, slo=0), _completed(9, 3.0, ok=0, slo=0),
        {"k": "x", "t": 10}, {"k": "r", "t": 11, "shed": 1}, {"k": "r", "t": 12, "shed": 0},
        {"k": "p", "t": 13}, {"k": "rq", "t": 14}, {"k": "n", "t": 15},
    ), window_s=10)
    assert values["completed"] == 3 and values["failed"] == 1 and values["rejected"] == 2
    assert values["sheds"] == 1 and values["retries"] == 1 and values["requeued"] == 1
    assert values["preemptions"] == 1 and values["cancelled"] == 1
    # 6 terminal (3 completed, 1 failed, 2 rejected); 2 succeeded, 1 met its SLO.
    assert values["success_rate"] == pytest.approx(2 / 6)
    assert values["slo_attainment"] == pytest.approx(1 / 6)
    assert values["goodput_per_s"] == pytest.approx(0.1)
    assert values["requests_per_s"] == pytest.approx(0.3)
    assert values["arrivals_per_s"] == pytest.approx(0.4)
    assert values["tokens_in_per_s"] == pytest.approx(30) and values["tokens_out_per_s"] == 15
    assert values["e2e_p50_s"] == pytest.approx(2.0, rel=0.01)
    # p99 of three values is rank 0.99 * 2 = 1.98: 98% of the way from 2.0 to 3.0, as numpy.
    assert values["e2e_p99_s"] == pytest.approx(2.98, rel=0.01)
    assert values["last_event_ms"] == 15
    assert values["events"] == 15


def test_heartbeats_give_gauges_utilisation_spend_and_prefix_hit_rate():
    values = window.result(_bucket(
        _hb(1000, "w0", 0.5, 1, 0.5, run=2, wait=1, kvu=30, kvf=70, pq=10, ph=4),
        _hb(1500, "w0", 0.5, 0, 0.5, run=1, wait=3, kvu=50, kvf=50, pq=10, ph=6),
        _hb(1200, "w1", 0.5, 1, 0.25, run=4, wait=0, kvu=10, kvf=90),
    ), window_s=10)
    # Latest gauge per worker: w0 at 1500 (1 running, 3 waiting), w1 at 1200.
    assert values["running"] == 5 and values["queue_depth"] == 3 and values["workers"] == 2
    assert values["kv_utilisation"] == pytest.approx(60 / 200)
    assert values["utilisation_ratio"] == pytest.approx(1.0 / 1.5)
    assert values["spend_usd"] == pytest.approx(1.25)
    assert values["gpu_hours"] == pytest.approx(1.5 / 3600)
    assert values["prefix_cache_hit_rate"] == pytest.approx(10 / 20)


def test_task_costs_give_cost_per_successful_task_and_success_per_dollar():
    values = window.result(_bucket(
        {"k": "tc", "t": 1, "o": "succeeded", "usd": 0.30},
        {"k": "tc", "t": 2, "o": "failed", "usd": 0.10},
        {"k": "tc", "t": 3, "o": "timed_out", "usd": 0.05},
        {"k": "tl", "t": 4, "usd": 0.15},
        {"k": "ch", "t": 4, "usd": 0.5}, _completed(5, 1.0),
    ), window_s=60)
    assert values["tasks_closed"] == 3 and values["tasks_succeeded"] == 1
    assert values["tasks_failed"] == 1 and values["tasks_timed_out"] == 1
    assert values["task_cost_usd"] == pytest.approx(0.60)
    assert values["cost_per_successful_task_usd"] == pytest.approx(0.60)
    assert values["success_per_dollar"] == pytest.approx(1 / 0.5)


def test_merge_equals_aggregating_everything_in_one_bucket():
    observations = [_completed(t, t / 10) for t in range(1, 30)] + [
        _hb(40, "w0", 0.5, 1, 0.1, run=3), _hb(20, "w0", 0.5, 1, 0.1, run=9)]
    merged = window.initialize()
    for obs in observations:
        window.merge(merged, _bucket(obs))
    assert window.result(merged, 10) == window.result(_bucket(*observations), 10)
    assert window.result(merged, 10)["running"] == 3  # the newest heartbeat wins


def test_undefined_values_are_left_out():
    values = window.result(window.initialize(), 10)
    assert "success_rate" not in values and "ttft_p50_s" not in values
    assert "utilisation_ratio" not in values and values["completed"] == 0
