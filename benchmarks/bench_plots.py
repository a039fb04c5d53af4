"""PNG plots of the policy benchmark: TTFT CDFs, cost per successful task against load (each
policy, plus governor's fixed-fleet diagnostic dashed), and the fleet's size over time under
governor's autoscaler."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ("round_robin", "least_loaded", "kv_aware", "governor")


DIAGNOSTIC = "fixed_fleet"  # drawn dashed next to the full stack


def _default(results: list[dict]) -> list[dict]:
    return [r for r in results if r["config"] == "default" and r["load"] != "speed"]


def _lines(results: list[dict]) -> list[tuple[str, str, str, dict]]:
    """(policy, config, label, style) of every line the comparison plots draw."""
    out = [(p, "default", p, {}) for p in ORDER]
    if any(r["config"] == DIAGNOSTIC for r in results):
        out.append(("governor", DIAGNOSTIC, "governor (fixed fleet)",
                    {"linestyle": "--", "color": "tab:red", "alpha": 0.6}))
    return out


def _panels(workloads: list[str], height: float):
    """One figure, a panel per workload side by side: (figure, [(axes, workload), ...])."""
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), height),
                             squeeze=False)
    return fig, list(zip(axes[0], workloads))


def _save(fig, panels, ylabel: str, legend_size: int, path: Path) -> Path:
    """Grid, the shared y label and legend, then the PNG."""
    for ax, _ in panels:
        ax.grid(alpha=0.3)
    panels[0][0].set_ylabel(ylabel)
    panels[-1][0].legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_cdf(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, panels = _panels(workloads, 3.6)
    for ax, name in panels:
        for policy, config, label, style in _lines(results):
            for r in results:
                if (r["workload"], r["load"], r["policy"], r["config"]) != (name, "high", policy, config) \
                        or not r["ttft_cdf_s"]:
                    continue
                # a share of *all* requests: rejected and failed ones never get a first token
                served = r["first_tokens"] / r["requests"]
                qs = [served * i / 100 for i in range(len(r["ttft_cdf_s"]))]
                ax.plot([max(v, 1e-3) for v in r["ttft_cdf_s"]], qs, label=label, **style)
        ax.set_xscale("log")
        ax.set_title(f"{name}, high load")
        ax.set_xlabel("TTFT (s)")
    return _save(fig, panels, "share of all requests with a first token", 8,
                 out / "ttft_cdf.png")


def cost_vs_load(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, panels = _panels(workloads, 3.6)
    for ax, name in panels:
        for policy, config, label, style in _lines(results):
            pts = sorted((r["rate_scale"], r["cost_per_successful_task_usd"])
                         for r in results if r["workload"] == name and r["load"] != "speed"
                         and r["policy"] == policy and r["config"] == config
                         and r["cost_per_successful_task_usd"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, **style)
        ax.set_title(name)
        ax.set_xlabel("load (rate scale)")
    return _save(fig, panels, "USD per successful task", 8,
                 out / "cost_per_successful_task_vs_load.png")


def fleet_size(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, panels = _panels(workloads, 3.2)
    for ax, name in panels:
        for r in _default(results):
            if r["workload"] == name and r["policy"] == "governor":
                t = [p[0] for p in r["fleet_timeline"]]
                ax.step(t, [p[1] for p in r["fleet_timeline"]], where="post",
                        label=f"{r['load']}: provisioned")
                ax.step(t, [p[2] for p in r["fleet_timeline"]], where="post", linestyle="--",
                        label=f"{r['load']}: serving")
        ax.set_title(f"{name}: governor's fleet")
        ax.set_xlabel("virtual time (s)")
        ax.set_ylim(bottom=0)
    return _save(fig, panels, "GPUs", 7, out / "fleet_size_over_time.png")


def plot_all(out: Path, results: list[dict], workloads: list[str]) -> list[Path]:
    return [ttft_cdf(out, results, workloads), cost_vs_load(out, results, workloads),
            fleet_size(out, results, workloads)]
