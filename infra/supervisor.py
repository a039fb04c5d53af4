"""The local actuator of the autoscaler: turns ``ScalePool`` commands into worker processes.

It follows ``governor.control`` and, for each pool whose desired size differs from what runs,
starts cold workers or sends SIGTERM to those behind an open breaker first, then the newest
ones (they drain and hand back what they cannot finish). Level-triggered: a repeated command
changes nothing. A pool of a model that is not built in runs the shape the configuration
declares (the setting ``models``; its workers read it when they start).
"""

import asyncio
import logging
import time

from infra.bus import reading
from infra.config_cli import current_config
from infra.stack import PoolSpec, Stack, worker_tp
from schemas.commands import ScalePool, SetBreakerState
from schemas.topics import TopicCatalog
from workers.sim import models

logger = logging.getLogger(__name__)


#: A command for a model this process does not know reads the configuration's declared models
#: again, at most this often.
REREAD_MODELS_S = 10.0


async def supervise(stack: Stack, bootstrap: str, catalog: TopicCatalog, stop: asyncio.Event,
                    on_change=lambda text: None) -> None:
    slots = catalog.spec(catalog.dispatch).partitions
    refused: set[str] = set()  # pools whose commands it cannot carry out (said once)
    breakers: dict[str, str] = {}  # each worker's breaker state, as last commanded
    read_models_at = -REREAD_MODELS_S
    async with reading(bootstrap, catalog, [catalog.control], "supervisor") as typed:
        while not stop.is_set():
            commands = [item.message for item in await typed.fetch(200)]
            unknown = any(isinstance(c, ScalePool) and not models.is_known(c.model)
                          for c in commands)
            if unknown and time.monotonic() - read_models_at >= REREAD_MODELS_S:
                read_models_at = time.monotonic()  # (a model declared since it last looked)
                models.configure_models((await current_config(bootstrap, catalog)).models)
            carry_out(commands, stack, slots, refused, on_change, breakers)


def carry_out(commands: list, stack: Stack, slots: int, refused: set[str],
              on_change=lambda text: None, breakers: dict[str, str] | None = None) -> None:
    """One fetch of the control topic: each pool's last ``ScalePool`` is its size (an earlier
    one in the same fetch is already out of date); one the stack cannot give is left, and said
    once (``refused``: the pools said so far). ``breakers``: each worker's breaker state, kept
    up to date from the ``SetBreakerState`` commands read (restated by the controllers every
    few seconds): a cut drains a worker behind an open breaker first."""
    breakers = {} if breakers is None else breakers
    latest: dict[str, ScalePool] = {}
    for command in commands:
        if isinstance(command, ScalePool):
            latest[command.pool] = command
        elif isinstance(command, SetBreakerState):
            breakers[command.worker_id] = command.state
    for command in latest.values():
        if len(stack.workers_of(command.pool)) == command.replicas:
            continue  # (restated, every 5 s: nothing to give, nor to refuse)
        why = _cannot(command, stack, slots)
        if why is not None:
            if command.pool not in refused:
                refused.add(command.pool)
                logger.warning("supervisor leaves %s as it is: %s", command.pool, why)
                on_change(f"{command.pool}: not scaled ({why})")
            continue
        pool = PoolSpec(command.gpu_type, max(command.replicas, 1), command.model,
                        worker_tp(command.gpu_type, command.model))
        change = stack.scale(pool, command.replicas,
                             {worker for worker, state in breakers.items() if state != "closed"})
        logger.info("scaled %s (%s)", change, command.reason)
        on_change(f"{change}: {command.reason}")


def _cannot(command: ScalePool, stack: Stack, slots: int) -> str | None:
    """Why the local stack cannot give a pool the size a command asks, if it cannot: a pool
    name that is not its GPU@model, a GPU type or model the engine does not know, or more
    workers in all than the dispatch topic has partitions (each worker serves one)."""
    from workers.sim.perf import PerfModel

    if command.pool != f"{command.gpu_type}@{command.model}":
        return f"its name is not {command.gpu_type}@{command.model}"
    if stack.vllm_urls:
        return ("its workers are vLLM servers (--vllm-url), which the local stack does not start "
                "or stop")
    try:
        PerfModel.load(command.gpu_type, command.model,
                       worker_tp(command.gpu_type, command.model))
    except ValueError as exc:  # (a model declared in the configuration too: no worker reads it)
        return (f"{exc} (a local stack's simulated workers run the built-in models and those "
                "the setting models declares)")
    # Slots held by running processes, draining ones included (a draining worker keeps its
    # slot until it exits), and by crashed workers to be started again, less this pool's
    # serving workers, which the command replaces.
    held = sum(1 for name in stack.processes if name.startswith("worker-")
               and (stack.running(name) or stack.reviving(name)))
    others = held - len(stack.workers_of(command.pool))
    if others + command.replicas > slots:
        return (f"{command.replicas} workers beside the {others} slots other workers hold (a "
                f"draining one until it exits) pass the {slots} a local stack has, one per "
                "partition of the dispatch topic")
    return None
