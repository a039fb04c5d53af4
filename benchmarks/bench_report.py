"""The policy benchmark's report: ``REPORT.md``, ``results.json`` and PNG plots."""

import json
import logging
import math
import platform
from pathlib import Path

from infra.sim.slo import SloRule
from infra.stack import parse_fleet
from infra.wording import TO_USER, counted

logger = logging.getLogger(__name__)

ORDER = ("round_robin", "least_loaded", "kv_aware", "governor")
COLUMNS = ("policy", "requests", "completed", "rejected", "failed", "slo_attainment",
           "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "tasks", "tasks_succeeded", "cost_usd",
           "cost_per_successful_task_usd", "gpu_hours", "prefix_cache_hit_rate", "breakers_opened",
           "wall_s")


def _label(r: dict) -> str:
    return r["policy"] + ("" if r["config"] == "default" else f" ({r['config']})")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return "–" if v is None else str(v)


def _rows(results: list[dict], workload: str, load: str) -> list[dict]:
    rows = [r for r in results if r["workload"] == workload and r["load"] == load]
    return sorted(rows, key=lambda r: (ORDER.index(r["policy"]), r["config"] != "default", r["config"]))


def _table(rows: list[dict]) -> list[str]:
    head = ["policy", *COLUMNS[1:], "why not succeeded"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        why = {**r["rejected_by_reason"], **{f"failed:{k}": v for k, v in r["failed_by_reason"].items()}}
        late = r["completed"] - r["succeeded"]
        if late:
            why["late"] = late
        cells = [_label(r)] + [_fmt(r.get(c)) for c in COLUMNS[1:]]
        cells.append(", ".join(f"{k} {v}" for k, v in why.items()) or "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def billed_to(r: dict, end_s: float) -> float:
    """``r``'s spend had the fleet it held at its end been paid on to ``end_s`` (a run ends at
    its last request; a fixed fleet is paid on whatever the policy). The price is the run's own
    average per GPU-hour: every bench fleet is one pool, of one GPU type, its workers each on
    its tensor parallelism's GPUs (the timeline counts workers: before 7 Dec each was billed as
    one GPU, a fleet of TP 4 paid on at a quarter of its price)."""
    if not r["gpu_hours"] or end_s <= r["simulated_s"]:
        return r["cost_usd"]
    per_gpu_s = r["cost_usd"] / r["gpu_hours"] / 3600
    gpus = r["fleet_timeline"][-1][1] * _gpus_per_worker(r["fleet"])
    return r["cost_usd"] + (end_s - r["simulated_s"]) * gpus * per_gpu_s


def _gpus_per_worker(fleet: str) -> int:
    pools = parse_fleet(fleet)
    if len({pool.tp for pool in pools}) != 1:
        raise ValueError(f"billed_to bills a fleet of one tensor parallelism, not {fleet}")
    return pools[0].tp


def _cost_cell(r: dict, per_task: float | None) -> str:
    """A run's cost per successful task, with its SLO attainment and tasks succeeded beside it:
    a cheaper run that meets fewer SLOs or tasks is no win."""
    return (f"{_fmt(per_task)} (SLO {_fmt(r['slo_attainment'])}, tasks "
            f"{r['tasks_succeeded']}/{r['tasks']})")


def verdicts(results: list[dict], variant: str = "default", same_end: bool = False) -> list[str]:
    """The issue's goal, measured: a governor configuration against the cheapest baseline.
    ``same_end``: the baselines' runs of a cell and the configuration's billed to the latest
    end among them (``billed_to``), not each to its own; a policy that sheds ends sooner, and a
    fixed fleet is paid on after it. A cell the configuration ran in with no baseline to compare
    with (a bench cut short, results filtered by hand) is said to be so, not judged."""
    out = []
    for key in sorted({(r["workload"], r["load"]) for r in results if r["load"] != "speed"}):
        rows = [r for r in _rows(results, *key)  # the baselines and the configuration judged
                if r["policy"] != "governor" or r["config"] == variant]
        gov = next((r for r in rows if r["policy"] == "governor"), None)
        if gov is None:
            continue
        end_s = max(r["simulated_s"] for r in rows) if same_end else None

        def per_task(r: dict) -> float | None:
            if end_s is None:
                return r["cost_per_successful_task_usd"]
            return billed_to(r, end_s) / r["tasks_succeeded"] if r["tasks_succeeded"] else None

        g = per_task(gov)
        base = [r for r in rows if r["policy"] != "governor" and per_task(r)]
        if not base:
            none = "no baseline run" if len(rows) == 1 else "no baseline succeeded a task"
            out.append(f"| {key[0]} | {key[1]} | {none} | {_cost_cell(gov, g)} | – | not judged |")
            continue
        best = min(base, key=per_task)
        b = per_task(best)
        saving = 1 - g / b if g else None
        ok = saving is not None and saving >= 0.25 and gov["slo_attainment"] >= best["slo_attainment"]
        out.append(f"| {key[0]} | {key[1]} | {best['policy']} {_cost_cell(best, b)} | "
                   f"{_cost_cell(gov, g)} | {'–' if saving is None else f'{saving:+.1%}'} | "
                   f"{'met' if ok else 'NOT met'} |")
    return out


def _p99_ratio(results: list[dict], variant: str = "default") -> str:
    rows = _rows(results, "mooncake", "high")
    rr = next((r for r in rows if r["policy"] == "round_robin"), None)
    gov = next((r for r in rows if r["policy"] == "governor" and r["config"] == variant), None)
    if not rr or not gov or not gov["ttft_p99_s"]:
        return "not measured"
    ratio = rr["ttft_p99_s"] / gov["ttft_p99_s"]
    served = (f"; percentiles are over requests that got a first token: governor "
              f"{gov.get('first_tokens', '?')} of {gov['requests']}, round_robin "
              f"{rr.get('first_tokens', '?')} of {rr['requests']}")
    over_all = "; over all requests, one never served counted as never answered: " + ", ".join(
        f"p{q:g} round_robin {_of_all(rr, q)} / governor {_of_all(gov, q)}" for q in (90, 95, 99))
    return (f"round_robin {rr['ttft_p99_s']:.2f} s / governor {gov['ttft_p99_s']:.2f} s = "
            f"{ratio:.2f}x ({'met' if ratio >= 5 else 'NOT met'}: the goal is 5x{served}"
            f"{over_all})")


def ttft_of_all(r: dict, q: float) -> float | None:
    """The ``q``-th TTFT percentile over all of ``r``'s requests, those that got no first token
    counted as infinitely late (None where they reach it), from ``ttft_cdf_s`` (percentiles of
    the served ones)."""
    served = r.get("first_tokens", r["requests"])
    at = q / 100 * r["requests"] / served * 100 if served else math.inf
    if at > 100:
        return None
    cdf, low = r["ttft_cdf_s"], int(at)
    return cdf[low] if low == 100 else cdf[low] + (cdf[low + 1] - cdf[low]) * (at - low)


def _of_all(r: dict, q: float) -> str:
    value = ttft_of_all(r, q)
    return "none (too few served)" if value is None else f"{value:.2f} s"


def write_report(out: Path, results: list[dict], workloads: list[dict], *, quick: bool,
                 bench_wall_s: float, jobs: int, variants: dict[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: (r["workload"], r["load"], ORDER.index(r["policy"]),
                                             r["config"]))
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    try:
        from benchmarks.bench_plots import plot_all
    except ImportError:  # matplotlib is the optional `bench` extra
        plots = []
        logger.warning("matplotlib is not installed (pip install -e '.[bench]'): no plots",
                       extra=TO_USER)
    else:
        plots = plot_all(out, results, [w["name"] for w in workloads])
    speed = [r for r in results if r["load"] == "speed"]
    lines = [
        "# Policy benchmark: Governor vs baselines in virtual time",
        "",
        f"Generated by `governor bench{' --quick' if quick else ''}` (`benchmarks/policy_bench.py`) "
        f"in {bench_wall_s:.0f} s wall with {counted(jobs, 'parallel job')} on {platform.machine()} "
        f"({platform.python_implementation()} {platform.python_version()}). Every number below "
        "is from the offline simulator (`infra/sim`): the live `RouterCore` and controllers "
        "driving calibrated simulated vLLM engines (Llama-3-8B), no Kafka, no wall clock.",
        "",
        "## Setup",
        "",
        f"- SLOs (no trace carries any): {SloRule().describe()}. A request succeeds when it "
        "completes within its deadline, a task when all of its steps do; `slo_attainment` is "
        "the share of all requests that succeeded *and* met the TTFT SLO.",
        "- Cost: every provisioned GPU at its list price (config defaults: A100 $1.80, H100 "
        "$3.00, H200 $3.70 per hour) from time 0 until the last request ends; "
        "`cost_per_successful_task_usd` = total spend / tasks succeeded.",
        "- Policies: `round_robin`, `least_loaded`, `kv_aware` (Dynamo's KV-router cost, "
        "exact prefix overlap from KV events), each on a fixed fleet with no admission control, "
        f"and `governor` in {len(variants)} configurations:",
        *[f"  - `{name}`: {text}" for name, text in variants.items()],
        "- Hand-written analysis of these numbers (where governor wins, where it loses and why): "
        + ("[ANALYSIS.md](ANALYSIS.md)." if (out / "ANALYSIS.md").exists() else
           "`benchmarks/results/ANALYSIS.md` in the repository (of its committed results)."),
        "",
        "| workload | fleet | window of arrivals | loads (rate scale) |",
        "|---|---|---|---|",
    ]
    for w in workloads:
        window = w["quick_window_s"] if quick else w["window_s"]
        loads = ", ".join(f"{label} {scale:g}x" for label, scale in w["loads"])
        lines.append(f"| {w['title']} | {w['fleet']} | first {window:g} s | {loads} |")
    lines += ["", "## Goals, measured", "",
              "Governor's cost per successful task against the cheapest baseline (goal: at least "
              "25% lower at equal or better SLO attainment), for each governor configuration:", ""]
    head = ["| workload | load | best baseline $/task | governor $/task | saving | goal |",
            "|---|---|---|---|---|---|"]
    for variant in variants:
        lines += [f"`governor ({variant})`:", "", *head, *verdicts(results, variant), ""]
        if any(r["workload"] == "mooncake" and r["config"] == variant for r in results):
            lines += [f"Mooncake p99 TTFT at high load: {_p99_ratio(results, variant)}.", ""]
    lines += ["### The same, every run of a cell billed to the cell's latest end", "",
              "A run ends, and stops paying, when its last request ends: a policy that sheds "
              "ends sooner than one that drains a backlog of late work, but a fixed fleet is "
              "paid on whatever the policy. Here every run of a cell is billed to the latest end "
              "in that cell among the baselines and the configuration judged, each with the "
              "fleet it held at its own end (the autoscaler's smaller fleet too); successes are "
              "unchanged (no request arrives after).", ""]
    for variant in variants:
        lines += [f"`governor ({variant})`:", "", *head,
                  *verdicts(results, variant, same_end=True), ""]
    if speed:
        span = ("the first 300 s of the Mooncake trace (`--quick`; the target is for the "
                "whole trace)" if quick else "the whole Mooncake trace")
        lines += [f"## Simulation speed and memory ({span}, 16 H100s, one core each)",
                  "", "Target: at least 20,000 simulated requests per wall-second and under 1 GiB.", "",
                  "Each run alone in a fresh process, after the others; the machine's 1-minute "
                  "load average when it ended is shown (other work on a shared machine slows it). "
                  "Wall time inside `RouterCore` (route and resume), the engines and the "
                  "controllers; the rest is the simulator's own event handling.", "",
                  "| policy | requests | wall s | requests / wall s | router s | engines s | "
                  "controllers s | peak RSS MiB | load average |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(speed, key=lambda r: (ORDER.index(r["policy"]), r["config"])):
            lines.append(f"| {_label(r)} | {r['requests']} | {r['wall_s']:.2f} | "
                         f"{r['requests_per_wall_s']:,} | {r['wall_s_router']:.2f} | "
                         f"{r['wall_s_engines']:.2f} | {r['wall_s_controllers']:.2f} | "
                         f"{r['peak_rss_mib']} | {r.get('load_average', '–')} |")
        lines.append("")
    lines += ["## Results", ""]
    for w in workloads:
        for label, scale in w["loads"]:
            rows = _rows(results, w["name"], label)
            if rows:
                lines += [f"### {w['name']}, {label} load ({scale:g}x), {w['fleet']}", "",
                          *_table(rows), ""]
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines))
    return path
