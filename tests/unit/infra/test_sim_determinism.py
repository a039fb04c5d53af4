"""Same workload, options and seed: the same ``governor sim`` report, but for wall-clock fields."""

import json

import pytest

from infra.sim import SimOptions, simulate
from tests.unit.infra.sim_factories import azure_like, conversations

WALL_CLOCK_FIELDS = ("wall_s", "requests_per_wall_s", "cpu_s", "requests_per_cpu_s",
                     "peak_rss_mib", "wall_s_router", "wall_s_engines", "wall_s_controllers")


def _report(trace, **options) -> str:
    report, _ = simulate(trace, SimOptions(**options), "test")
    for name in WALL_CLOCK_FIELDS:
        report.pop(name)
    return json.dumps(report, sort_keys=True)


@pytest.mark.parametrize("policy", ["governor", "round_robin", "least_loaded", "kv_aware"])
def test_same_seed_same_report(policy):
    trace = azure_like() + []
    a = _report(trace, policy=policy, fleet="h100:2,a100:1", seed=7, rate_scale=3.0)
    b = _report(trace, policy=policy, fleet="h100:2,a100:1", seed=7, rate_scale=3.0)
    assert a == b


def test_same_seed_same_report_for_workflows_under_pressure():
    trace = conversations(40)
    a = _report(trace, policy="governor", fleet="h100:1", seed=1, rate_scale=20.0)
    b = _report(trace, policy="governor", fleet="h100:1", seed=1, rate_scale=20.0)
    assert a == b


def test_report_has_every_contract_field():
    report, _ = simulate(azure_like(10.0), SimOptions(policy="kv_aware", fleet="h100:1"), "t")
    contract = ("policy, trace, requests, completed, rejected, failed, slo_attainment, ttft_p50_s, "
                "ttft_p99_s, e2e_p99_s, tasks, tasks_succeeded, cost_usd, "
                "cost_per_successful_task_usd, gpu_hours, prefix_cache_hit_rate, wall_s").split(", ")
    assert [k for k in contract if k not in report] == []
    assert report["policy"] == "kv_aware" and report["trace"] == "t"
