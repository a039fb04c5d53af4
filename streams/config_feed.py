"""The settings of the compacted ``governor.config`` topic that the streams use: the GPU prices
(``gpu_prices_usd_per_hour``: spend and attributed cost) and the SLO of requests that state none
(``slo``). Read to its end before the Faust worker starts, then followed while it runs, so a
price set with ``governor config set`` is charged from the next heartbeat of each worker on.

Records apply as the router and the controllers apply them (``controllers.live_config``). The
streams send no ``ConfigApplied``: the components that act on a setting answer for it. A record
that cannot be decoded is dead-lettered, as every reader of the topic does.
"""

import logging
from collections.abc import Callable

from controllers.live_config import LiveConfig
from infra.bus import Decoded, TypedConsumer, now_ms, read_to_end, reading
from schemas.config import ConfigSet, SloConfig
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)

#: What the streams take from a configuration: GPU prices and the SLO.
Use = Callable[[dict[str, float], SloConfig], None]


class ConfigFeed:
    def __init__(self, use: Use, in_force: tuple[dict[str, float], SloConfig] | None = None) -> None:
        """``in_force``: the prices and SLO the streams use already (default: the defaults)."""
        self.live = LiveConfig("streams")
        self.use = use
        self.in_force = in_force if in_force is not None else (self.prices, self.slo)
        self._reading = False  # (the history before the end: not used step by step)

    @property
    def prices(self) -> dict[str, float]:
        return dict(self.live.config.gpu_prices_usd_per_hour)

    @property
    def slo(self) -> SloConfig:
        return self.live.config.slo

    def configured(self, item: Decoded) -> None:
        """One record of the configuration topic."""
        if not isinstance(item.message, ConfigSet):
            return
        verdict = self.live.apply(item.message, item.record.offset, now_ms())
        if verdict.type == "config_rejected":
            logger.warning("streams: config %s rejected: %s", verdict.key, verdict.reason)
        elif not self._reading:
            self._use_if_changed(f"config {verdict.key}")

    def _use_if_changed(self, why: str) -> None:
        if (self.prices, self.slo) != self.in_force:
            self.in_force = (self.prices, self.slo)
            logger.info("streams: GPU prices %s, SLO %s (%s)", self.prices, self.slo.model_dump(),
                        why)
            self.use(*self.in_force)

    async def read(self, typed: TypedConsumer) -> None:
        """Read the topic to its end as of now: the configuration in force, used once."""
        self._reading = True
        try:
            if not await read_to_end(typed, typed.catalog.config, self.configured):
                logger.warning("streams: the configuration topic was not read to its end in "
                               "30 s; going on with what was read")
        finally:
            self._reading = False
        self._use_if_changed("the configuration topic")

    async def follow(self, bootstrap: str, catalog: TopicCatalog) -> None:
        """Read the topic from its start, then each record as it comes, until cancelled."""
        async with reading(bootstrap, catalog, [catalog.config], "streams-config",
                           offset_reset="earliest") as typed:
            await self.read(typed)
            while True:
                for item in await typed.fetch(1000):
                    self.configured(item)


async def configured(bootstrap: str, catalog: TopicCatalog) -> tuple[dict[str, float], SloConfig]:
    """The GPU prices and the SLO the configuration topic holds now."""
    feed = ConfigFeed(lambda _prices, _slo: None)
    async with reading(bootstrap, catalog, [catalog.config], "streams-config",
                       offset_reset="earliest") as typed:
        await feed.read(typed)
    return feed.prices, feed.slo
