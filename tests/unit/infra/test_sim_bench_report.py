"""The policy benchmark's report from results (no simulation run here)."""

from pathlib import Path

from benchmarks.bench_report import verdicts, write_report
from benchmarks.policy_bench import VARIANTS, WORKLOADS, cases, variant_settings
from schemas.config import GovernorConfig


def _result(workload, load, policy, config, cost, slo, p99):
    return {"workload": workload, "load": load, "policy": policy, "config": config,
            "rate_scale": 1.0 if load == "base" else 4.0, "requests": 10, "completed": 9,
            "rejected": 1, "failed": 0, "succeeded": 9, "slo_attainment": slo, "ttft_p50_s": 0.1,
            "ttft_p99_s": p99, "e2e_p99_s": 2.0, "tasks": 10, "tasks_succeeded": 9, "cost_usd": 1.0,
            "cost_per_successful_task_usd": cost, "gpu_hours": 0.3, "prefix_cache_hit_rate": 0.2,
            "wall_s": 0.5, "rejected_by_reason": {"load_shed": 1}, "failed_by_reason": {},
            "first_tokens": 9, "ttft_cdf_s": [0.1] * 101, "fleet": "h100:2",
            "fleet_timeline": [[0.0, 2, 2], [5.0, 1, 1]], "requests_per_wall_s": 20,
            "peak_rss_mib": 60.0, "wall_s_router": 0.1, "wall_s_engines": 0.2,
            "wall_s_controllers": 0.0}


def test_report_tables_and_verdicts(tmp_path: Path):
    results = [_result("mooncake", load, p, "default", c, s, p99)
               for load in ("base", "high")
               for p, c, s, p99 in (("round_robin", 1.0, 0.5, 50.0), ("least_loaded", 1.1, 0.5, 40.0),
                                    ("kv_aware", 0.9, 0.6, 30.0), ("governor", 0.6, 0.7, 5.0))]
    results += [_result("mooncake", "speed", p, "default", 1.0, 1.0, 1.0) for p in ("round_robin", "governor")]
    rows = verdicts(results)
    assert len(rows) == 2 and all("kv_aware 0.9" in r and "+33.3%" in r and "| met |" in r for r in rows)
    path = write_report(tmp_path, results, [{"name": "mooncake", "title": "M", "fleet": "h100:2",
                                             "loads": [["base", 1.0], ["high", 4.0]],
                                             "window_s": 60.0, "quick_window_s": 10.0}],
                        quick=True, bench_wall_s=1.0, jobs=1, variants=VARIANTS)
    text = path.read_text()
    assert "round_robin 50.00 s / governor 5.00 s = 10.00x (met: the goal is 5x; percentiles" in text
    assert "### mooncake, high load (4x), h100:2" in text and (tmp_path / "results.json").exists()
    assert "| governor | 10 | 0.50 | 20 | 0.10 | 0.20 | 0.00 | 60.0 | – |" in text


def test_every_case_is_a_valid_configuration():
    all_cases = cases(quick=True)
    assert {c.workload for c in all_cases} == {w.name for w in WORKLOADS}
    for case in all_cases:
        GovernorConfig.model_validate(variant_settings(case.config, case.fleet))
