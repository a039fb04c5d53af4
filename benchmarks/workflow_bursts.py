"""How far the ShareGPT workflow result of ``governor bench`` carries: other seeds, and the burst
coming inside steady traffic instead of starting the run.

    python -m benchmarks.workflow_bursts [--seeds 0,1,2] [--set KEY=VALUE ...] [--json OUT]

The bench's ShareGPT cell is one workload (seed 0) whose burst starts the run. Here each seed's
workload (built as the bench builds it: 300 s of Azure task starts at 1.32x) is run as:

- ``high``: at 4x, the bench's high load (every conversation starts within about 75 s);
- ``base``: at 1x, the bench's base load (the two workers can serve it all);
- ``steady 0.5x + burst``, ``steady 1x + burst``: the conversations starting in the first 60 s
  at 0.5x (or 1x) with all their steps, then at 60 s the whole workload again at 4x: a burst
  inside steady traffic. The burst's conversations get task ids and prefix hashes of their own
  (they share no KV blocks with the steady ones).

Scaling moves task starts only: a step keeps its offset from its task's first request, and the
simulator sends it once the step before it has ended (``infra/sim/arrivals.py``), as
``governor sim --rate-scale`` does. (Before 5 Dec every arrival was divided, think times too,
and the steps were sent at their times whether or not the answers had come.)

Every policy on two H100s, as the bench runs them; governor twice: as the bench's full stack
(autoscaler on, at most two workers) and on the fixed fleet. ``--set`` changes governor's settings
(both runs), e.g. ``--set task_admission.enabled=false``. Prints, per run, the tasks that
succeeded, SLO attainment and the cost per successful task against the cheapest baseline's (a
minus is a saving; the goal of issue 6 is -25% at equal or better SLO attainment). ``--json``
is written again after each row, through a temporary file renamed into place: a run stopped
midway leaves the rows printed so far there, as valid JSON.
"""

import argparse
import dataclasses
import json
from pathlib import Path

from benchmarks.policy_bench import ORDER, SHAREGPT_STARTS, variant_settings
from infra.hangup import exit_quietly_if_stdout_closes
from infra.paths import writable_report, write_atomically
from infra.sim.cli import with_settings
from infra.sim.requests import earliest_arrivals
from schemas.config import GovernorConfig
from schemas.errors import GovernorError

FLEET = "h100:2"
STEADY_S, BURST_SCALE = 60.0, 4.0
#: Added to the burst's prefix hashes: above every hash id the workload builder gives.
BURST_HASHES = 10**12


def _scaled(trace, scale: float, shift_s: float = 0.0, tag: str = "", hashes: int = 0) -> list:
    """``trace``'s task starts at ``scale`` times their rate, from ``shift_s`` on (a step keeps
    its offset from its task's first request); ``tag`` before each task id."""
    return [dataclasses.replace(
        r, arrival_s=round(arrival + shift_s, 6),
        task_id=f"{tag}{r.task_id}" if r.task_id else r.task_id,
        hash_ids=tuple(h + hashes for h in r.hash_ids))
        for r, arrival in zip(trace, earliest_arrivals(trace, scale))]


def steady_then_burst(workload: list, steady_scale: float) -> list:
    """The tasks starting in the first ``STEADY_S`` at ``steady_scale``, then the whole workload
    at ``BURST_SCALE`` from ``STEADY_S`` on."""
    steady = _scaled(workload, steady_scale, tag="steady-")
    starts = {r.task_id: r.arrival_s for r in steady if r.step == 1}
    steady = [r for r in steady if starts[r.task_id] < STEADY_S]
    burst = _scaled(workload, BURST_SCALE, STEADY_S, "burst-", BURST_HASHES)
    return sorted(steady + burst, key=lambda r: (r.arrival_s, r.task_id or "", r.step))


def scenarios(seed: int) -> dict[str, list]:
    from infra.workloads import build_workload

    workload = build_workload("sharegpt", duration_s=300.0, rate_scale=SHAREGPT_STARTS,
                              seed=seed)
    return {"high": _scaled(workload, BURST_SCALE), "base": _scaled(workload, 1.0),
            "steady 0.5x + burst": steady_then_burst(workload, 0.5),
            "steady 1x + burst": steady_then_burst(workload, 1.0)}


def run(trace: list, policy: str, variant: str, settings: list[str]) -> dict:
    from infra.sim import SimOptions, simulate

    config = with_settings(GovernorConfig.model_validate(variant_settings(variant, FLEET)),
                           settings)
    result, _ = simulate(trace, SimOptions(policy=policy, fleet=FLEET, rate_scale=1.0,
                                           config=config), "sharegpt")
    return result


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0,1,2, got {text!r}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError("seeds must be >= 0")
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_seeds, default="0,1,2",
                        help="workload seeds, comma-separated")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        help="KEY=VALUE: a governor setting (repeatable)")
    parser.add_argument("--json", type=Path,
                        help="write every run's sim --json report here, each as it ends")
    args = parser.parse_args()
    try:  # a bad setting or --json path stops the run before it starts
        with_settings(GovernorConfig(), args.settings)
        if args.json:
            writable_report("--json", args.json)
    except GovernorError as exc:
        parser.error(str(exc))
    with exit_quietly_if_stdout_closes():  # (``... | head``)
        print_table(args.seeds, args.settings, args.json)


def print_table(seeds: list[int], settings: list[str], json_out: Path | None) -> None:
    """Every run of each seed's scenarios, a row each as its scenario's runs end; the rows so
    far written to ``json_out`` after each."""
    reports = []
    print("| seed | scenario | run | tasks succeeded | SLO attainment | cost per successful task "
          "| against the cheapest baseline | GPUs used | requests shed (`load_shed`) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        for name, trace in scenarios(seed).items():
            runs = {p: run(trace, p, "fixed_fleet", []) for p in ORDER if p != "governor"}
            runs["governor"] = run(trace, "governor", "default", settings)
            runs["governor (fixed fleet)"] = run(trace, "governor", "fixed_fleet", settings)
            cheapest = min(r["cost_per_successful_task_usd"] for p, r in runs.items()
                           if not p.startswith("governor"))
            for label, r in runs.items():
                cost = r["cost_per_successful_task_usd"]
                print(f"| {seed} | {name} | {label} | {r['tasks_succeeded']} of {r['tasks']} "
                      f"| {r['slo_attainment']:.3f} | {cost:.3g} | {cost / cheapest - 1:+.1%} "
                      f"| {r['workers_used']} | {r['rejected_by_reason'].get('load_shed', 0)} |",
                      flush=True)
                reports.append({**r, "seed": seed, "scenario": name, "run": label})
                if json_out:  # each row as it comes: a run stopped midway keeps them
                    write_atomically(json_out, json.dumps(reports, indent=1) + "\n")


if __name__ == "__main__":
    main()
