"""The local actuator of the autoscaler: turns ``ScalePool`` commands into worker processes.

It follows ``governor.control`` and, for each pool whose desired size differs from what runs,
starts cold workers or sends SIGTERM to the newest ones (they drain and hand back what they
cannot finish). Level-triggered: a repeated command changes nothing.
"""

import asyncio
import logging

from aiokafka import AIOKafkaConsumer

from infra.bus import TypedConsumer, make_producer
from infra.stack import PoolSpec, Stack
from schemas.commands import ScalePool
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


async def supervise(stack: Stack, bootstrap: str, catalog: TopicCatalog, stop: asyncio.Event,
                    on_change=lambda text: None) -> None:
    consumer = AIOKafkaConsumer(catalog.control, bootstrap_servers=bootstrap,
                                auto_offset_reset="latest")
    producer = make_producer(bootstrap)
    await producer.start()
    await consumer.start()
    try:
        typed = TypedConsumer(consumer, catalog, producer, "supervisor")
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
    finally:
        await consumer.stop()
        await producer.stop()
