"""Records of the control and configuration topics stamped ahead of when they were written (their
writer's clock runs fast), on the real broker: every router judges such a record by the broker's
time of it (``LogAppendTime``), so routers agree whatever their own clocks and start times.

Before 6 Dec a router judged a command by its own clock: one started after the stamp's time took
the command that the running routers had refused (and `governor report actions` called refused).
And a configuration record stamped ahead was taken as set then: an operator's command for its
tenant made before that time was ignored for it, silently, until the clock caught up."""

import asyncio

import pytest

import controllers.router.service as router_service
from infra.bus import Outbox, now_ms
from infra.command_cli import operator_command
from schemas.commands import target
from schemas.config import ConfigSet
from schemas.events import ConfigApplied, ConfigRejected
from tests.integration.router_following import a_router_following, until

pytestmark = pytest.mark.integration

AHEAD_MS = 120_000  # past the 10 s a stamp may be ahead, within a router's read-back (600 s)
LIMITS = '{"limits": {"acme": {"requests_per_s": %d, "tokens_per_s": 1e6}}}'


async def _commands(bootstrap, catalog) -> str:
    """A command stamped ``AHEAD_MS`` ahead (100 requests/s), then one stamped right (7), read
    by a router following the topics; returns the reason of the command it holds."""
    async with a_router_following(bootstrap, catalog, "ahead") as (typed, router, running):
        outbox = Outbox(typed.producer)
        at = now_ms()
        for ahead_ms, rate in ((AHEAD_MS, 100), (0, 7)):
            command = operator_command("set_admission_limits", LIMITS % rate,
                                       reason=f"rate {rate}", issued_by="alice",
                                       now_ms=at + ahead_ms)
            outbox.emit(catalog.control, command, target(command))
        await outbox.flush()
        # (one partition: the first was read, and refused, before the second)
        await until(lambda: router.core.overrides.limits is not None, running)
        return router.core.overrides.limits.reason


def test_a_router_started_after_a_refused_commands_stamp_refuses_it_too(
        kafka_bootstrap, catalog, monkeypatch):
    """The router following refuses the command stamped 120 s ahead and holds the next; one
    started with its clock 200 s on (as one started 200 s later, both commands still in its
    read-back window) reads them back and does the same, where before it took the first (later
    by its stamp, so the second passed for older): 100 requests/s for acme, over the
    configuration set since."""
    assert asyncio.run(_commands(kafka_bootstrap, catalog)) == "rate 7"

    async def restarted() -> tuple[str, float]:
        async with a_router_following(kafka_bootstrap, catalog, "ahead-restarted") as (
                typed, router, running):  # (which sets acme's limit again, after the command
            # for 7: the config topic's second record, which only this router applies)
            async with asyncio.timeout(30):
                while not any(isinstance(item.message, ConfigApplied)
                              and item.message.config_offset == 1
                              for item in await typed.fetch(200)):
                    pass
            await until(lambda: router.core.overrides.limits is not None, running)  # read back
            return (router.core.overrides.limits.reason,
                    router.core.admission.limits["acme"].requests_per_s)

    real = router_service.now_ms
    monkeypatch.setattr(router_service, "now_ms", lambda: real() + AHEAD_MS + 80_000)
    assert asyncio.run(restarted()) == ("rate 7", 1)


async def _config_ahead(bootstrap, catalog) -> tuple[list, float]:
    async with a_router_following(bootstrap, catalog, "config-ahead") as (typed, router, running):
        outbox = Outbox(typed.producer)
        outbox.emit(catalog.config, ConfigSet(
            event_time_ms=now_ms() + 3_600_000, key="tenants.acme",
            value={"requests_per_s": 2, "tokens_per_s": 1e6}), "tenants.acme")
        await outbox.flush()
        rejected = []
        async with asyncio.timeout(30):
            while not rejected:
                rejected = [item.message for item in await typed.fetch(100)
                            if isinstance(item.message, ConfigRejected)]
        command = operator_command("set_admission_limits", LIMITS % 100, reason="incident",
                                   issued_by="alice", now_ms=now_ms())
        outbox.emit(catalog.control, command, target(command))
        await outbox.flush()
        await until(lambda: router.core.overrides.limits is not None, running)
        return rejected, router.core.admission.limits["acme"].requests_per_s


def test_a_configuration_record_stamped_ahead_is_rejected_and_blocks_no_command(
        kafka_bootstrap, catalog):
    """``tenants.acme`` stamped an hour ahead: rejected (`future_event_time`, saying by how
    much), and an operator's command for acme made after it
    holds. Before, the record was applied as set an hour on, and the command held for no tenant
    (acme at the record's 2 requests/s). (That the value in force is written again:
    ``tests/unit/controllers/test_stamped_ahead_config.py``.)"""
    rejected, limit = asyncio.run(_config_ahead(kafka_bootstrap, catalog))
    assert [r.key for r in rejected] == ["tenants.acme"]
    assert "future_event_time: stamped 3599." in rejected[0].reason \
        or "future_event_time: stamped 3600." in rejected[0].reason, rejected[0].reason
    assert limit == 100
