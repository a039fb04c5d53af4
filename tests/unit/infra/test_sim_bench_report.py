"""The policy benchmark's report from results (no simulation run here)."""

import logging
import sys
from pathlib import Path

import pytest

from benchmarks.bench_report import billed_to, ttft_of_all, verdicts, write_report
from benchmarks.policy_bench import VARIANTS, WORKLOADS, cases, variant_settings
from infra.cli import _LogLines
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
            "wall_s_controllers": 0.0, "simulated_s": 5.0}


def test_report_tables_and_verdicts(tmp_path: Path):
    results = [_result("mooncake", load, p, "default", c, s, p99)
               for load in ("base", "high")
               for p, c, s, p99 in (("round_robin", 1.0, 0.5, 50.0), ("least_loaded", 1.1, 0.5, 40.0),
                                    ("kv_aware", 0.9, 0.6, 30.0), ("governor", 0.6, 0.7, 5.0))]
    results += [_result("mooncake", "speed", p, "default", 1.0, 1.0, 1.0) for p in ("round_robin", "governor")]
    rows = verdicts(results)
    assert len(rows) == 2 and all("kv_aware 0.9" in r and "+33.3%" in r and "| met |" in r for r in rows)
    workloads = [{"name": "mooncake", "title": "M", "fleet": "h100:2",
                  "loads": [["base", 1.0], ["high", 4.0]], "window_s": 60.0,
                  "quick_window_s": 10.0}]
    path = write_report(tmp_path, results, workloads, quick=True, bench_wall_s=1.0, jobs=1,
                        variants=VARIANTS)
    text = path.read_text()
    assert "round_robin 50.00 s / governor 5.00 s = 10.00x (met: the goal is 5x; percentiles" in text
    assert "### mooncake, high load (4x), h100:2" in text and (tmp_path / "results.json").exists()
    assert "| governor | 10 | 0.50 | 20 | 0.10 | 0.20 | 0.00 | 60.0 | – |" in text
    # the analysis is beside the committed report only: elsewhere, no link that goes nowhere
    assert "`benchmarks/results/ANALYSIS.md` in the repository" in text
    assert "](ANALYSIS.md)" not in text
    (tmp_path / "ANALYSIS.md").write_text("# analysis\n")
    text = write_report(tmp_path, results, workloads, quick=True, bench_wall_s=1.0, jobs=1,
                        variants=VARIANTS).read_text()
    assert "[ANALYSIS.md](ANALYSIS.md)." in text


@pytest.mark.parametrize(("jobs", "said"), [(1, "with 1 parallel job on"),
                                            (2, "with 2 parallel jobs on")])
def test_the_report_counts_its_parallel_jobs_as_a_reader_says_them(tmp_path: Path, jobs, said):
    """Before 7 Dec a bench of one job said "1 parallel jobs"."""
    workloads = [{"name": "mooncake", "title": "M", "fleet": "h100:2", "loads": [["base", 1.0]],
                  "window_s": 60.0, "quick_window_s": 10.0}]
    results = [_result("mooncake", "base", policy, "default", 1.0, 0.5, 5.0)
               for policy in ("round_robin", "governor")]
    text = write_report(tmp_path, results, workloads, quick=True, bench_wall_s=1.0, jobs=jobs,
                        variants=VARIANTS).read_text()
    assert said in text


def test_a_cell_billed_to_its_latest_end_charges_the_policy_that_ended_first_on():
    """A policy that sheds ends sooner; billed to the cell's latest end, its fleet is paid on
    (the one it held at its end), which here takes its saving below the goal."""
    def run(policy: str, end_s: float, held: int, tasks_succeeded: int) -> dict:
        r = _result("azure", "high", policy, "default", 0.0, 0.7, 1.0)
        gpu_s = 2 * end_s  # two GPUs from the start, at $3.60 an hour: $0.001 a GPU-second
        r.update(simulated_s=end_s, gpu_hours=gpu_s / 3600, cost_usd=gpu_s * 0.001,
                 fleet_timeline=[[0.0, 2, 2], [end_s, held, held]],
                 tasks_succeeded=tasks_succeeded, tasks=100)
        r["cost_per_successful_task_usd"] = r["cost_usd"] / tasks_succeeded
        return r

    shedding, draining = run("governor", 100.0, 2, 50), run("kv_aware", 200.0, 2, 60)
    assert billed_to(shedding, 200.0) == pytest.approx(0.4)  # 0.2, then 100 s of 2 GPUs
    assert billed_to(draining, 200.0) == pytest.approx(0.4)  # its own end: nothing added
    results = [shedding, draining]
    (own,), (same,) = verdicts(results), verdicts(results, same_end=True)
    assert "+40.0%" in own and "| met |" in own  # 0.004 against 0.00667
    assert "-20.0%" in same and "| NOT met |" in same  # 0.008 against 0.00667
    assert "tasks 50/100" in same and "tasks 60/100" in same


def test_a_fleet_of_tensor_parallel_workers_is_billed_on_for_each_of_their_gpus():
    """The timeline counts workers; each of ``h100:4/tp4`` holds four GPUs (before 7 Dec the
    latest-end account paid one GPU a worker on)."""
    r = _result("azure", "high", "governor", "default", 0.0, 0.7, 1.0)
    r.update(fleet="h100:4/tp4@llama-2-70b", simulated_s=100.0, gpu_hours=400 / 3600,
             cost_usd=0.4, fleet_timeline=[[0.0, 1, 1]])  # one worker of 4 GPUs, $0.001 a GPU-s
    assert billed_to(r, 200.0) == pytest.approx(0.8)  # 100 s more of its 4 GPUs


