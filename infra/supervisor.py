"""The local actuator of the autoscaler: turns ``ScalePool`` commands into worker processes.

It follows ``governor.control`` and, for each pool whose desired size differs from what runs,
starts cold workers or sends SIGTERM to those behind an open breaker first, then the newest
ones (they drain and hand back what they cannot finish). Level-triggered: a repeated command
changes nothing. A pool of a model that is not built in runs the shape the configuration
declares (the setting ``models``; its workers read it when they start).
"""

import asyncio
import logging
from functools import partial

from infra.bus import reading
from infra.config_cli import current_config, declare_models
from infra.stack import PoolSpec, Stack, worker_tp
from schemas.codec import DecodeError
from schemas.commands import ScalePool, SetBreakerState
from schemas.limits import pool_name
from schemas.topics import TopicCatalog
from workers.sim import models

logger = logging.getLogger(__name__)


#: A command for a model this process does not know reads the configuration's declared models
#: again; for a model the last read did not find, at most this often (``models.DeclaredReads``).
REREAD_MODELS_S = 10.0
#: How long such a read may take: one that fails or takes longer leaves the model unknown.
READ_MODELS_S = 5.0


async def supervise(stack: Stack, bootstrap: str, catalog: TopicCatalog, stop: asyncio.Event,
                    on_change=lambda text: None) -> None:
    slots = catalog.spec(catalog.dispatch).partitions
    refused: dict[str, ScalePool] = {}  # each pool's command it last said it cannot carry out
    breakers: dict[str, str] = {}  # each worker's breaker state, as last commanded
    declared = models.DeclaredReads(REREAD_MODELS_S)
    async with reading(bootstrap, catalog, [catalog.control], "supervisor") as typed:
        while not stop.is_set():
            items = await typed.fetch(200)
            commands = [item.message for item in items]
            await declared.learn((c.model for c in commands if isinstance(c, ScalePool)),
                                 partial(_read_declared_models, bootstrap, catalog))
            said = carry_out(commands, stack, slots, refused, on_change, breakers)
            if said:  # dead-lettered, so that `governor report actions` says it did not hold
                record = {id(item.message): item.record for item in items}
                await typed.dead_letter([(record[id(command)], DecodeError(
                    "unprocessable", f"supervisor leaves {command.pool} as it is: {why}"))
                    for command, why in said])
            typed.take_dead_lettered()  # (it commits nothing)


async def _read_declared_models(bootstrap: str, catalog: TopicCatalog, unknown: set[str]) -> None:
    """A model declared since it last looked (read as the running components read it: a
    partition added is not read), for at most ``READ_MODELS_S``. A read that fails or takes
    longer (the broker away, a declaration this process refuses) is logged and leaves
    ``unknown`` unknown, the command refused as for an unknown model: before 7 Dec its error
    ended the supervision of ``governor up``'s fleet, and a broker that did not answer held it."""
    await declare_models(current_config(bootstrap, catalog, refuse=False), READ_MODELS_S,
                         unknown, "supervisor", logger)


def carry_out(commands: list, stack: Stack, slots: int, refused: dict[str, ScalePool],
              on_change=lambda text: None,
              breakers: dict[str, str] | None = None) -> list[tuple[ScalePool, str]]:
    """One fetch of the control topic: each pool's last ``ScalePool`` is its size (an earlier
    one in the same fetch is already out of date); one the stack cannot give is left, and said
    once while the pool's commands ask the same (``refused``: each pool's last said, until one
    is carried out; the autoscaler restates its sizes every 5 s). Returns those said, with
    why. ``breakers``: each worker's breaker state, kept up to date from the
    ``SetBreakerState`` commands read (restated by the controllers every few seconds): a cut
    drains a worker behind an open breaker first."""
    breakers = {} if breakers is None else breakers
    latest: dict[str, ScalePool] = {}
    for command in commands:
        if isinstance(command, ScalePool):
            latest[command.pool] = command
        elif isinstance(command, SetBreakerState):
            breakers[command.worker_id] = command.state
    said = []
    for command in latest.values():
        if len(stack.workers_of(command.pool)) == command.replicas:
            refused.pop(command.pool, None)
            continue  # (restated, every 5 s: nothing to give, nor to refuse)
        why = _cannot(command, stack, slots)
        if why is not None:
            if not _asks_the_same(refused.get(command.pool), command):
                refused[command.pool] = command
                logger.warning("supervisor leaves %s as it is: %s", command.pool, why)
                on_change(f"{command.pool}: not scaled ({why})")
                said.append((command, why))
            continue
        refused.pop(command.pool, None)
        pool = PoolSpec(command.gpu_type, max(command.replicas, 1), command.model,
                        _degree(command, stack))
        change = stack.scale(pool, command.replicas,
                             {worker for worker, state in breakers.items() if state != "closed"})
        logger.info("scaled %s (%s)", change, command.reason)
        on_change(f"{change}: {command.reason}")
    return said


def _asks_the_same(said: ScalePool | None, command: ScalePool) -> bool:
    return said is not None and (said.gpu_type, said.model, said.replicas) == (
        command.gpu_type, command.model, command.replicas)


def _degree(command: ScalePool, stack: Stack) -> int:
    """The GPUs a worker of the command's pool runs on: its ``--fleet`` pool's (``/tpN``, or
    the least that holds its model), that least for a pool not in ``--fleet``."""
    named = (pool.tp for pool in stack.fleet if pool.name == command.pool)
    return next(named, None) or worker_tp(command.gpu_type, command.model)


def _cannot(command: ScalePool, stack: Stack, slots: int) -> str | None:
    """Why the local stack cannot give a pool the size a command asks, if it cannot: a pool
    name that is not its GPU@model, a GPU type or model the engine does not know or knows in
    another letter case, or more workers in all than the dispatch topic has partitions (each
    worker serves one)."""
    from workers.sim.perf import PerfModel

    if command.pool != pool_name(command.gpu_type, command.model):
        return f"its name is not {pool_name(command.gpu_type, command.model)}"
    if stack.vllm_urls:
        return ("its workers are vLLM servers (--vllm-url), which the local stack does not start "
                "or stop")
    try:
        PerfModel.load(command.gpu_type, command.model, _degree(command, stack))
    except ValueError as exc:  # (a model declared in the configuration too: no worker reads it)
        return (f"{exc} (a local stack's simulated workers run the built-in models and those "
                "the setting models declares)")
    try:  # (looked up in any case: a worker would refuse the model, a pool be misnamed)
        models.check_spelling(command.model)
        models.check_gpu_spelling(command.gpu_type)
    except ValueError as exc:
        return str(exc)
    # Slots held by running processes, draining ones included (a draining worker keeps its
    # slot until it exits), and by crashed workers to be started again, less this pool's
    # serving workers, which the command replaces.
    held = sum(1 for name in stack.processes if name.startswith("worker-")
               and (stack.running(name) or stack.reviving(name)))
    others = held - len(stack.workers_of(command.pool))
    if others + command.replicas > slots:
        held_by = "1 slot another worker holds" if others == 1 else \
            f"{others} slots other workers hold"
        return (f"{command.replicas} worker{'s' if command.replicas != 1 else ''} beside the "
                f"{held_by} (a draining one until it exits) pass the {slots} a local stack "
                "has, one per partition of the dispatch topic")
    return None
