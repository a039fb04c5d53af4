"""The operator's ``SetAdmissionLimits`` outlives the routers' read-back window, on the real
broker: the controllers, which follow the control topic, restate it, and a router started when
the command itself is older than its window (600 s) still runs by it. Before 6 Dec nothing
restated it: such a router ran by the configuration while the routers that had read the command
kept it."""

import asyncio
import json
import sys

import pytest

from controllers.overrides import RESTATED
from controllers.router.service import RouterService
from controllers.service import ControllersService
from infra.bus import Outbox, now_ms, reading
from schemas.codec import encode
from schemas.commands import SetAdmissionLimits, SetLoadShedLevel, TenantLimit
from schemas.config import ConfigSet
from schemas.events import ConfigApplied
from tests.integration.router_following import a_router_following, applied_by, until

pytestmark = pytest.mark.integration

AGO_MS = 700_000  # beyond the routers' and the controllers' read-back windows (600 s)


async def _scenario(bootstrap, catalog) -> RouterService:
    async with reading(bootstrap, catalog, [catalog.telemetry, catalog.control],
                       "operator-commands-test", offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        long_ago = now_ms() - AGO_MS
        outbox.emit(catalog.config, ConfigSet(event_time_ms=long_ago - 100_000, key="tenants.acme",
                                              value={"requests_per_s": 1, "tokens_per_s": 1e6}),
                    "tenants.acme")
        await outbox.flush()
        stop = asyncio.Event()
        controllers = asyncio.create_task(ControllersService(bootstrap, catalog).run(stop))
        try:
            await applied_by(typed, "controllers", "tenants.acme")  # (following the topic now)
            command = SetAdmissionLimits(event_time_ms=long_ago, command_id="incident-42",
                                         reason="incident 42", limits={
                                             "acme": TenantLimit(requests_per_s=100,
                                                                 tokens_per_s=1e6)})
            # stamped as if written long ago: a router's read-back does not reach it
            await typed.producer.send_and_wait(catalog.control, encode(command),
                                               b"set_admission_limits", timestamp_ms=long_ago)
            async with asyncio.timeout(60):
                while not any(isinstance(item.message, SetAdmissionLimits)
                              and item.message.command_id == "incident-42"
                              and item.message.reason.startswith(RESTATED)
                              for item in await typed.fetch(200)):
                    assert not controllers.done(), controllers.exception()
            router = RouterService(bootstrap, catalog)
            running = asyncio.create_task(router.run(stop))
            try:
                await applied_by(typed, "router", "tenants.acme")
            finally:
                stop.set()
                await running
        finally:
            stop.set()
            await controllers
    return router


def test_a_router_started_after_its_window_has_passed_a_command_still_runs_by_it(
        kafka_bootstrap, catalog):
    router = asyncio.run(_scenario(kafka_bootstrap, catalog))
    assert router.core.admission.limits["acme"].requests_per_s == 100


async def _command_obeyed(bootstrap, catalog) -> tuple[int, str, str, RouterService]:
    async with a_router_following(bootstrap, catalog, "command-cli-test") as (_, router,
                                                                               running):
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "infra.cli", "command", "set_admission_limits",
            '{"limits": {"acme": {"requests_per_s": 7, "tokens_per_s": 1e6}}}',
            "--reason", "incident 43", "--bootstrap", bootstrap, "--namespace",
            catalog.namespace, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        output, said = await asyncio.wait_for(cli.communicate(), 60)
        await until(lambda: router.core.admission.limits["acme"].requests_per_s == 7, running)
    return cli.returncode, output.decode(), said.decode(), router


def test_governor_command_sends_an_operators_command_the_routers_obey(kafka_bootstrap, catalog):
    """It says where it sent the command on stderr, and writes the command's JSON, its
    ``command_id`` with it, alone on stdout (before 7 Dec on stderr only)."""
    returncode, output, said, router = asyncio.run(_command_obeyed(kafka_bootstrap, catalog))
    assert returncode == 0, said
    assert f"sent to {catalog.control} under key set_admission_limits" in said
    sent = json.loads(output)
    assert (sent["reason"], sent["issued_by"]) == ("incident 43", "operator")
    assert router.core.overrides.limits.reason == "incident 43"
    assert router.core.overrides.limits.command_id == sent["command_id"]


HOUR_MS = 3_600_000


async def _a_command_an_hour_ahead_then_one_now(bootstrap, catalog) -> RouterService:
    async with a_router_following(bootstrap, catalog, "command-ahead-test") as (typed, router,
                                                                                 running):
        outbox = Outbox(typed.producer)
        at = now_ms()
        for ahead_ms, rate in ((HOUR_MS, 100), (0, 7)):  # an operator's clock an hour fast,
            outbox.emit(catalog.control, SetAdmissionLimits(  # then one set right
                event_time_ms=at + ahead_ms, command_id=f"incident-{rate}", limits={
                    "acme": TenantLimit(requests_per_s=rate, tokens_per_s=1e6)}),
                "set_admission_limits")
        outbox.emit(catalog.control, SetLoadShedLevel(event_time_ms=now_ms(),
                                                      command_id="marker", min_value=0.25),
                    "set_load_shed_level")  # (read after both: one partition)
        await outbox.flush()
        await until(lambda: router.core.admission.shed_below == 0.25, running)
    return router


def test_a_command_stamped_an_hour_ahead_does_not_hold_off_the_commands_after_it(
        kafka_bootstrap, catalog):
    """A command stamped further ahead of the router's clock than an event may be is refused:
    taken, every command stamped before it (every one for the next hour) was passed over as
    older, and no configuration record could end it."""
    router = asyncio.run(_a_command_an_hour_ahead_then_one_now(kafka_bootstrap, catalog))
    assert router.core.admission.limits["acme"].requests_per_s == 7
    assert router.core.overrides.limits.command_id == "incident-7"


async def _acme_in_a_router_started_now(bootstrap, catalog, last_tenant: str) -> float:
    """acme's limit in a router started now, once it has read the command back and the
    configuration up to ``last_tenant``'s record (its last)."""
    stop = asyncio.Event()
    restarted = RouterService(bootstrap, catalog)
    again = asyncio.create_task(restarted.run(stop))
    try:
        await until(lambda: restarted.core.overrides.limits is not None  # (read back first)
                     and last_tenant in restarted.core.config.tenants, again)  # (then these)
    finally:
        stop.set()
        await again
    return restarted.core.admission.limits["acme"].requests_per_s


async def _a_command_read_after_a_newer_setting(bootstrap, catalog) -> tuple[float, float]:
    """The configuration sets acme's limit, then a command stamped 5 s before that record is
    read (its issuer's clock behind, or stamped before a slow connect): the running router's
    limit, and a router's restarted after it."""
    async with a_router_following(bootstrap, catalog, "command-behind-test") as (typed, router,
                                                                                  running):
        outbox = Outbox(typed.producer)
        outbox.emit(catalog.control, SetAdmissionLimits(
            event_time_ms=now_ms() - 5_000, command_id="incident-44", limits={
                "acme": TenantLimit(requests_per_s=100, tokens_per_s=1e6)}),
            "set_admission_limits")
        outbox.emit(catalog.control, SetLoadShedLevel(event_time_ms=now_ms(),
                                                      command_id="marker", min_value=0.25),
                    "set_load_shed_level")
        await outbox.flush()
        await until(lambda: router.core.overrides.limits is not None
                     and router.core.admission.shed_below == 0.25, running)
    return (router.core.admission.limits["acme"].requests_per_s,
            await _acme_in_a_router_started_now(bootstrap, catalog, "acme"))


def test_a_command_read_after_a_newer_setting_of_its_tenant_does_not_override_it(
        kafka_bootstrap, catalog):
    """The configuration's record is the newer word on acme (by event time), as a router
    started afterwards, reading the command back before the configuration, finds: the running
    router took the command's limit for good, the restarted one the configuration's."""
    running, restarted = asyncio.run(_a_command_read_after_a_newer_setting(kafka_bootstrap,
                                                                           catalog))
    assert (running, restarted) == (1, 1)


async def _the_most_tenants_a_command_holds(bootstrap, catalog) -> tuple[int, str, int]:
    """A command of 1,024 tenants with names of 64 characters (what the schema allows): its
    fields are 155 kB, over the 128 KiB Linux takes as one argument, so they go on stdin."""
    limits = {f"tenant-{i:04d}".ljust(64, "x"): {"requests_per_s": 123.5, "tokens_per_s": 1e5,
                                                 "burst_s": 2.5, "priority": 3}
              for i in range(1024)}
    async with a_router_following(bootstrap, catalog, "command-stdin-test") as (_, router,
                                                                                 running):
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "infra.cli", "command", "set_admission_limits", "-",
            "--bootstrap", bootstrap, "--namespace", catalog.namespace,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(cli.communicate(json.dumps({"limits": limits})
                                                           .encode()), 60)
        if cli.returncode == 0:
            await until(lambda: len(router.core.overrides.held_limits) == 1024, running)
    return cli.returncode, output.decode(), len(router.core.admission.limits)


def test_governor_command_reads_fields_too_long_for_an_argument_from_stdin(kafka_bootstrap,
                                                                          catalog):
    returncode, output, limits = asyncio.run(_the_most_tenants_a_command_holds(kafka_bootstrap,
                                                                              catalog))
    assert returncode == 0, output[-500:]
    assert limits == 1025  # (acme, the configuration's, and the command's 1,024)


def _limit(rate: int) -> dict:
    return {"requests_per_s": rate, "tokens_per_s": 1e6}


async def _a_command_across_a_restored_tenants_record(bootstrap, catalog) -> tuple[float, float]:
    """Every tenant's limit set, then a command for acme; then beta's limit set, and a bad
    ``tenants`` record, which the router rejects and restores (the value in force written
    again): acme's limit in the running router and in one started afterwards."""
    async with a_router_following(bootstrap, catalog, "command-restore-test") as (
            typed, router, running):
        outbox = Outbox(typed.producer)
        at = now_ms()
        outbox.emit(catalog.config, ConfigSet(event_time_ms=at, key="tenants", value={
            "acme": _limit(1), "beta": _limit(1)}), "tenants")
        outbox.emit(catalog.control, SetAdmissionLimits(
            event_time_ms=at + 5, command_id="incident-45",
            limits={"acme": TenantLimit(**_limit(100))}), "set_admission_limits")
        await outbox.flush()
        await until(lambda: router.core.admission.limits["acme"].requests_per_s == 100, running)
        outbox.emit(catalog.config, ConfigSet(event_time_ms=at + 10, key="tenants.beta",
                                              value=_limit(2)), "tenants.beta")
        await outbox.flush()
        bad = await typed.producer.send_and_wait(catalog.config, encode(ConfigSet(
            event_time_ms=at + 15, key="tenants", value="not a map")), b"tenants")
        async with asyncio.timeout(60):  # the router applies the record it restores
            while not any(isinstance(item.message, ConfigApplied) and item.message.key == "tenants"
                          and item.message.config_offset > bad.offset
                          for item in await typed.fetch(200)):
                pass
        outbox.emit(catalog.config, ConfigSet(event_time_ms=at + 20, key="tenants.gamma",
                                              value=_limit(3)), "tenants.gamma")
        await outbox.flush()  # (read after the restored record: one partition)
    return (router.core.admission.limits["acme"].requests_per_s,
            await _acme_in_a_router_started_now(bootstrap, catalog, "gamma"))


def test_a_restored_tenants_record_ends_a_command_only_for_the_tenants_set_after_it(
        kafka_bootstrap, catalog):
    """Before 6 Dec (late) the restored record said one time for every tenant, beta's: the
    running router and one started afterwards both dropped acme's command at 1 request/s."""
    running, restarted = asyncio.run(_a_command_across_a_restored_tenants_record(
        kafka_bootstrap, catalog))
    assert (running, restarted) == (100, 100)