def test_ttft_percentiles_over_all_requests_count_the_unserved_as_never_answered():
    r = {"requests": 10, "first_tokens": 8, "ttft_cdf_s": [float(v) for v in range(101)]}
    assert ttft_of_all(r, 50) == pytest.approx(62.5)  # the 5th of 10 is the 62.5th of 8 served
    assert ttft_of_all(r, 80) == pytest.approx(100.0)  # the last one served
    assert ttft_of_all(r, 90) is None  # past what was served
    assert ttft_of_all({**r, "first_tokens": 10}, 99) == pytest.approx(99.0)


def test_every_case_is_a_valid_configuration():
    all_cases = cases(quick=True)
    assert {c.workload for c in all_cases} == {w.name for w in WORKLOADS}
    for case in all_cases:
        GovernorConfig.model_validate(variant_settings(case.config, case.fleet))


def test_the_steps_unknown_configuration_runs_on_the_workload_of_tasks_only(tmp_path: Path):
    unknown = [c for c in cases(quick=True) if c.config == "steps_unknown"]
    assert {(c.workload, c.load, c.policy) for c in unknown} == {
        ("sharegpt", "base", "governor"), ("sharegpt", "high", "governor")}
    results = [_result("sharegpt", "high", p, config, c, 0.6, 1.0) for p, config, c in (
        ("kv_aware", "default", 1.0), ("governor", "default", 0.6),
        ("governor", "steps_unknown", 0.7))]
    (row,) = verdicts(results, "steps_unknown")
    assert "kv_aware 1" in row and "+30.0%" in row and "| met |" in row
    text = write_report(tmp_path, results, [{"name": "sharegpt", "title": "S", "fleet": "h100:2",
                                             "loads": [["high", 4.0]], "window_s": 60.0,
                                             "quick_window_s": 10.0}],
                        quick=True, bench_wall_s=1.0, jobs=1, variants=VARIANTS).read_text()
    assert "`governor (steps_unknown)`:" in text and "Mooncake p99" not in text


def test_a_diagnostic_run_that_ends_last_moves_no_other_configurations_common_end():
    results = [_result("azure", "high", p, config, 0.0, 0.7, 1.0) for p, config in (
        ("kv_aware", "default"), ("governor", "default"), ("governor", "steps_unknown"))]
    for r, end_s, held in zip(results, (100.0, 50.0, 400.0), (2, 1, 2)):
        r.update(simulated_s=end_s, gpu_hours=2 * end_s / 3600, cost_usd=2 * end_s * 0.001,
                 fleet_timeline=[[0.0, 2, 2], [end_s, held, held]], tasks_succeeded=10)
        r["cost_per_successful_task_usd"] = r["cost_usd"] / 10
    (default,) = verdicts(results, "default", same_end=True)
    # billed to kv_aware's end, 100 s ($0.15 against $0.20), not the diagnostic's 400 s (+43.8%)
    assert "+25.0%" in default
    (unknown,) = verdicts(results, "steps_unknown", same_end=True)
    assert "+0.0%" in unknown  # kv_aware paid on to 400 s too: $0.80 each


def test_a_cell_with_no_baseline_run_is_reported_as_such_not_judged(tmp_path: Path):
    """A bench cut short (or results filtered by hand) can leave a cell with governor runs and
    no baseline: the report says so for the configuration that ran and leaves the cell out for
    one that did not (before 7 Dec the report stopped on ``max() arg is an empty sequence``)."""
    results = [_result("azure", "high", "governor", "default", 0.5, 0.7, 1.0),
               _result("azure", "base", "governor", "default", 0.5, 0.7, 1.0),
               _result("azure", "base", "kv_aware", "default", 0.0, 0.2, 1.0)]
    results[2].update(tasks_succeeded=0, cost_per_successful_task_usd=None)
    base, high = verdicts(results)
    assert base == ("| azure | base | no baseline succeeded a task | 0.5 (SLO 0.7, tasks 9/10) "
                    "| – | not judged |")
    assert high == "| azure | high | no baseline run | 0.5 (SLO 0.7, tasks 9/10) | – | not judged |"
    base, high = verdicts(results, same_end=True)  # its $1 spend over 9 tasks
    assert base.startswith("| azure | base | no baseline succeeded a task | 0.1111 (SLO 0.7")
    assert high.startswith("| azure | high | no baseline run | 0.1111 (SLO 0.7")
    for same_end in (False, True):
        assert verdicts(results, "steps_unknown", same_end=same_end) == []
    text = write_report(tmp_path, results, [{"name": "azure", "title": "A", "fleet": "h100:2",
                                             "loads": [["base", 1.0], ["high", 4.0]],
                                             "window_s": 60.0, "quick_window_s": 10.0}],
                        quick=True, bench_wall_s=1.0, jobs=1, variants=VARIANTS).read_text()
    assert text.count("| azure | high | no baseline run |") == 2  # own ends and the common end


def test_a_report_without_matplotlib_says_so_as_the_command_lines_other_warnings(
        tmp_path: Path, monkeypatch, caplog):
    """``warning: matplotlib is not installed ...``, as ``governor``'s own warnings; before 7 Dec
    a timestamped log line (``2026-12-07 00:01:02,345 WARNING benchmarks.bench_report: ...``)."""
    monkeypatch.setitem(sys.modules, "benchmarks.bench_plots", None)  # its import fails
    results = [_result("mooncake", "base", p, "default", 1.0, 0.5, 5.0)
               for p in ("round_robin", "governor")]
    with caplog.at_level(logging.WARNING, logger="benchmarks.bench_report"):
        write_report(tmp_path, results, [], quick=True, bench_wall_s=1.0, jobs=1,
                     variants=VARIANTS)
    (record,) = caplog.records
    printed = _LogLines("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record)
    assert printed == "warning: matplotlib is not installed (pip install -e '.[bench]'): no plots"
