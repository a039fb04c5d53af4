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


def ttft_cdf(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, name in zip(axes[0], workloads):
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
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of all requests with a first token")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "ttft_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cost_vs_load(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, name in zip(axes[0], workloads):
        for policy, config, label, style in _lines(results):
            pts = sorted((r["rate_scale"], r["cost_per_successful_task_usd"])
                         for r in results if r["workload"] == name and r["load"] != "speed"
                         and r["policy"] == policy and r["config"] == config
                         and r["cost_per_successful_task_usd"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, **style)
        ax.set_title(name)
        ax.set_xlabel("load (rate scale)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("USD per successful task")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "cost_per_successful_task_vs_load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fleet_size(out: Path, results: list[dict], workloads: list[str]) -> Path:
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.2), squeeze=False)
    for ax, name in zip(axes[0], workloads):
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
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GPUs")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / "fleet_size_over_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(out: Path, results: list[dict], workloads: list[str]) -> list[Path]:
    return [ttft_cdf(out, results, workloads), cost_vs_load(out, results, workloads),
            fleet_size(out, results, workloads)]
