"""``governor config set`` on a machine whose clock is behind the last change under its key (a
record of acme's limit stamped 8 s ahead of it, by another operator's clock: within the 10 s a
record may be stamped ahead of its writing) stamps its
change just after that one, on the real broker. Before, it stamped its own time: once
compaction dropped the older record of the key, a router started afterwards weighed an
operator's command against the earlier time alone, and held a command the running routers
had ended."""

import asyncio

import pytest

from infra.bus import Outbox, now_ms, reading
from infra.config_cli import set_setting
from schemas.codec import decode
from schemas.config import ConfigSet
from tests.integration.router_following import every_record

pytestmark = pytest.mark.integration

LIMIT = {"requests_per_s": 1, "tokens_per_s": 1e6}


async def _stamps(bootstrap, catalog, ahead_key: str, ahead_value, key: str,
                  value) -> tuple[int, int]:
    """A record of ``ahead_key`` stamped 8 s ahead, then ``governor config set`` of ``key``
    here: the record's stamp and the change's."""
    ahead = now_ms() + 8_000
    async with reading(bootstrap, catalog, [catalog.config], "clock-behind-test",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        outbox.emit(catalog.config, ConfigSet(event_time_ms=ahead, key=ahead_key,
                                              value=ahead_value), ahead_key)
        await outbox.flush()
        await set_setting(bootstrap, catalog, key, value)
        records = [decode(catalog.spec(catalog.config), record.value)
                   for record in await every_record(typed, catalog, catalog.config)]
    (change,) = [r for r in records if r.key == key and r.value == value]
    return ahead, change.event_time_ms


def test_config_set_stamps_its_change_after_the_last_change_under_its_key(kafka_bootstrap,
                                                                          catalog):
    ahead, stamped = asyncio.run(_stamps(kafka_bootstrap, catalog, "tenants.acme", LIMIT,
                                         "tenants", {"acme": LIMIT, "beta": LIMIT}))
    assert stamped == ahead + 1


POOL = "autoscaler.pools.h100@llama-3-8b"


def test_config_set_stamps_its_change_after_a_record_setting_a_field_to_null(kafka_bootstrap,
                                                                            catalog):
    """A pool's ``gpus`` null is left out of the configuration's JSON data (so that a reader
    older than the field reads the pool). Before 6 Dec the record setting it so, where it was
    null already, was noted as setting nothing: the change after it kept its own, earlier time,
    so the analytics store's latest value of the setting (``config_settings``, the latest by
    time) was the null, not the 2 in force, and ``governor report actions`` listed the null
    as the newer."""
    asyncio.run(set_setting(kafka_bootstrap, catalog, POOL, {"min_replicas": 1}))  # gpus null
    ahead, stamped = asyncio.run(_stamps(kafka_bootstrap, catalog, f"{POOL}.gpus", None,
                                         f"{POOL}.gpus", 2))
    assert stamped == ahead + 1
