"""``governor bench``: every routing policy on four workloads at two loads, in virtual time.

    governor bench [--out benchmarks/results] [--quick] [--jobs 2]
    python -m benchmarks.policy_bench [--quick]

Workloads (windows keep the whole run to a few minutes on two cores; ``--quick`` cuts them to a
smoke run): the Mooncake conversation trace, the Azure conversation trace, a ServeGen multi-tenant
mix and ShareGPT multi-step workflows (``infra/workloads``). Each is simulated at a base and a high
load (``--rate-scale``: the same requests, arrivals compressed) with every policy of
``controllers.router.policies`` on the same fleet. Each simulation runs in a fresh process, so its
``peak_rss_mib`` is its own. Writes ``REPORT.md``, ``results.json`` and PNG plots to ``--out``
(``benchmarks/bench_report.py``).
"""

import argparse
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from controllers.router.policies import POLICIES

#: The order of the tables and plots: baselines first.
ORDER = ("round_robin", "least_loaded", "kv_aware", "governor")
assert set(ORDER) == set(POLICIES)


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    fleet: str
    loads: tuple[tuple[str, float], ...]  # (label, rate scale)
    window_s: float  # seconds of arrivals (before rate scaling)
    quick_window_s: float


#: ShareGPT task starts: Azure's conversation arrivals at this rate (1,882 conversations in 300 s).
SHAREGPT_STARTS = 1.32

WORKLOADS = (
    Workload("mooncake", "Mooncake conversation trace (Kimi), prefix hash chains", "h100:16",
             (("base", 1.0), ("high", 8.0)), 1200.0, 300.0),
    Workload("azure", "Azure LLM conversation trace 2023", "h100:2",
             (("base", 3.0), ("high", 10.0)), 600.0, 120.0),
    Workload("servegen", "ServeGen m-mid multi-tenant mix (8 req/s, published burstiness)",
             "h100:1", (("base", 4.0), ("high", 12.0)), 300.0, 120.0),
    # (steps closed loop since 5 Dec: a conversation's turns wait for the answers, so the load
    # is the number of conversations at once; two H100s serve these at 1x, not at 4x)
    Workload("sharegpt", "ShareGPT workflows (conversation = task), Azure task starts at 1.32x",
             "h100:2", (("base", 1.0), ("high", 4.0)), 300.0, 120.0),
)


@dataclass(frozen=True)
class Case:
    workload: str
    load: str
    rate_scale: float
    policy: str
    fleet: str
    window_s: float
    config: str = "default"


@lru_cache(maxsize=4)
def build(workload: str, window_s: float) -> tuple:
    """The requests of a workload window (deterministic: seed 0)."""
    from infra.traces import load_trace
    from infra.workloads import build_workload, default_traces_dir

    traces = default_traces_dir()
    if workload == "mooncake":
        path = traces / "mooncake_fast25" / "conversation_trace.jsonl"
        return tuple(load_trace(path, max_duration_s=window_s))
    if workload == "azure":
        path = traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
        return tuple(load_trace(path, max_duration_s=window_s))
    if workload == "servegen":
        return tuple(build_workload("servegen", duration_s=window_s, mean_rps=8.0, seed=0))
    if workload == "sharegpt":
        return tuple(build_workload("sharegpt", duration_s=window_s, rate_scale=SHAREGPT_STARTS,
                                    seed=0))
    raise ValueError(workload)


#: Governor's configurations: the full stack, and a diagnostic without the autoscaler.
VARIANTS = {
    "default": "the full stack: placement, admission, breakers, shedding, retry budget and the "
               "autoscaler (enabled, at most the baselines' fleet size per pool)",
    "fixed_fleet": "the same without the autoscaler (the baselines' fixed fleet)",
    "steps_unknown": "the full stack, each request saying its own step as its task's number "
                     "of steps, as a chat's client that cannot know whether another turn "
                     "follows (`governor sim --steps-total unknown`; ShareGPT only, the "
                     "workload of tasks)",
}
#: The workloads a diagnostic configuration runs on (the others: every one).
VARIANT_WORKLOADS = {"steps_unknown": ("sharegpt",)}


def variant_settings(variant: str, fleet: str) -> dict:
    from infra.stack import parse_fleet

    if variant in ("default", "steps_unknown"):  # each pool at most its size, as `--autoscale`
        return {"autoscaler": {"enabled": True, "pools": {
            pool.name: {"max_replicas": pool.count} for pool in parse_fleet(fleet)}}}
    if variant == "fixed_fleet":
        return {}
    raise ValueError(f"unknown variant {variant!r}")


def run_case(case: Case) -> dict:
    from infra.sim import SimOptions, simulate
    from schemas.config import GovernorConfig

    trace = build(case.workload, case.window_s)
    config = GovernorConfig.model_validate(variant_settings(case.config, case.fleet))
    options = SimOptions(policy=case.policy, fleet=case.fleet, rate_scale=case.rate_scale,
                         config=config,
                         steps_total="unknown" if case.config == "steps_unknown" else "trace")
    result, _ = simulate(list(trace), options, case.workload)
    result.update(workload=case.workload, load=case.load, config=case.config,
                  window_s=case.window_s)
    return result


def cases(quick: bool) -> list[Case]:
    out = []
    for w in WORKLOADS:
        window = w.quick_window_s if quick else w.window_s
        for load, scale in w.loads:
            for policy in ORDER:
                out.append(Case(w.name, load, scale, policy, w.fleet, window))
            for variant in list(VARIANTS)[1:]:  # governor's diagnostic configurations
                if w.name in VARIANT_WORKLOADS.get(variant, (w.name,)):
                    out.append(Case(w.name, load, scale, "governor", w.fleet, window, variant))
    # Speed and memory: the whole Mooncake trace on 16 H100s, each run in a fresh process.
    for policy, variant in [(p, "default") for p in ORDER] + [("governor", "fixed_fleet")]:
        out.append(Case("mooncake", "speed", 1.0, policy, "h100:16", 300.0 if quick else 3600.0,
                        variant))
    return out


class BenchInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the bench after ``done`` of its ``total`` runs; its runs in
    flight were stopped with it, and no report was written."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"interrupted: {done} of {total} runs done; no report written")
        self.done, self.total = done, total


#: How often the bench, waiting for its runs' next result, looks whether a stop signal has come
#: (a signal's handler runs in its main thread, but does not end that wait).
STOP_CHECK_S = 0.1


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """The Ctrl-Cs and SIGTERMs that have come (one ignored is left so, as by a script that runs
    the bench in its background): the bench stops its runs at its next look. The handler only
    notes the signal: one that raised ``KeyboardInterrupt`` (before 7 Dec) raised it wherever the
    main thread was, often just after it took the lock of its process pool's results, which it
    then never released, and stopping the pool waited for ever on the thread that sets them. A
    run forked, whose own handlers are not yet set, ends at once, quietly."""
    bench = os.getpid()
    stops: list[int] = []

    def note(signum: int, frame: object) -> None:
        if os.getpid() != bench:
            os._exit(128 + signum)
        stops.append(signum)  # (no lock taken: the main thread may hold any)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield stops
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _runs_leave_signals_to_the_bench() -> None:
    """A run's process ignores Ctrl-C, which a terminal sends its whole process group, and
    leaves SIGTERM to its default (not the bench's handlers, which it inherits): the bench
    stops its runs itself, so that none is left running and no run's traceback is printed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_one(case: Case, sink) -> None:
    """One run, in its own process, its result sent to the bench."""
    _runs_leave_signals_to_the_bench()
    sink.send(run_case(case))


def _result_of(run, results) -> dict | None:
    """A run's result, once it has sent it or ended (None: it ended without one)."""
    try:
        return results.recv()
    except EOFError:
        return None
    finally:
        results.close()
        run.join()


def _results(batch: list[Case], width: int, stops: list[int]) -> Iterator[dict]:
    """Each run's result as it comes, ``width`` runs at a time in fresh processes (so each
    ``peak_rss_mib`` is its own), until every run of ``batch`` is done or a stop signal has
    come. The runs in flight then are killed (SIGKILL): a SIGTERM that reaches a process just
    forked, before Python has set itself up there, is lost, and a ``multiprocessing.Pool``'s
    ``terminate`` (used before 7 Dec) then waited for ever on that run."""
    ctx = multiprocessing.get_context("fork")
    todo, running = list(reversed(batch)), {}
    try:
        while (todo or running) and not stops:
            while todo and len(running) < width:
                results, sink = ctx.Pipe(duplex=False)
                run = ctx.Process(target=_run_one, args=(todo.pop(), sink), daemon=True)
                run.start()
                sink.close()
                running[results] = run
            for results in multiprocessing.connection.wait(list(running), STOP_CHECK_S):
                result = _result_of(running.pop(results), results)
                if result is not None:
                    yield result
                elif not stops:  # (its traceback printed by its process)
                    raise RuntimeError("a run of the bench failed: see its traceback above")
    finally:
        for run in running.values():
            run.kill()
            run.join()


def _run_cases(every: list[Case], jobs: int, console, results: list[dict],
               stops: list[int]) -> None:
    """Every case's result appended to ``results`` as it comes, with the load average then,
    until a stop signal comes."""
    todo = sorted((c for c in every if c.load != "speed"),
                  key=lambda c: (c.workload != "mooncake", -c.rate_scale))  # slow ones first
    # The speed runs go last and one at a time, so that they compete with none of ours.
    for batch, width in ((todo, jobs), ([c for c in every if c.load == "speed"], 1)):
        for result in _results(batch, width, stops):
            result["load_average"] = round(os.getloadavg()[0], 2)
            results.append(result)
            if console is not None:
                console.print(f"[dim]{len(results)}/{len(every)} {result['workload']} "
                              f"{result['load']} {result['policy']} ({result['config']}): "
                              f"{result['wall_s']:.1f}s[/]", soft_wrap=True)


def run_bench(out: Path, quick: bool = False, jobs: int = 2, console=None) -> Path:
    """Every case run, then the report written to ``out``; ``BenchInterrupted`` where Ctrl-C
    or SIGTERM stops it first (the default SIGTERM would end the bench alone, and leave its
    runs in flight to finish, each then printing a traceback as it found the bench gone)."""
    from benchmarks.bench_report import write_report

    every = cases(quick)
    started = time.perf_counter()
    results: list[dict] = []
    with _stop_signals() as stops:
        _run_cases(every, jobs, console, results, stops)
    if stops:  # (its runs in flight killed)
        raise BenchInterrupted(len(results), len(every))
    wall = time.perf_counter() - started
    for r in sorted((r for r in results if r["load"] == "speed"), key=lambda r: r["policy"]):
        line = (f"speed: {r['policy']} ({r['config']}) on {r['requests']} Mooncake requests, {r['fleet']}: "
                f"{r['wall_s']:.1f} s wall, {r['requests_per_wall_s']:,} requests/s, "
                f"peak RSS {r['peak_rss_mib']} MiB")
        print(line) if console is None else console.print(line, markup=False, soft_wrap=True)
    return write_report(Path(out), results, [asdict(w) for w in WORKLOADS], quick=quick,
                        bench_wall_s=wall, jobs=jobs, variants=VARIANTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    try:
        print(run_bench(args.out, args.quick, args.jobs))
    except BenchInterrupted as exc:
        print(exc)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
