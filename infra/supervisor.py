"""The local actuator of the autoscaler: turns ``ScalePool`` commands into worker processes.

It follows ``governor.control`` and, for each pool whose desired size differs from what runs,
starts cold workers or sends SIGTERM to the newest ones (they drain and hand back what they
cannot finish). Level-triggered: a repeated command changes nothing.
"""

import asyncio
import logging

from infra.bus import reading
from infra.stack import PoolSpec, Stack
from schemas.commands import ScalePool
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


async def supervise(stack: Stack, bootstrap: str, catalog: TopicCatalog, stop: asyncio.Event,
                    on_change=lambda text: None) -> None:
    async with reading(bootstrap, catalog, [catalog.control], "supervisor") as typed:
        while not stop.is_set():
            for item in await typed.fetch(200):
                command = item.message
                if not isinstance(command, ScalePool):
                    continue
                pool = PoolSpec(command.gpu_type, max(command.replicas, 1), command.model)
                if len(stack.workers_of(pool.name)) != command.replicas:
                    change = stack.scale(pool, command.replicas)
                    logger.info("scaled %s (%s)", change, command.reason)
                    on_change(f"{change}: {command.reason}")
