"""``governor demo``: the whole stack on Kafka, a trace replayed through it, then a report.

Steps: make sure a broker answers (start the embedded one unless ``--bootstrap``), create a fresh
namespace of topics, start the router and a worker per GPU slot as processes, wait for every
worker's heartbeat, replay the workload, wait until every request reached a terminal state (or the
drain timeout passed), stop everything it started, and report the ``demo --json`` fields.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infra.bus import BusError, create_topics, delete_topics, reading
from infra.faults import Fault, inject_at
from infra.replay import replay
from infra.sim.cli import warn_of_cut_tasks
from infra.sim.outcomes import TaskCoverage
from infra.stack import Stack, parse_fleet
from infra.tally import RunTally
from infra.traces import TraceRequest, azure_like_workload, load_trace
from infra.wording import OF_TOTAL_COLUMN, counted, of_total
from schemas.errors import GovernorError
from schemas.events import SignalSnapshot
from schemas.topics import TopicCatalog
from streams.app import all_streams_topics
from streams.lag import SignalWatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoOptions:
    bootstrap: str
    trace: Path | None = None
    duration_s: float = 30.0
    speedup: float = 1.0
    #: the first ``limit`` requests only, sent ``rate_scale`` times faster, as ``governor sim``
    #: takes ``--limit`` and ``--rate-scale`` (``infra.replay``)
    limit: int | None = None
    rate_scale: float = 1.0
    fleet: str = "h100:2,a100:2"
    drain_timeout_s: float = 120.0
    startup_timeout_s: float = 60.0
    engine: str = "sim"
    seed: int = 0
    log_dir: Path = Path(".governor/demo")
    keep_topics: bool = False
    faults: tuple[Fault, ...] = ()
    autoscale: bool = False  # enable the autoscaler and let a supervisor start/stop workers
    analytics: bool = True  # run the analytics sink too and report analytics_rows
    analytics_timeout_s: float = 60.0
    #: a task's later step sent once the step before it ended (``infra.replay``), each step
    #: waited for at most ``drain_timeout_s`` once nothing else is left to send
    closed_loop: bool = False


def workload(options: DemoOptions) -> list[TraceRequest]:
    """The requests that arrive within ``duration_s`` of trace time, the first ``limit``."""
    return list(workload_rows(options))


def workload_rows(options: DemoOptions) -> Iterable[TraceRequest]:
    """``workload``, a trace's rows streamed from its file."""
    if options.trace is None:
        return azure_like_workload(duration_s=options.duration_s, seed=options.seed)[:options.limit]
    return load_trace(options.trace, limit=options.limit, max_duration_s=options.duration_s)


