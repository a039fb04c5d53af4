"""A producer for the worker's pure tests: every send acknowledged at once, kept in ``sent``."""

import asyncio
from types import SimpleNamespace


class AckingProducer:
    client = SimpleNamespace(cluster=SimpleNamespace(partitions_for_topic=lambda topic: {0}))

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic, value, key=None, partition=None):
        self.sent.append((topic, value))
        ack = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack
