"""``governor report actions`` on the real broker and a real chdb store, for an operator's
command its readers refused (stamped an hour ahead of their clocks): the timeline says it was
refused, why and by whom. Before, the routers and the controllers only logged the refusal, and
the report listed the command like any other, as if it held."""

import asyncio

import pytest

from analytics.reports import run_report
from analytics.store import StoreLocation
from infra.bus import Outbox, now_ms
from infra.command_cli import operator_command
from schemas.commands import target
from tests.integration.analytics_support import caught_up_sink
from tests.integration.router_following import a_router_following, until

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
LIMITS = '{"limits": {"acme": {"requests_per_s": %d, "tokens_per_s": 1e6}}}'


async def _refused_timeline(bootstrap, catalog, location) -> tuple[str, list[dict]]:
    async with a_router_following(bootstrap, catalog, "refused-commands-test") as (
            typed, router, running):
        outbox = Outbox(typed.producer)
        at = now_ms()
        for ahead_ms, rate in ((HOUR_MS, 100), (0, 7)):  # a clock an hour fast, then one set
            command = operator_command("set_admission_limits", LIMITS % rate,  # right
                                       reason=f"rate {rate}", issued_by="alice",
                                       now_ms=at + ahead_ms)
            outbox.emit(catalog.control, command, target(command))
        await outbox.flush()
        # (one partition: the first was read, and dead-lettered, before the second)
        await until(lambda: router.core.overrides.limits is not None, running)
    assert router.core.admission.limits["acme"].requests_per_s == 7
    async with caught_up_sink(bootstrap, catalog, location) as (_, source, _):
        return router.router_id, run_report(source, "actions", days=1).dicts()


def test_the_actions_timeline_says_which_commands_their_readers_refused(kafka_bootstrap,
                                                                       catalog, tmp_path):
    location = StoreLocation.for_namespace(catalog.namespace, tmp_path)
    router_id, got = asyncio.run(_refused_timeline(kafka_bootstrap, catalog, location))
    commands = [(r["reason"], r["refused"]) for r in got if r["kind"] == "command"]
    assert [reason for reason, _ in commands] == ["rate 100", "rate 7"]  # (latest first)
    refused, held = commands[0][1], commands[1][1]
    assert refused.startswith(f"future_event_time by {router_id}: set_admission_limits "
                              "set_admission_limits-"), refused
    assert "refused: stamped 3599." in refused or "refused: stamped 3600." in refused, refused
    assert held == ""
