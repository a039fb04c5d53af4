"""The slow controllers the simulator ticks, behind one small interface.

A controller sees the messages the live one would consume (worker heartbeats, request outcomes)
through ``observe`` and returns commands from ``tick``; the simulator feeds the commands to the
``RouterCore`` (breaker states, load-shed level, routing weights, admission limits) and to the
virtual fleet (``ScalePool``), exactly as ``governor.control`` carries them live.

``ServiceControllers`` drives ``controllers.service.ControllersService``'s own ``observe`` and
``tick`` (circuit breakers, load shedding, routing weights and, when ``autoscaler.enabled``, the
autoscaler), so the simulated controllers are the live ones. Not simulated: the Faust signal
streams, so the routing-weights controller sees no pool signals (every pool keeps weight 1). To
add a controller, write a class with ``observe`` and ``tick`` and list it in
``governor_controllers``.
"""

from typing import Protocol

from schemas.base import Message
from schemas.config import GovernorConfig


class Tickable(Protocol):
    def observe(self, message: Message, now_ms: int) -> None:
        """A heartbeat, a lifecycle event or a command the controller would consume live."""

    def tick(self, now_ms: int) -> list[Message]:
        """The commands of this tick (level-triggered: the whole desired state when it restates)."""


class ServiceControllers:
    """The live controllers process's pure part (its ``observe`` and ``tick``)."""

    def __init__(self, config: GovernorConfig, restate_s: float = 5.0,
                 pool_gpus: dict[str, int] | None = None) -> None:
        from controllers.service import ControllersService
        from schemas.topics import TopicCatalog

        self.service = ControllersService("offline-simulator", TopicCatalog("sim"), config=config,
                                          pool_gpus=pool_gpus)
        self.restate_s = restate_s
        self._next_restate_ms = 0

    def observe(self, message: Message, now_ms: int) -> None:
        self.service.observe(message, now_ms)

    def tick(self, now_ms: int) -> list[Message]:
        restate = now_ms >= self._next_restate_ms
        if restate:
            self._next_restate_ms = now_ms + int(self.restate_s * 1000)
        return self.service.tick(now_ms, restate)


def governor_controllers(config: GovernorConfig,
                         pool_gpus: dict[str, int] | None = None) -> list[Tickable]:
    """The controllers of the ``governor`` policy; the baselines run none (a fixed fleet, no
    breakers, no shedding, as their authors document them). ``pool_gpus``: GPUs a worker of
    each pool of the simulated fleet (``Autoscaler.degrees``)."""
    return [ServiceControllers(config, pool_gpus=pool_gpus)]
