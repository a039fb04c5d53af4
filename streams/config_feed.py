"""The settings of the compacted ``governor.config`` topic that the streams use: the GPU prices
(``gpu_prices_usd_per_hour``: spend and attributed cost), the SLO of requests that state none
(``slo``) and how long a silent worker counts as live in the fleet view
(``worker_heartbeat_timeout_s``, as the router judges it). Read to its end before the Faust
worker starts, then followed while it runs: a price set with ``governor config set`` is charged
from the next heartbeat of each worker on.

Records apply as the controllers apply them (``controllers.live_config``; the router's own
checks are of settings the streams do not take). The streams send no ``ConfigApplied``: the
components that act on a setting answer for it. A record that cannot be decoded is
dead-lettered, as every reader of the topic does.
"""

import asyncio
import logging
from collections.abc import Callable

from aiokafka.errors import KafkaError

from controllers.live_config import LiveConfig
from infra.bus import Decoded, TypedConsumer, handle_each, now_ms, read_to_end, reading_config
from schemas.config import ConfigSet
from schemas.errors import one_line
from schemas.topics import TopicCatalog
from streams.settings import Taken

logger = logging.getLogger(__name__)

RETRY_S = 5.0


class ConfigFeed:
    def __init__(self, use: Callable[[Taken], None], in_force: Taken | None = None,
                 name: str = "streams", seen: Callable[[int], None] | None = None) -> None:
        """``in_force``: what the streams use already (default: the defaults); ``name``: the
        reader's, in its log lines (``governor up``'s view follows the heartbeat timeout too);
        ``seen``: told the topic's partition count (``ConfigPartition``)."""
        self.name = name
        self.seen = seen
        self.live = LiveConfig(name)
        self.use = use
        self.in_force = in_force if in_force is not None else self.taken
        self._reading = False  # (the history before the end: not used step by step)

    @property
    def taken(self) -> Taken:
        return Taken.of(self.live.config)

    def configured(self, item: Decoded) -> None:
        """One record of the configuration topic."""
        if not isinstance(item.message, ConfigSet):
            return
        verdict = self.live.apply(item.message, item.record.offset, now_ms(), item.record.key,
                                  written_ms=item.record.timestamp)
        if verdict.type == "config_rejected":
            logger.warning("%s: config %s rejected: %s", self.name, verdict.key, verdict.reason)
        elif not self._reading:
            self._use_if_changed(f"config {verdict.key}")

    def _use_if_changed(self, why: str) -> None:
        if self.taken != self.in_force:
            self.in_force = taken = self.taken
            logger.info("%s: GPU prices %s, SLO %s, heartbeat timeout %g s (%s)",
                        self.name, taken.prices_usd_per_hour, taken.slo.model_dump(),
                        taken.heartbeat_timeout_s, why)
            self.use(taken)

    async def read(self, typed: TypedConsumer) -> None:
        """Read the topic to its end as of now: the configuration in force, used once."""
        self._reading = True
        try:
            if not await read_to_end(typed, typed.catalog.config, self.configured):
                logger.warning("%s: the configuration topic was not read to its end in 30 s; "
                               "going on with what was read", self.name)
        finally:
            self._reading = False
        self._use_if_changed("the configuration topic")

    async def follow(self, bootstrap: str, catalog: TopicCatalog) -> None:
        """Read the topic's one partition from its start, then each record as it comes, until
        cancelled (a ``ConfigTopicSplit`` where the topic has more: ``ConfigPartition``). A
        broker error starts the reading again after ``RETRY_S`` (an error here would otherwise
        crash the Faust worker that runs this); a topic split since the first start is read
        then as by a running reader (``reading_config(running=True)``), not refused: the task
        would end, and the worker go on silently with no configuration followed."""
        running = False
        while True:
            try:
                async with reading_config(bootstrap, catalog, f"{self.name}-config",
                                          running=running, seen=self.seen) as (typed, partition):
                    running = True
                    await self.read(typed)
                    while True:
                        await handle_each(await typed.fetch(1000), self.configured)
                        partition.watch()
            except KafkaError as exc:
                logger.warning("%s: reading the configuration topic failed (%s); again in %g s",
                               self.name, one_line(exc), RETRY_S)
                await asyncio.sleep(RETRY_S)