async def run_demo(options: DemoOptions, console: Console,
                   items: list[TraceRequest] | None = None,
                   stop: asyncio.Event | None = None) -> dict:
    """``items``: the workload, if the caller loaded it already (``workload(options)``).
    ``stop`` set (Ctrl-C) ends the run where it is: the stack is stopped as at the end, and the
    report says what happened until then, with ``interrupted: true``."""
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    catalog = TopicCatalog(run_id)
    fleet = parse_fleet(options.fleet)
    items = workload(options) if items is None else items
    last_s = max((item.arrival_s for item in items), default=0.0)  # (--limit may cut it short)
    of = "the built-in workload" if options.trace is None else str(options.trace)
    console.print(f"[bold]{run_id}[/]: {counted(len(items), 'request')} over "
                  f"{round(last_s, 1):g}s of {escape(of)}, fleet {escape(options.fleet)}, "
                  f"speedup {options.speedup:g}", soft_wrap=True)  # (a path's [...] is no tag)
    coverage = TaskCoverage(items)
    warn_of_cut_tasks(console, coverage, "--duration, --limit")
    await create_topics(options.bootstrap, catalog)
    scale_log: list[str] = []
    if options.autoscale:
        from infra.config_cli import set_setting

        await set_setting(options.bootstrap, catalog, "autoscaler.enabled", True)
    tally = RunTally(prefix=run_id)
    signals = SignalWatch()  # live signals (streams/): lag and cost per successful task
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch(options.bootstrap, catalog, tally, stop_watch, signals))
    analytics_dir = options.log_dir / run_id / "analytics"
    stack = Stack(options.bootstrap, run_id, fleet, options.log_dir / run_id, options.speedup,
                  options.engine, sink_data_dir=analytics_dir if options.analytics else None,
                  with_streams=True)
    analytics: dict = {}
    injected: dict[Fault, int] = {}
    started = time.monotonic()
    supervisor = None

    async def served() -> None:
        nonlocal analytics
        await _wait_for(lambda: len(tally.workers_seen) >= stack.slots, options.startup_timeout_s,
                        stack, f"{counted(stack.slots, 'worker')} to report")
        console.print(f"{counted(stack.slots, 'worker')} up; logs in {stack.log_dir}",
                      markup=False, soft_wrap=True)
        await _wait_for(lambda: bool(signals.fleet_total), options.startup_timeout_s, stack,
                        "the live signals to start", fail=False)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(OF_TOTAL_COLUMN),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            sent_bar = progress.add_task("sent    ", total=len(items))
            done_bar = progress.add_task("finished", total=len(items))

            def update() -> None:
                progress.update(sent_bar, completed=len(tally.sent))
                progress.update(done_bar, completed=tally.finished)

            ticker = asyncio.create_task(_every(0.25, update))
            plain = asyncio.create_task(_plain_progress(console, lambda: _progress_line(
                len(tally.sent), tally.finished, len(items))))
            loop_start = asyncio.get_running_loop().time()
            faults = [asyncio.create_task(inject_at(f, loop_start, stack, options.bootstrap,
                                                    catalog, injected)) for f in options.faults]
            try:
                await replay(items, options.bootstrap, catalog, run_id=run_id,
                             speedup=options.speedup, rate_scale=options.rate_scale,
                             on_sent=tally.record_sent,
                             closed_loop=options.closed_loop,
                             step_wait_s=options.drain_timeout_s)
                await _wait_for(lambda: tally.finished >= len(tally.sent), options.drain_timeout_s,
                                stack, "every request to reach a terminal state", fail=False)
                await _wait_for(lambda: tally.streams_unfinished == 0, 30, stack,
                                "every completed request's stream to end", fail=False)
                await _wait_for(lambda: _signals_caught_up(signals, tally), 30, stack,
                                "the live signals to include every request", fail=False)
            finally:
                ticker.cancel()
                plain.cancel()
                for task in faults:
                    task.cancel()
                for fault, outcome in zip(options.faults, await asyncio.gather(
                        *faults, return_exceptions=True)):
                    if isinstance(outcome, Exception):  # (it is in faults_not_injected)
                        logger.warning("fault %s was not injected: %s", fault, outcome)
                update()
        if options.analytics:
            analytics = await _analytics(options, catalog, stack, analytics_dir, console)

    interrupted = False
    try:
        stack.start()
        if options.autoscale:
            from infra.supervisor import supervise

            supervisor = asyncio.create_task(supervise(stack, options.bootstrap, catalog,
                                                       stop_watch, scale_log.append))
        interrupted = await _unless_stopped(served(), stop)
        if interrupted:
            console.print(f"interrupted after {time.monotonic() - started:.1f} s: stopping the "
                          "stack; the report covers the run until now", markup=False,
                          soft_wrap=True)
    finally:
        exited = stack.dead()
        stop_watch.set()
        try:
            if supervisor is not None:  # (its failure must not keep the stack running)
                failed, = await asyncio.gather(supervisor, return_exceptions=True)
                if isinstance(failed, Exception):
                    logger.error("the supervisor failed: %r", failed)
                    scale_log.append(f"supervisor failed: {failed!r}")
        finally:
            stack.stop()
        await asyncio.gather(watcher, return_exceptions=True)
        if not options.keep_topics:
            try:
                await delete_topics(options.bootstrap, [*catalog.topics(),
                                                        *all_streams_topics(run_id)])
            except BusError as exc:  # (the run's report stands: its topics are only left)
                console.print(f"warning: the run's topics were not all deleted: {exc}",
                              markup=False, soft_wrap=True)
    tasks_cut, steps_cut = coverage.cut()  # tasks the rows hold only some steps of
    report = {"run_id": run_id, **tally.summary(), **signals.report(),
              **_fault_report(options.faults, injected, tally),
              "duration_s": round(time.monotonic() - started, 2), "workers": stack.slots,
              "tasks_cut_short": tasks_cut, "steps_cut_short": steps_cut, **analytics}
    if options.autoscale:
        report["scale_actions"] = scale_log
    if exited:
        report["components_exited"] = exited
    if interrupted:
        report["interrupted"] = True
    elif options.closed_loop:  # steps whose step before did not end within --drain-timeout
        report["steps_not_sent"] = len(items) - len(tally.sent)
    return report


