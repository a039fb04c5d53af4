"""The ``governor sim --json`` object: DESIGN.md's contract fields, then extras.

Contract: ``policy, trace, requests, completed, rejected, failed, slo_attainment, ttft_p50_s,
ttft_p99_s, e2e_p99_s, tasks, tasks_succeeded, cost_usd, cost_per_successful_task_usd, gpu_hours,
prefix_cache_hit_rate, wall_s``. ``gpu_hours`` and ``cost_usd`` count every GPU of a worker of
several (tensor parallelism).

Extras: ``unfinished`` and ``duplicate_terminal_states`` (both must be 0), ``succeeded`` (requests completed within their deadline),
reasons of rejections and failures, ``resumed`` continuations, ``breakers_opened`` (closed or
half-open to open), TTFT and end-to-end quantiles
(``ttft_cdf_s``: the 0th..100th percentiles over the ``first_tokens`` requests that got a
first token, for plots), the fleet's size over time
(``fleet_timeline``: ``[time_s, provisioned, serving]`` workers at every change), run settings,
speed
(``requests_per_wall_s``; ``cpu_s`` and ``requests_per_cpu_s``: the process's CPU time in the
run, steadier than wall time on a shared machine; ``wall_s_router``, ``wall_s_engines`` and
``wall_s_controllers``: the wall time inside ``RouterCore.route``/``resume``, the engines and the
controllers' ticks) and ``peak_rss_mib`` (the process's peak resident memory so far).
"""

import math
import resource
import sys

import numpy as np

from infra.sim.driver import Simulation
from infra.sim.outcomes import COMPLETED, FAILED, REJECTED


def _q(values: list[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if values else None


def _sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` decimals or ``digits`` significant figures, whichever keeps more:
    costs of a few micro-dollars a task keep the precision the benchmark's savings are
    computed from, and dollars and GPU-hours their decimals."""
    if not value:
        return 0.0
    return round(value, max(digits, digits - 1 - math.floor(math.log10(abs(value)))))


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def summarize(sim: Simulation, trace_name: str) -> dict:
    out, fleet, opts = sim.outcomes, sim.fleet, sim.options
    n = len(out)
    counts = out.counts()
    ttfts, e2es = out.ttfts(), out.e2es()
    succeeded = sum(out.succeeded(i) for i in range(n))
    met = sum(out.met_slo(i) for i in range(n))
    tasks, tasks_ok = out.tasks()
    cost = fleet.cost_usd(sim.end_s)
    queries, hits = fleet.cache_tokens()
    return {
        "policy": opts.policy,
        "trace": trace_name,
        # a run stopped early (Ctrl-C): what it covers, to its simulated_s
        **({"interrupted": True, "arrived": sim.arrivals.arrived} if sim.interrupted else {}),
        "requests": n,
        "completed": counts.get(COMPLETED, 0),
        "rejected": counts.get(REJECTED, 0),
        "failed": counts.get(FAILED, 0),
        "slo_attainment": round(met / n, 4) if n else None,
        "ttft_p50_s": _q(ttfts, 0.5),
        "ttft_p99_s": _q(ttfts, 0.99),
        "e2e_p99_s": _q(e2es, 0.99),
        "tasks": tasks,
        "tasks_succeeded": tasks_ok,
        "cost_usd": _sig(cost),
        "cost_per_successful_task_usd": _sig(cost / tasks_ok) if tasks_ok else None,
        "gpu_hours": _sig(fleet.gpu_hours(sim.end_s)),
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "wall_s": round(sim.wall_s, 3),
        # extras
        "unfinished": len(out.unfinished()),
        "duplicate_terminal_states": len(out.duplicates),
        "succeeded": succeeded,
        "rejected_by_reason": out.reasons(REJECTED),
        "failed_by_reason": out.reasons(FAILED),
        "resumed": sim.resumed,
        "breakers_opened": sim.breakers_opened,
        "first_tokens": len(ttfts),
        "ttft_mean_s": round(float(np.mean(ttfts)), 4) if ttfts else None,
        "ttft_p90_s": _q(ttfts, 0.9),
        "e2e_p50_s": _q(e2es, 0.5),
        "ttft_cdf_s": [round(float(v), 4) for v in np.quantile(ttfts, np.linspace(0, 1, 101))]
        if ttfts else [],
        "fleet": opts.fleet,
        "fleet_timeline": [list(p) for p in fleet.timeline],
        "workers_used": len(fleet.workers),
        "preemptions": sum(w.engine.preemptions for w in fleet.workers.values()),
        "seed": opts.seed,
        "rate_scale": opts.rate_scale,
        "max_tokens": opts.max_tokens,  # the clients' cap ("longest") or each answer's length
        "steps_total": opts.steps_total,  # what a task's requests say of its length
        "slo_rule": opts.slo_rule.describe(),
        "simulated_s": round(sim.end_s, 3),
        "requests_per_wall_s": round(n / sim.wall_s) if sim.wall_s > 0 else None,
        "cpu_s": round(sim.cpu_s, 3),
        "requests_per_cpu_s": round(n / sim.cpu_s) if sim.cpu_s > 0 else None,
        "wall_s_router": round(sim.wall_router_s, 3),
        "wall_s_engines": round(sim.wall_engines_s, 3),
        "wall_s_controllers": round(sim.wall_controllers_s, 3),
        "peak_rss_mib": peak_rss_mib(),
    }
