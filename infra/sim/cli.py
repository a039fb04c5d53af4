"""``governor sim``, ``governor bench`` and ``governor workload build``: registered on the main
``governor`` app by ``register`` (see ``infra/cli.py``)."""

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infra.cli_numbers import number_option
from infra.paths import (not_the_data, not_the_trace, print_report, writable_dir,
                         writable_file, writable_report)
from infra.wording import counted
from schemas.errors import GovernorError, one_line

console = Console(stderr=True)
workload_app = typer.Typer(help="Workloads built from the shared data.", no_args_is_help=True)
PROGRESS_AFTER_S = 2.0  # wall seconds: a run shorter than this shows no progress
PROGRESS_EVERY_S = 10.0  # wall seconds between progress lines where stderr is no terminal
T = TypeVar("T")


class MaxTokens(str, Enum):
    """``--max-tokens`` (``SimOptions.max_tokens``)."""

    longest = "longest"
    answer = "answer"


class StepsTotal(str, Enum):
    """``--steps-total`` (``SimOptions.steps_total``)."""

    trace = "trace"
    unknown = "unknown"


class Deadlines(str, Enum):
    """``--deadlines`` of ``sim``, ``replay`` and ``demo`` (``SimOptions.deadlines``,
    ``infra.sim.slo``), ``rule`` by default in all three: a trace run with the same options
    gets the same targets offline and live."""

    rule = "rule"
    config = "config"
    none = "none"


#: What each ``--deadlines`` mode gives a request whose trace row states no TTFT target or
#: deadline (``--help`` of ``sim``, ``replay`` and ``demo``).
DEADLINES_HELP = (
    "rule: TTFT target slo.ttft_slo_s (2 s) + 0.1 s per 1k prompt tokens, deadline that target "
    "+ 0.1 s per output token; config: the same TTFT target, deadline slo.deadline_s (60 s) "
    "after arrival; none: neither is stated, as by a client that sends none: the router places "
    "it against slo.ttft_slo_s and never rejects it for its deadline, and it is judged by "
    "slo.ttft_slo_s and slo.deadline_s after arrival. sim, replay and demo take the same modes "
    "with the same default, rule.")


#: The trace of ``sim`` and ``replay``.
TraceArgument = Annotated[Path, typer.Argument(help="Azure CSV, Mooncake or Governor JSONL.")]
#: ``--limit`` and ``--rate-scale`` of ``sim``, ``replay`` and ``demo``: one cut and one scale of a
#: trace, so that a workload tuned in ``sim`` is replayed live as it was simulated.
Limit = Annotated[int | None, typer.Option(min=1, max=1_000_000_000,
                                           help="Only the first N requests.")]
RateScale = Annotated[float, number_option(
    min=1e-6, max=1e6, help="Arrivals this many times faster: the start of each task and every "
                            "request without a task id (a task's later step keeps its offset "
                            "from its task's start).")]


