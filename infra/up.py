"""``governor up``: the local stack with a live view of the fleet, until Ctrl-C (or SIGTERM). A
component that crashes, a worker too, is started again (``Stack.revive``); the autoscaler's
``ScalePool`` commands start and drain workers (``infra.supervisor``)."""

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console, ConsoleOptions
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from infra.bus import (ConfigTopicSplit, config_topic_split, create_topics, reading,
                       topic_partitions)
from infra.stack import WORKER_METRICS_OFFSET, Stack, parse_fleet
from infra.supervisor import supervise
from schemas.config import GovernorConfig
from schemas.errors import GovernorError
from schemas.events import TERMINAL_EVENT_TYPES, WorkerStatus
from schemas.topics import TopicCatalog
from streams.config_feed import ConfigFeed
from streams.settings import Taken

#: How often the components' logs are checked for rotation (``Stack.rotate_logs``).
LOG_CHECK_S = 10.0
#: A worker not heard from for longer than the ``worker_heartbeat_timeout_s`` in force (after
#: which the router moves its requests) is shown silent, not as its last status had it; until
#: the configuration topic is read, the default.
SILENT_S = GovernorConfig().worker_heartbeat_timeout_s


def _rows(workers: dict[str, WorkerStatus], stack: Stack, silent_s: float) -> list[list[str]]:
    """Each worker's cells (name, pool, state, running, waiting, completed, last seen), by
    slot: those heard from, and the worker processes running that have said nothing yet (a
    worker says nothing until its engine is up: a vLLM server may load for minutes)."""
    now = time.time() * 1000
    rows: list[tuple[int, list[str]]] = []
    for status in workers.values():
        age_s = (now - status.event_time_ms) / 1000
        state, running, waiting = status.state, str(status.running), str(status.waiting)
        if age_s > silent_s and state not in ("stopped", "crashed"):
            state, running, waiting = "silent", "-", "-"  # (killed, hung or cut off)
        rows.append((status.slot, [status.worker_id, status.pool, state, running, waiting,
                                   str(status.requests_completed), f"{age_s:.1f}s ago"]))
    heard = {status.slot for status in workers.values()}
    rows += [(slot, [f"worker-{slot}", pool, "not heard yet", "-", "-", "-", "-"])
             for slot, pool in stack.running_workers().items() if slot not in heard]
    return [cells for _, cells in sorted(rows, key=lambda row: row[0])]


def _table(workers: dict[str, WorkerStatus], finished: dict[str, int], stack: Stack,
           silent_s: float = SILENT_S, pools: bool = True) -> Table:
    """The workers' rows; ``pools``: with the pool column (``_FleetView`` leaves it out where
    it would be cut)."""
    table = Table(title=f"governor up: {stack.namespace} (Ctrl-C stops)")
    for column in ("worker", "pool", "state", "running", "waiting", "completed", "last seen"):
        table.add_column(column)
    if not pools:
        table.columns.pop(1)
    for cells in _rows(workers, stack, silent_s):
        table.add_row(*(cells if pools else cells[:1] + cells[2:]))
    table.caption = "terminal events: " + ", ".join(f"{k} {v}" for k, v in sorted(finished.items()))
    if stack.dead():
        table.caption += f"  [red]exited: {', '.join(stack.dead())}[/]"
    return table


class _FleetView:
    """``_table``, its pool column kept whole: where the table is wider than the console with
    it (a file or a pipe is 80 columns; a vLLM model name is long), rich cut the pool
    (``h100@llama-3…``); the table is drawn without the column then, each pool a line under it
    naming its workers."""

    def __init__(self, workers: dict[str, WorkerStatus], finished: dict[str, int], stack: Stack,
                 silent_s: float = SILENT_S) -> None:
        self.workers, self.finished, self.stack, self.silent_s = workers, finished, stack, silent_s
        # drawn now, as the fleet stands at this update (rich renders later, or, where the
        # output is no terminal, only at the end)
        self.table = _table(workers, finished, stack, silent_s)

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        table = self.table
        unbounded = options.update(width=1_000_000)  # (a measure is clamped to the width)
        if Measurement.get(console, unbounded, table).maximum <= options.max_width:
            yield table
            return
        yield _table(self.workers, self.finished, self.stack, self.silent_s, pools=False)
        by_pool: dict[str, list[str]] = {}
        for name, pool, *_ in _rows(self.workers, self.stack, self.silent_s):
            by_pool.setdefault(pool, []).append(name)
        for pool, names in by_pool.items():
            yield Text(f"{pool}: {', '.join(names)}")


@contextlib.contextmanager
def _live(view: _FleetView, console: Console) -> Iterator[Live]:
    """rich's ``Live`` of ``view``, its last draw ended by a newline where the output is no
    terminal: rich leaves it off there, and the line printed next (``stopped``) was glued to
    the table's last line."""
    try:
        with Live(view, console=console, refresh_per_second=2) as live:
            yield live
    finally:
        if not console.is_terminal:
            console.line()


