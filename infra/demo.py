"""``governor demo``: the whole stack on Kafka, a trace replayed through it, then a report.

Steps: make sure a broker answers (start the embedded one unless ``--bootstrap``), create a fresh
namespace of topics, start the router and a worker per GPU slot as processes, wait for every
worker's heartbeat, replay the workload, wait until every request reached a terminal state (or the
drain timeout passed), stop everything it started, and report the ``demo --json`` fields.
"""

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infra.bus import TypedConsumer, create_topics, delete_topics, make_producer
from infra.replay import replay
from infra.stack import Stack, parse_fleet
from infra.tally import RunTally
from infra.traces import TraceRequest, azure_like_workload, load_trace
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoOptions:
    bootstrap: str
    trace: Path | None = None
    duration_s: float = 30.0
    speedup: float = 1.0
    fleet: str = "h100:2,a100:2"
    drain_timeout_s: float = 120.0
    startup_timeout_s: float = 60.0
    engine: str = "sim"
    seed: int = 0
    log_dir: Path = Path(".governor/demo")
    keep_topics: bool = False


def workload(options: DemoOptions) -> list[TraceRequest]:
    """The requests that arrive within ``duration_s`` of trace time."""
    if options.trace is None:
        return azure_like_workload(duration_s=options.duration_s, seed=options.seed)
    return list(load_trace(options.trace, max_duration_s=options.duration_s))


async def run_demo(options: DemoOptions, console: Console) -> dict:
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    catalog = TopicCatalog(run_id)
    fleet = parse_fleet(options.fleet)
    items = workload(options)
    console.print(f"[bold]{run_id}[/]: {len(items)} requests over {options.duration_s:g}s "
                  f"of {'the built-in workload' if options.trace is None else options.trace}, "
                  f"fleet {options.fleet}, speedup {options.speedup:g}")
    await create_topics(options.bootstrap, catalog)
    tally = RunTally(prefix=run_id)
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch(options.bootstrap, catalog, tally, stop_watch))
    stack = Stack(options.bootstrap, run_id, fleet, options.log_dir / run_id, options.speedup,
                  options.engine)
    started = time.monotonic()
    try:
        stack.start()
        await _wait_for(lambda: len(tally.workers_seen) >= stack.slots, options.startup_timeout_s,
                        stack, f"{stack.slots} workers to report")
        console.print(f"{stack.slots} workers up; logs in {stack.log_dir}")
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                transient=False) as progress:
            sent_bar = progress.add_task("sent    ", total=len(items))
            done_bar = progress.add_task("finished", total=len(items))

            def update() -> None:
                progress.update(sent_bar, completed=len(tally.sent))
                progress.update(done_bar, completed=tally.finished)

            ticker = asyncio.create_task(_every(0.25, update))
            try:
                await replay(items, options.bootstrap, catalog, run_id=run_id,
                             speedup=options.speedup, on_sent=lambda r: tally.sent.add(r.request_id))
                await _wait_for(lambda: tally.finished >= len(tally.sent), options.drain_timeout_s,
                                stack, "every request to reach a terminal state", fail=False)
            finally:
                ticker.cancel()
                update()
    finally:
        exited = stack.dead()
        stack.stop()
        stop_watch.set()
        await watcher
        if not options.keep_topics:
            await delete_topics(options.bootstrap, catalog.topics())
    report = {"run_id": run_id, **tally.summary(),
              "duration_s": round(time.monotonic() - started, 2), "workers": stack.slots}
    if exited:
        report["components_exited"] = exited
    return report


async def _watch(bootstrap: str, catalog: TopicCatalog, tally: RunTally, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(catalog.telemetry, catalog.responses, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    producer = make_producer(bootstrap)
    await producer.start()
    await consumer.start()
    try:
        typed = TypedConsumer(consumer, catalog, producer, "demo-watch")
        batches = typed.batches(timeout_ms=100)
        while not stop.is_set():
            for item in await anext(batches):
                tally.observe(item.message)
    finally:
        await consumer.stop()
        await producer.stop()


async def _wait_for(condition, timeout_s: float, stack: Stack, what: str, fail: bool = True) -> bool:
    """Wait until ``condition()`` holds; raise (or return False) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if stack.dead() and fail:
            raise RuntimeError(f"{', '.join(stack.dead())} exited while waiting for {what}; "
                               f"see the logs in {stack.log_dir}")
        if time.monotonic() > deadline:
            if fail:
                raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
            return False
        await asyncio.sleep(0.1)  # polling a condition with a deadline
    return True


async def _every(interval_s: float, action) -> None:
    while True:
        action()
        await asyncio.sleep(interval_s)


def write_report(report: dict, path: Path | None) -> str:
    text = json.dumps(report, indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