async def _unless_stopped(work, stop: asyncio.Event | None) -> bool:
    """Await ``work``; True if ``stop`` was set first, in which case ``work`` is cancelled."""
    task = asyncio.ensure_future(work)
    waiting = asyncio.ensure_future(stop.wait() if stop is not None else asyncio.Future())
    try:
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # (the caller cancelled: so is the work)
        task.cancel()
        raise
    finally:
        waiting.cancel()
    if task.done():
        task.result()  # (its failure, as it is)
        return False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return True


def _fault_report(faults: tuple[Fault, ...], injected: dict[Fault, int], tally: RunTally) -> dict:
    """``breaker_opened_after_s``: from the first injected slowdown (or stall) to its worker's
    breaker opening after it (None where it did not: open since before, it is left out)."""
    if not faults:
        return {}
    out: dict = {"faults_injected": [str(f) for f in faults if f in injected],
                 "faults_not_injected": [str(f) for f in faults if f not in injected]}
    for fault in faults:
        if fault.kind in ("slow", "stall") and fault in injected:
            opened = next((at_ms for at_ms in tally.breaker_opened_ms.get(fault.worker_id, ())
                           if at_ms >= injected[fault]), None)
            out["breaker_opened_after_s"] = (
                None if opened is None else round((opened - injected[fault]) / 1000, 3))
            break
    return out


async def _analytics(options: DemoOptions, catalog: TopicCatalog, stack: Stack, data_dir: Path,
                     console: Console) -> dict:
    """The analytics figures once the sink holds every record; a failing sink is only reported."""
    from analytics.progress import demo_summary

    summary = await demo_summary(options.bootstrap, catalog, data_dir,
                                 lambda: stack.running("sink"), options.analytics_timeout_s)
    if summary["analytics_rows"] is None:
        console.print(f"analytics: {summary['analytics_error']} (see {stack.log_dir})",
                      style="yellow", markup=False, soft_wrap=True)
    else:  # one line, as written, whatever the width: a command to copy
        console.print(f"analytics: {summary['analytics_rows']} rows; query them with `governor sql "
                      f"--data-dir {data_dir} --namespace {catalog.namespace} \"SHOW TABLES\"`",
                      markup=False, soft_wrap=True)
    return summary


def _signals_caught_up(signals: SignalWatch, tally: RunTally) -> bool:
    """Every lifecycle event seen is in a published snapshot, every terminal one counted."""
    total = signals.fleet_total
    terminal = sum(total.get(k, 0) for k in ("completed", "failed", "rejected", "cancelled"))
    return signals.unmatched == 0 and terminal >= tally.finished


async def _watch(bootstrap: str, catalog: TopicCatalog, tally: RunTally, stop: asyncio.Event,
                 signals: SignalWatch) -> None:
    topics = [catalog.telemetry, catalog.responses, catalog.control, catalog.signals]
    async with reading(bootstrap, catalog, topics, "demo-watch", offset_reset="earliest") as typed:
        batches = typed.batches(timeout_ms=100)
        while not stop.is_set():
            for item in await anext(batches):
                if isinstance(item.message, SignalSnapshot):
                    signals.note_snapshot(item.message, int(time.time() * 1000))
                    continue
                tally.observe(item.message)
                if item.record.topic == catalog.telemetry:
                    signals.note_event(item.message)


async def _wait_for(condition, timeout_s: float, stack: Stack, what: str, fail: bool = True) -> bool:
    """Wait until ``condition()`` holds; after ``timeout_s``, return False, or with ``fail``
    raise a ``GovernorError`` naming the logs (also at once when a component exits)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if stack.dead() and fail:
            raise GovernorError(f"the stack did not start: {', '.join(stack.dead())} exited while "
                                f"waiting for {what}; see the logs in {stack.log_dir}")
        if time.monotonic() > deadline:
            if fail:
                raise GovernorError(f"the stack did not start: timed out after {timeout_s:g}s "
                                    f"waiting for {what}; see the logs in {stack.log_dir}")
            return False
        await asyncio.sleep(0.1)  # polling a condition with a deadline
    return True


async def _every(interval_s: float, action) -> None:
    while True:
        action()
        await asyncio.sleep(interval_s)


def _progress_line(sent: int, finished: int, total: int) -> str:
    """``_plain_progress``'s line, its counts written as the demo's other lines write them."""
    return f"sent {of_total(sent, total)}, finished {of_total(finished, total)}"


async def _plain_progress(console: Console, line, every_s: float = 5.0) -> None:
    """``line()`` every ``every_s`` until cancelled where the console is no terminal: a CI log
    shows rich's bars only at the end (as ``governor replay`` does)."""
    if console.is_terminal:
        return
    while True:
        await asyncio.sleep(every_s)
        console.print(line(), markup=False, soft_wrap=True)