class _Progress:
    """A run's progress in virtual time (the trace's span, then the drain after it), shown once
    it has taken ``PROGRESS_AFTER_S``: a bar on a terminal, a line every ``PROGRESS_EVERY_S``
    elsewhere (a CI log)."""

    def __init__(self, policy: str, span_s: float) -> None:
        self.policy, self.span_s = policy, max(span_s, 1.0)
        self.started = self.printed = time.monotonic()
        self.bar: Progress | None = None

    def update(self, arrived: int, total: int, t: float) -> None:
        now = time.monotonic()
        if now - self.started < PROGRESS_AFTER_S:
            return
        what = f"{self.policy} t={t:,.0f}s, {arrived:,}/{total:,} requests arrived"
        if not console.is_terminal:
            if now - self.printed >= PROGRESS_EVERY_S:
                self.printed = now
                console.print(f"sim {what}", markup=False, highlight=False, soft_wrap=True)
            return
        if self.bar is None:
            self.bar = Progress(TextColumn("[bold]sim[/] {task.description}"), BarColumn(),
                                TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task(what, total=self.span_s)
            self.bar.start()
        self.bar.update(self.task, completed=min(t, self.span_s), description=what)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class RequestCount:
    """Called with how many requests ``command`` has ``what`` so far, it says so
    (``COMMAND N requests WHAT``) every ``PROGRESS_EVERY_S`` once ``PROGRESS_AFTER_S`` have
    gone since it was made: a count of work too long to wait for in silence."""

    def __init__(self, what: str, command: str) -> None:
        self.what, self.command = what, command
        self.started = self.shown = time.monotonic()

    def __call__(self, count: int) -> None:
        now = time.monotonic()
        if now - self.started >= PROGRESS_AFTER_S and now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            console.print(f"{self.command} {count:,} requests {self.what}", markup=False,
                          highlight=False, soft_wrap=True)


def rows_with_progress(what: str, items: Iterable[T], command: str = "sim") -> Iterator[T]:
    """``items``, saying how many have passed (``RequestCount``): a trace of millions of rows
    takes a minute to read and check before the run's own progress starts (``sim``, ``replay``
    and ``demo`` alike), and a workload as long to write (``workload build``)."""
    shown = RequestCount(what, command)
    for count, item in enumerate(items, start=1):
        if count % 4096 == 0:  # (the clock read less often than the rows)
            shown(count)
        yield item


def warn_of_cut_tasks(out: Console, coverage, cut: str) -> None:
    """A warning on ``out`` where the run's rows (``infra.sim.outcomes.TaskCoverage``) hold only
    some steps of a task: those lie outside the run's rows (cut off by ``cut``, the options that
    shorten the run, or by the file itself), and the task counts as not succeeded. ``sim``,
    ``replay`` and ``demo`` say it in the same words: it is the same cut."""
    tasks, lacking = coverage.cut()
    if tasks:
        has, they = ("has", "it counts") if tasks == 1 else ("have", "they count")
        out.print(f"warning: {counted(tasks, 'task')} {has} steps outside the run's rows "
                  f"({counted(lacking, 'step')}, cut off by {cut} or the file): {they} as not "
                  "succeeded", markup=False, soft_wrap=True)


#: The longest workload ``workload build`` writes: ServeGen's 14 days; and the longest run
#: ``sim``, ``replay`` and ``demo`` take (``check_span``).
MAX_WORKLOAD_S = 14 * 86_400.0


def check_span(items: Iterable, rate_scale: float, trace: Path | None, cut: str) -> float:
    """When the last of ``items`` (``TraceRequest``s of the trace file ``trace``, None: the
    built-in workload) arrives in a run at ``rate_scale`` (``infra.sim.requests.with_earliest``;
    streamed); a ``GovernorError`` naming ``cut``, the options that shorten it, where that is
    more than ``MAX_WORKLOAD_S``. ``sim``, ``replay`` and ``demo`` alike: idle virtual days still
    cost ``sim`` CPU seconds each, per worker, and a live run of years is a mistake, not a run."""
    from infra.sim.requests import with_earliest

    last, span_s = max(with_earliest(items, rate_scale), key=lambda due: due[1],
                       default=(None, 0.0))
    if span_s <= MAX_WORKLOAD_S:
        return span_s
    scaled = f" / --rate-scale {rate_scale:g}" if rate_scale != 1 else ""
    if last.task_id and span_s != last.arrival_s / rate_scale:
        scaled += ", its task's start only"  # (a task's later steps: their offsets unscaled)
    slowed = ", raise --rate-scale (under 1 it slows the trace down)" if rate_scale < 1 else ""
    given, check = _arrival_in_file(trace, last.arrival_s)
    raise GovernorError(
        f"{trace or 'the built-in workload'}: its last request arrives {span_s:,.0f} s into the "
        f"run ({given}{scaled}), past the {MAX_WORKLOAD_S:,.0f} s (14 days) a run covers; cut it "
        f"with {cut}{slowed}, or {check}")


#: What the field of a request's arrival holds, by trace format (``FILE_FIELDS`` names it).
_ARRIVAL_UNITS = {"governor": "seconds from the trace's start", "mooncake": "milliseconds",
                  "azure": "the date and time of each arrival"}


def _arrival_in_file(trace: Path | None, arrival_s: float) -> tuple[str, str]:
    """A request's arrival ``arrival_s`` (seconds after the trace's first) as the trace file
    ``trace`` writes it, by its own field's name (a Mooncake ``timestamp``, an Azure
    ``TIMESTAMP``), and what to check of that field."""
    from infra.traces import TraceError, detect_format
    from infra.traces.loaders import FILE_FIELDS

    try:
        fmt = detect_format(trace) if trace is not None else "governor"
    except TraceError:  # (gone since it was read)
        fmt = "governor"
    field = FILE_FIELDS[fmt].get("arrival_s", "arrival_s")
    given = (f"arrival_s {arrival_s:g}" if fmt == "governor"
             else f"its {field} {arrival_s:,g} s after the first's")
    return given, f"check that {field} is {_ARRIVAL_UNITS[fmt]}"


def no_request_in_window(trace: Path | None, duration: float, what: str = "") -> GovernorError:
    """The error of a trace (None: ``demo``'s built-in workload) with no request in the first
    ``duration`` seconds (``--duration`` of ``sim`` and ``demo``), saying when its first request
    arrives where that is later: a Governor JSONL trace's ``arrival_s`` counts from 0 as
    written, so one whose rows start an hour in has none in a shorter window, which said no
    more than that."""
    from infra.traces import load_trace

    first = next(iter(load_trace(trace, limit=1)), None) if trace is not None else None
    later = ""
    if first is not None and first.arrival_s >= duration:
        later = (f" (its first request arrives {first.arrival_s:,g} s in: a Governor JSONL "
                 "trace's arrival_s counts from 0, as written)")
    return GovernorError(f"{trace or 'the built-in workload'} has no request{what} in its first "
                         f"{duration:g} s{later}")


def _weights(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise GovernorError(f"bad --router-weight {item!r}: expected NAME=NUMBER, e.g. prefix=4")
    return out


#: The settings only the governor policy reads (its controllers: breakers, shedding, the
#: autoscaler; its router's scorer weights and task admission): a baseline runs without them.
GOVERNOR_ONLY_SETTINGS = frozenset({"breaker", "shedding", "autoscaler", "router_weights",
                                    "task_admission"})


def _config(weights: list[str], settings: list[str], autoscale: bool, fleet: str):
    """The configuration of a run: defaults, then ``--router-weight``, ``--autoscale`` and
    ``--set KEY=VALUE`` (a dotted setting as ``governor config set`` takes it, value as JSON)."""
    from controllers.router.candidates import configure_models
    from infra.stack import parse_fleet
    from schemas.config import GovernorConfig

    for item in weights:
        _check_scorers(f"bad --router-weight {item!r}", _weights([item]))
    try:
        config = GovernorConfig(router_weights=_weights(weights))
    except ValueError as exc:
        raise GovernorError(f"bad --router-weight: {one_line(exc)}") from None
    if autoscale:  # each pool at most its --fleet size
        config = config.with_setting("autoscaler.enabled", True)
        try:  # (a model --set declares: its GPUs a worker, for its pool's workers; the
            # other settings wait for the pools, which a setting may name a field of)
            configure_models(with_settings(config, [
                item for item in settings if item.partition("=")[0].split(".")[0] == "models"
            ]).models)
        except ValueError as exc:
            raise GovernorError(one_line(exc)) from None
        for pool in parse_fleet(fleet):
            config = config.with_setting(f"autoscaler.pools.{pool.name}", {"max_replicas": pool.count})
    config = with_settings(config, settings)
    if autoscale:  # (a --set of a pool's whole entry that names no cap keeps its --fleet one)
        for pool in parse_fleet(fleet):
            own = config.autoscaler.pools.get(pool.name)
            if own is None or own.max_replicas is None:
                config = config.with_setting(f"autoscaler.pools.{pool.name}", {
                    **(own.model_dump(exclude_none=True) if own else {}),
                    "max_replicas": pool.count})
    return config


def with_settings(config, settings: list[str]):
    """``config`` with each ``KEY=VALUE`` of ``settings`` set (the value read as JSON)."""
    from schemas.config import NoEntry

    for item in settings:
        key, sep, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        try:
            if not sep:
                raise ValueError("expected KEY=VALUE")
            config = config.with_setting(key, value)
        except NoEntry as exc:  # (added whole by a --set of the run, not `governor config set`)
            said = exc.saying(f"--set {exc.entry_key}='{exc.fields}'")
            raise GovernorError(f"bad --set {item!r}: {said}") from None
        except (KeyError, ValueError) as exc:
            raise GovernorError(f"bad --set {item!r}: {one_line(exc)}") from None
        _check_scorers(f"bad --set {item!r}", config.router_weights)
    return config


def _check_scorers(what: str, weights: dict[str, float]) -> None:
    """An error starting ``what`` unless the governor policy's router takes ``weights`` (the
    configuration's model checks their values, the router their scorers' names)."""
    from controllers.router.placement import Placer

    try:
        Placer(weights)
    except ValueError as exc:
        raise GovernorError(f"{what}: {exc}") from None


def sim(trace: TraceArgument,
        policy: Annotated[str, typer.Option(help="governor, round_robin, least_loaded or kv_aware.")] = "governor",
        fleet: Annotated[str, typer.Option(help="Pools as GPU:COUNT\\[/tpN]\\[@MODEL], comma-separated (COUNT is GPUs).")] = "h100:16",
        limit: Limit = None,
        duration: Annotated[float | None, number_option(min=1, max=MAX_WORKLOAD_S, help="Only requests arriving in the first S seconds of the trace (at least 1, as demo's).")] = None,
        seed: Annotated[int, typer.Option(min=0, help="Random seed (cold workers' heartbeat phases); same seed, same report.")] = 0,
        rate_scale: RateScale = 1.0,
        router_weight: Annotated[list[str] | None, typer.Option(help="NAME=VALUE: a governor scorer weight (repeatable).")] = None,
        autoscale: Annotated[bool, typer.Option(help="governor: run the autoscaler, each pool at most its --fleet size (--set autoscaler.pools.GPU@MODEL.max_replicas=N to change one).")] = False,
        set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE: any setting, e.g. breaker.itl_ratio=1000 (repeatable).")] = None,
        max_tokens: Annotated[MaxTokens, typer.Option(help="Each request's max_tokens: the longest answer among the requests simulated (the engines stop each answer at its own length), or its own answer's length (which tells the router every answer's length).")] = MaxTokens.longest,
        steps_total: Annotated[StepsTotal, typer.Option(help="What a task's requests say of its number of steps: the trace's steps_total, or unknown (each says its own step).")] = StepsTotal.trace,
        deadlines: Annotated[Deadlines, typer.Option(help="The TTFT target and deadline of a request whose trace states none, sent to the router and judged by. " + DEADLINES_HELP)] = Deadlines.rule,
        json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report here.")] = None,
        progress: Annotated[bool, typer.Option(help="A progress bar on long runs.")] = True):
    """Offline virtual-time simulation of a routing policy on a simulated fleet (no Kafka)."""
    from infra.replay import check_requests
    from infra.sim import SimOptions, Simulation, summarize
    from infra.sim.outcomes import TaskCoverage
    from infra.stack import unserved_warning
    from infra.traces import load_trace

    if json_out is not None:
        writable_report("--json", json_out)
        not_the_trace("--json", json_out, trace)
    with said_if_interrupted(f"interrupted while reading {trace}: nothing was simulated"):
        items = list(rows_with_progress("read", load_trace(trace, limit=limit,
                                                           max_duration_s=duration)))
        if not items:
            if duration is None:
                raise GovernorError(f"{trace} has no request to simulate")
            raise no_request_in_window(trace, duration, " to simulate")
        # every row a valid request, as replay and demo want them
        check_requests(rows_with_progress(f"checked of {len(items):,}", items), "sim", trace)
        span_s = check_span(items, rate_scale, trace, "--duration or --limit")
    if any(item.partition("=")[0] == "routing_policy" for item in set_ or []):
        raise GovernorError("choose the policy with --policy, not --set routing_policy")
    if deadlines is Deadlines.rule and any(item.partition("=")[0] == "slo.deadline_s"
                                           for item in set_ or []):
        console.print("warning: slo.deadline_s sets the deadlines with --deadlines config or "
                      "none only; this run gives each request its TTFT target + 0.1 s per "
                      "output token",
                      markup=False, soft_wrap=True)
    if policy != "governor" and (autoscale or router_weight):
        console.print(f"warning: --autoscale and --router-weight apply to the governor policy "
                      f"only; {policy} runs without them", markup=False, soft_wrap=True)
    unused = [key for item in set_ or [] if (key := item.partition("=")[0]).split(".")[0]
              in GOVERNOR_ONLY_SETTINGS]
    if policy != "governor" and unused:
        console.print(f"warning: --set {', '.join(unused)}: "
                      f"{'these settings apply' if len(unused) > 1 else 'this setting applies'} "
                      f"to the governor policy only (its controllers and admission); {policy} "
                      "runs without them", markup=False, soft_wrap=True)
    try:
        config = _config(router_weight or [], set_ or [], autoscale, fleet)
        options = SimOptions(policy=policy, fleet=fleet, seed=seed, rate_scale=rate_scale,
                             config=config, max_tokens=max_tokens.value,
                             steps_total=steps_total.value, deadlines=deadlines.value)
        simulation = Simulation(items, options)  # builds the fleet, its models and the router
    except ValueError as exc:  # a bad policy, fleet, model or weight
        hint = (" (declare another by its shape: --set 'models.NAME={...}')"
                if str(exc).startswith("unknown model") else "")
        raise GovernorError(one_line(exc) + hint) from None
    warning = unserved_warning(fleet, {pool.model for pool in simulation.fleet.pools},
                               [r.model for r in items])
    if warning:
        console.print(warning, markup=False, soft_wrap=True)
    warn_of_cut_tasks(console, TaskCoverage(items), "--duration, --limit")
    with _stop_on_signals() as stopped:
        if progress:
            shown = _Progress(policy, span_s)
            try:
                simulation.run(progress=shown.update, stop=stopped.is_set)
            finally:
                shown.close()
        else:
            simulation.run(stop=stopped.is_set)
    report = summarize(simulation, trace.name)
    print_report(json.dumps(report), json_out)
    if simulation.interrupted:  # (how many had ended, not `unfinished`: that counts those
        ended = report["requests"] - report["unfinished"]  # not arrived too, read as arrived)
        console.print(
            f"interrupted at {simulation.end_s:,.1f} s of simulated time: {report['arrived']:,} "
            f"of {report['requests']:,} requests had arrived and {ended:,} had ended; the "
            "report covers the run until then", markup=False, soft_wrap=True)
        raise typer.Exit(130)
    if report["unfinished"] or report["duplicate_terminal_states"]:
        console.print("[red]some requests did not reach exactly one terminal state[/]",
                      soft_wrap=True)
        raise typer.Exit(1)


@contextlib.contextmanager
def said_if_interrupted(said: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM in the block says ``said`` and exits 130 (as either does in a run): a
    trace of millions of rows takes a minute to read and check (a workload of millions as long
    to build), and a Ctrl-C then ended ``sim``, ``replay`` or ``workload build`` without a word,
    a SIGTERM (before 7 Dec) by its default action, without one either. A SIGTERM the process
    ignores stays ignored."""
    previous = signal.getsignal(signal.SIGTERM)
    taken = previous not in (signal.SIG_IGN, None)  # (None: a handler not set from Python)
    if taken:
        signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    except KeyboardInterrupt:
        console.print(said, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        if taken:
            signal.signal(signal.SIGTERM, previous)


def _as_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _StopRequest:
    """Whether a Ctrl-C or SIGTERM has asked the run to stop: a plain attribute, which the
    signal's handler sets without a lock (the handler runs between two of the main thread's
    bytecodes, inside another handler too: before 7 Dec it set a ``threading.Event``, whose
    lock a second SIGTERM's handler could wait for while the first held it, for ever)."""

    def __init__(self) -> None:
        self.requested = False

    def is_set(self) -> bool:
        return self.requested


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[_StopRequest]:
    """A stop request made by the first Ctrl-C or SIGTERM, which stops the run at its next
    tick with a report of what it simulated; a Ctrl-C after it stops the run at once, with
    none, and says so (exit 130): one given up on waiting for that tick. Before 7 Dec it
    exited 130 without a word, as if the report had been lost to an error."""
    stopped = _StopRequest()

    def stop(signum: int, frame: object) -> None:
        stopped.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}  # (ignored: left so, as by
    # a script that runs this in its background, for a Ctrl-C at its terminal not to stop it)
    try:
        yield stopped
    except KeyboardInterrupt:  # (SIGINT raises only once a first stop has come)
        console.print("interrupted again: stopped at once, with no report", markup=False,
                      soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def bench(out: Annotated[Path | None, typer.Option(help="Report folder; default: benchmarks/results (the committed report), with --quick out/bench-quick.")] = None,
          quick: Annotated[bool, typer.Option(help="Small windows of every workload (a smoke run).")] = False,
          jobs: Annotated[int, typer.Option(min=1, max=64, help="Simulations run in parallel.")] = 2):
    """Every policy on Mooncake, Azure, ServeGen and ShareGPT workloads at two loads: a report."""
    if out is None:  # (a smoke run does not overwrite the committed report)
        out = Path("out/bench-quick") if quick else Path("benchmarks/results")
    writable_dir("--out", out)  # (before the runs, not after them)
    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # benchmarks/ lives in the repository, not the package
    from benchmarks.policy_bench import BenchInterrupted, run_bench

    try:
        report = run_bench(out, quick=quick, jobs=jobs, console=console)
    except BenchInterrupted as exc:
        console.print(str(exc), markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    console.print(f"report: {report}", markup=False, soft_wrap=True)




@workload_app.command("build")
def workload_build(kind: Annotated[str, typer.Argument(help="servegen or sharegpt.")],
                   out: Annotated[Path, typer.Option(help="Governor JSONL file to write.")],
                   duration: Annotated[float, number_option(min=1, max=MAX_WORKLOAD_S, help="Seconds of arrivals (sharegpt: of task starts; a task's later steps follow after them) (at most ServeGen's 14 days).")] = 600.0,
                   rate_scale: Annotated[float, number_option(min=1e-6, max=1e6, help="Arrivals this many times faster (sharegpt: its task starts; servegen: after --mean-rps).")] = 1.0,
                   mean_rps: Annotated[float | None, number_option(min=1e-6, max=1e6, help="servegen: total rate; sharegpt with poisson or servegen arrivals: task start rate.")] = None,
                   model: Annotated[str | None, typer.Option(help="ServeGen model: m-mid (default) or m-small.")] = None,
                   arrivals: Annotated[str | None, typer.Option(help="sharegpt task starts: azure (default), servegen or poisson.")] = None,
                   start_s: Annotated[float | None, number_option(min=0, max=MAX_WORKLOAD_S, help="servegen: offset into its 14 days (default 129,600: day 2, 12:00).")] = None,
                   seed: Annotated[int, typer.Option(min=0, help="Random seed; same seed, same file.")] = 0,
                   data_dir: Annotated[Path | None, typer.Option(help="Traces folder; default ../shared/data/traces.")] = None):
    """Build a ServeGen multi-tenant or ShareGPT workflow workload as Governor JSONL."""
    from infra.traces import write_governor_jsonl
    from infra.workloads import build_workload, default_traces_dir

    not_the_data("--out", out, data_dir or default_traces_dir())
    writable_file("--out", out, renamed=True)  # (its folder made now), before it is built
    with said_if_interrupted(f"interrupted: nothing written to {out}"):  # (.tmp removed)
        items = build_workload(kind, traces_dir=data_dir, duration_s=duration,
                               rate_scale=rate_scale, seed=seed, mean_rps=mean_rps, model=model,
                               arrivals=arrivals, start_s=start_s,
                               progress=RequestCount("built", "workload build"))
        if not items:
            raise GovernorError(f"the {kind} workload has no request in {duration:g} s at "
                                f"these rates; nothing written to {out}")
        count = write_governor_jsonl(rows_with_progress("written", items, "workload build"),
                                     out)
    tasks = len({r.task_id or i for i, r in enumerate(items)})
    console.print(f"wrote {counted(count, 'request')} ({counted(tasks, 'task')}) to {out}",
                  markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(sim)
    app.command()(bench)
    app.add_typer(workload_app, name="workload")
