"""Workload builders from the shared data: ServeGen multi-tenant arrivals and ShareGPT multi-step
workflows. Each returns ``TraceRequest``s sorted by arrival; ``infra.traces.write_governor_jsonl``
writes them as Governor JSONL for ``governor sim``, ``replay`` and ``demo``."""

from collections.abc import Callable
from pathlib import Path

from infra.traces import TraceError, TraceRequest, load_trace
from infra.workloads.servegen import TRACES_DIR_DEFAULT, servegen_workload
from infra.workloads.sharegpt import FILE as SHAREGPT, poisson_starts, sharegpt_workflows

__all__ = ["azure_starts", "build_workload", "default_traces_dir", "servegen_workload",
           "sharegpt_workflows"]

AZURE = Path("azure_llm_2023") / "AzureLLMInferenceTrace_conv.csv"


def default_traces_dir() -> Path:
    """``$GOVERNOR_DATA_DIR/traces``, else ``../shared/data/traces`` next to the repository."""
    from workers.sim.perf import default_data_dir

    return default_data_dir() / "traces"


def azure_starts(traces_dir: Path, duration_s: float, rate_scale: float = 1.0) -> list[float]:
    """The Azure conversation trace's arrival times, ``rate_scale`` times faster, within
    ``duration_s``."""
    out = []
    span = duration_s * rate_scale
    last = 0.0
    for r in load_trace(Path(traces_dir) / AZURE):
        if r.arrival_s >= span:
            return out
        out.append(r.arrival_s / rate_scale)
        last = r.arrival_s
    raise TraceError(f"the Azure conversation trace ends {last:,.0f} s in, so at --rate-scale "
                     f"{rate_scale:g} its task starts cover {last / rate_scale:,.0f} s, not the "
                     f"{duration_s:,.0f} s of --duration: shorten it or raise --rate-scale")


def build_workload(kind: str, *, traces_dir: Path | None = None, duration_s: float = 600.0,
                   rate_scale: float = 1.0, seed: int = 0, mean_rps: float | None = None,
                   model: str | None = None, arrivals: str | None = None,
                   start_s: float | None = None,
                   max_turns: int = 12, think_time_s: float = 3.0,
                   progress: Callable[[int], None] | None = None) -> list[TraceRequest]:
    """``kind``: ``servegen`` (``mean_rps`` total rate, ``model`` m-mid (default) or m-small,
    ``start_s`` into the 14 days) or ``sharegpt`` (task starts from ``arrivals``: ``azure``
    (default), ``servegen`` (``model`` and ``start_s`` as above) or ``poisson``; for ``poisson``
    and ``servegen``, ``mean_rps`` is the task start rate). An option given to a workload it
    does not apply to is refused (it would change nothing). ``progress``, where given, is
    called with the count of ServeGen requests built so far as they are (a day of them takes
    a minute)."""
    traces_dir = Path(traces_dir or default_traces_dir())
    _check_applies(kind, arrivals, model, start_s)
    arrivals, model = arrivals or "azure", model or "m-mid"
    if kind == "servegen":
        kwargs = {} if start_s is None else {"start_s": start_s}
        return servegen_workload(traces_dir / "servegen", model, duration_s=duration_s,
                                 mean_rps=mean_rps, rate_scale=rate_scale, seed=seed,
                                 progress=progress, **kwargs)
    if kind == "sharegpt":
        if arrivals == "azure" and mean_rps is not None:
            raise TraceError("--mean-rps sets the task start rate of poisson or servegen "
                             "arrivals; azure arrivals keep the trace's (scale them with "
                             "--rate-scale)")
        _check_sharegpt_data(traces_dir, arrivals)
        if arrivals == "azure":
            starts = azure_starts(traces_dir, duration_s, rate_scale)
        elif arrivals == "servegen":
            kwargs = {} if start_s is None else {"start_s": start_s}
            starts = [r.arrival_s for r in servegen_workload(
                traces_dir / "servegen", model, duration_s=duration_s, mean_rps=mean_rps or 1.0,
                rate_scale=rate_scale, seed=seed, **kwargs)]
        elif arrivals == "poisson":
            starts = poisson_starts((mean_rps or 1.0) * rate_scale, duration_s, seed)
        else:
            raise TraceError(f"unknown arrival process {arrivals!r}; choose azure, servegen or poisson")
        return sharegpt_workflows(traces_dir, starts, seed=seed, max_turns=max_turns,
                                  think_time_s=think_time_s)
    raise TraceError(f"unknown workload {kind!r}; choose servegen or sharegpt")


def _check_sharegpt_data(traces_dir: Path, arrivals: str) -> None:
    """Refuse a ``--data-dir`` without the files a ShareGPT workload is built from, naming the
    option and what it should hold: before 7 Dec the error named only the first file missed
    (``trace file not found: WRONG/azure_llm_2023/...``)."""
    needed = [SHAREGPT, *([AZURE] if arrivals == "azure" else [])]
    missing = [str(file) for file in needed if not (traces_dir / file).is_file()]
    if missing:
        raise TraceError(f"no ShareGPT data in {traces_dir} (no {' or '.join(missing)}): give "
                         f"--data-dir the traces folder that holds {' and '.join(map(str, needed))}"
                         f" ({TRACES_DIR_DEFAULT})")


def _check_applies(kind: str, arrivals: str | None, model: str | None,
                   start_s: float | None) -> None:
    """Refuse an option the workload would ignore: before 5 Dec ``servegen --arrivals poisson``
    or ``sharegpt --start-s 100`` wrote the same file as without it."""
    if kind == "servegen" and arrivals is not None:
        raise TraceError("--arrivals sets how sharegpt tasks start; a servegen workload's "
                         "arrivals are ServeGen's own")
    servegen_arrivals = kind == "servegen" or arrivals == "servegen"
    for option, value in (("--model", model), ("--start-s", start_s)):
        if kind == "sharegpt" and value is not None and not servegen_arrivals:
            raise TraceError(f"{option} applies to ServeGen arrivals only (servegen, or "
                             f"sharegpt --arrivals servegen), not to {arrivals or 'azure'} "
                             "arrivals")