async def run_up(bootstrap: str, namespace: str, fleet: str, log_dir: Path, data_dir: Path,
                 console: Console, metrics_port: int = 0,
                 router_args: tuple[str, ...] = (), vllm_urls: tuple[str, ...] = ()) -> None:
    """``data_dir``: the analytics sink's (``governor sql`` and ``report`` read it by default);
    ``metrics_port``: the first of the components' metrics ports (``Stack.metrics_ports``);
    ``vllm_urls``: the servers of the workers, one a slot (``Stack.vllm_urls``)."""
    catalog = TopicCatalog(namespace)
    await create_topics(bootstrap, catalog)
    split = config_topic_split(catalog, (await topic_partitions(bootstrap, catalog)).get(
        catalog.config), bootstrap)
    if split is not None:  # (before the stack starts: each of its components would refuse)
        raise ConfigTopicSplit(f"governor up: {split}")
    pools = parse_fleet(fleet)  # (with vllm_urls: a worker a server, in the fleet's order)
    stack = Stack(bootstrap, namespace, pools, log_dir, sink_data_dir=data_dir,
                  with_streams=True, metrics_port=metrics_port, router_args=router_args,
                  vllm_urls=vllm_urls, revives_workers=True, record="governor up")
    workers: dict[str, WorkerStatus] = {}
    finished: dict[str, int] = {}
    silent_s = SILENT_S

    def use(taken: Taken) -> None:  # the configuration in force, then each change to it
        nonlocal silent_s
        silent_s = taken.heartbeat_timeout_s

    async with reading(bootstrap, catalog, [catalog.telemetry], "governor-up") as typed:
        # The autoscaler's actuator (``governor config set autoscaler.enabled true``): its
        # ScalePool commands start and drain workers here, as in ``governor demo --autoscale``.
        stopping = asyncio.Event()
        supervisor = following = None
        try:  # (from the first component started: the components run in process groups of
            # their own, so nothing but ``stack.stop`` ends them, a SIGTERM at any point too)
            stack.start()
            console.print(f"stack up on {bootstrap}; produce requests to {catalog.requests}, "
                          f"logs in {log_dir}; analytics in {data_dir}: query them with "
                          f"`governor sql --data-dir {data_dir} --namespace {namespace} \"SHOW "
                          f"TABLES\"` or `governor report --data-dir {data_dir} --namespace "
                          f"{namespace}`", markup=False, soft_wrap=True)
            if metrics_port:
                ports = stack.metrics_ports(stack.slots)
                console.print("metrics: " + ", ".join(f"{name} :{port}"
                                                      for name, port in ports.items())
                              + f" (a worker the autoscaler adds on slot N: "
                              f":{metrics_port + WORKER_METRICS_OFFSET}+N)",
                              markup=False, soft_wrap=True)
            supervisor = asyncio.create_task(supervise(stack, bootstrap, catalog, stopping))
            supervisor.add_done_callback(
                lambda task: task.cancelled() or task.exception() is None
                or console.print(f"the supervisor failed: {task.exception()!r}; workers are no "
                                 "longer scaled", style="red", markup=False, soft_wrap=True))
            following = asyncio.create_task(
                ConfigFeed(use, name="governor-up").follow(bootstrap, catalog))
            rotate_at = time.monotonic() + LOG_CHECK_S
            with _live(_FleetView(workers, finished, stack, silent_s), console) as live:
                async for items in typed.batches(timeout_ms=500):
                    for item in items:
                        message = item.message
                        if isinstance(message, WorkerStatus):
                            workers[message.worker_id] = message
                        elif message.type in TERMINAL_EVENT_TYPES:
                            finished[message.type] = finished.get(message.type, 0) + 1
                    for name, status in stack.revive().items():
                        live.console.print(f"{name} exited (status {status}); started it again "
                                           f"(its log: {stack.log_dir / name}.log)",
                                           style="yellow", markup=False, soft_wrap=True)
                    if refused := stack.refused():  # bad input or setup: a restart cannot help
                        raise GovernorError("; ".join(
                            f"{name} stopped: {said} (its log: {stack.log_dir / name}.log)"
                            for name, said in refused.items()) + "; the stack is stopped")
                    if time.monotonic() >= rotate_at:  # (a few stat calls, every 10 s)
                        stack.rotate_logs()
                        rotate_at = time.monotonic() + LOG_CHECK_S
                    live.update(_FleetView(workers, finished, stack, silent_s))
        finally:
            stopping.set()
            if following is not None:
                following.cancel()
            try:
                await asyncio.gather(*(task for task in (supervisor, following) if task),
                                     return_exceptions=True)
            finally:
                # In a thread: a second Ctrl-C, asyncio's KeyboardInterrupt in the main thread,
                # does not cut it short (asyncio waits for the thread as it exits), leaving the
                # components not yet stopped running
                await asyncio.to_thread(stack.stop)
