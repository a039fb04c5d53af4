"""On the real broker: a restoring record written by a router reading the configuration topic
behind (it read a rejected ``tenants`` record, not yet the ``tenants.gamma`` after it) does not
drop gamma, for the running router or one started afterwards, which reads the value in force
the running router wrote again. Before, both ran without gamma."""

import asyncio

import pytest

from controllers.live_config import LiveConfig
from controllers.router.service import RouterService
from infra.bus import Outbox, now_ms
from schemas.config import ConfigSet
from tests.integration.router_following import a_router_following, until

pytestmark = pytest.mark.integration

GAMMA = {"requests_per_s": 3, "tokens_per_s": 1e6}


async def _tenants_after_a_stale_restore(bootstrap, catalog) -> tuple[list[str], list[str]]:
    async with a_router_following(bootstrap, catalog, "stale-restore-test") as (
            typed, router, running):
        at = now_ms()
        acme = router.live_config.config.setting("tenants")  # (acme, the helper's)
        history = [ConfigSet(event_time_ms=at, key="tenants", value=acme),
                   ConfigSet(event_time_ms=at + 5, key="tenants", value="not a map")]
        behind = LiveConfig("router-behind")
        for offset, record in enumerate(history, start=1):  # (after the helper's record)
            behind.apply(record, offset, at, record.key.encode())
        outbox = Outbox(typed.producer)
        for record in [*history, ConfigSet(event_time_ms=at + 10, key="tenants.gamma",
                                           value=GAMMA), *behind.to_restore(at + 15)]:
            outbox.emit(catalog.config, record, record.key)
        await outbox.flush()
        marker = ConfigSet(event_time_ms=at + 20, key="slo.ttft_slo_s", value=1.5)
        outbox.emit(catalog.config, marker, marker.key)  # (read after the records before it)
        await outbox.flush()
        await until(lambda: router.live_config.config.slo.ttft_slo_s == 1.5, running)
    stop = asyncio.Event()
    restarted = RouterService(bootstrap, catalog)
    again = asyncio.create_task(restarted.run(stop))
    try:
        await until(lambda: restarted.live_config.config.slo.ttft_slo_s == 1.5, again)
    finally:
        stop.set()
        await again
    return (sorted(router.live_config.config.tenants),
            sorted(restarted.live_config.config.tenants))


def test_a_stale_restoring_record_does_not_drop_a_tenant_set_after_what_it_knew(
        kafka_bootstrap, catalog):
    running, restarted = asyncio.run(_tenants_after_a_stale_restore(kafka_bootstrap, catalog))
    assert running == restarted == ["acme", "gamma"]
