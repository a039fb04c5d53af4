"""Speed of the offline simulator, and a check that a change to it changed no result.

    python -m benchmarks.sim_speed [--set speed|check] [--policy P ...] [--save DIR] [--compare DIR]
    python -m benchmarks.sim_speed --profile governor      # cProfile of one speed run

``--set speed`` (the default): the whole Mooncake trace on 16 H100s with every policy (governor
with and without the autoscaler), as the speed section of ``governor bench`` runs it, one run at a
time, each in a fresh process. ``--set check`` adds smaller runs that exercise other paths of the
simulator: the Mooncake trace at 8x (rejections, resumption), the Azure trace on two H100s and
ShareGPT workflows at high load. Prints wall seconds, requests per wall second, where the wall
time goes, the CPU seconds of the run and the 1-minute load average (the machine may be shared).

``--save DIR`` writes each run's ``sim --json`` report to ``DIR``; ``--compare DIR`` checks each
report against the one saved there, field by field, all but the wall-time, speed and memory
fields: a speed-up must leave every simulated result byte-identical (same seed, same workload).
"""

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import sys
from pathlib import Path

from benchmarks.policy_bench import ORDER, Case, run_case

#: Fields that measure the run, not the simulation: they may differ between two equal runs.
MEASURED = frozenset({"wall_s", "requests_per_wall_s", "cpu_s", "requests_per_cpu_s",
                      "wall_s_router", "wall_s_engines", "wall_s_controllers", "peak_rss_mib",
                      "load_average"})

SPEED = [Case("mooncake", "speed", 1.0, p, "h100:16", 3600.0, "default") for p in ORDER] + [
    Case("mooncake", "speed", 1.0, "governor", "h100:16", 3600.0, "fixed_fleet")]
CHECK = SPEED + [
    Case(workload, load, scale, policy, fleet, window, config)
    for workload, load, scale, fleet, window in (("mooncake", "high", 8.0, "h100:16", 1200.0),
                                                 ("azure", "base", 3.0, "h100:2", 600.0),
                                                 ("sharegpt", "high", 4.0, "h100:2", 300.0))
    for policy, config in [(p, "default") for p in ORDER] + [("governor", "fixed_fleet")]]


def name(case: Case) -> str:
    return f"{case.workload}-{case.load}-{case.policy}-{case.config}"


def differences(before: dict, after: dict) -> list[str]:
    keys = sorted((set(before) | set(after)) - MEASURED)
    return [k for k in keys if json.dumps(before.get(k)) != json.dumps(after.get(k))]


def _timed(case: Case) -> dict:
    result = run_case(case)
    result["load_average"] = round(os.getloadavg()[0], 2)
    return result


def profile(case: Case, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    result = run_case(case)
    profiler.disable()
    print(f"{name(case)}: {result['wall_s']} s wall under cProfile")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("speed", "check"), default="speed")
    parser.add_argument("--policy", action="append", help="only these policies (repeatable)")
    parser.add_argument("--save", type=Path, help="write each report here")
    parser.add_argument("--compare", type=Path, help="check each report against those saved here")
    parser.add_argument("--profile", metavar="POLICY", help="cProfile the speed run of POLICY")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if args.compare is not None and not args.compare.is_dir():
        parser.error(f"--compare: no folder {args.compare} (write one with --save first)")
    if args.profile:
        profile(Case("mooncake", "speed", 1.0, args.profile, "h100:16", 3600.0, "fixed_fleet"
                     if args.profile == "governor" else "default"), args.top)
        return
    todo = [c for c in (CHECK if args.set == "check" else SPEED)
            if not args.policy or c.policy in args.policy]
    mismatched = []
    print("| run | requests | wall s | requests / wall s | CPU s | requests / CPU s | router s "
          "| engines s | controllers s | peak RSS MiB | load average | same result |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for case, r in zip(todo, pool.imap(_timed, todo)):
            same = ""
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{name(case)}.json").write_text(json.dumps(r) + "\n")
            if args.compare:
                saved = json.loads((args.compare / f"{name(case)}.json").read_text())
                diff = differences(saved, r)
                same = "yes" if not diff else "NO: " + ", ".join(diff)
                if diff:
                    mismatched.append(name(case))
            print(f"| {name(case)} | {r['requests']} | {r['wall_s']:.2f} | "
                  f"{r['requests_per_wall_s']:,} | {r.get('cpu_s', 0):.2f} | "
                  f"{r.get('requests_per_cpu_s') or 0:,} | {r['wall_s_router']:.2f} | "
                  f"{r['wall_s_engines']:.2f} | {r['wall_s_controllers']:.2f} | "
                  f"{r['peak_rss_mib']} | {r['load_average']} | {same} |", flush=True)
    if mismatched:
        sys.exit(f"results changed: {', '.join(mismatched)}")


if __name__ == "__main__":
    main()
