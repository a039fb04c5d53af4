"""``governor report actions`` on the real broker and a real chdb store, for an operator's
command the controllers restated: the timeline shows the command once, with its own reason. A
restatement keeps the command's id and event time, so each landed as another row at the
command's time: a command held a day was 1,440 identical rows, and a 100-row timeline showed
nothing older than it."""

import asyncio

import pytest

from analytics.reports import run_report
from analytics.store import StoreLocation
from controllers.overrides import RESTATE_S, OperatorOverrides
from infra.bus import Outbox, make_producer, now_ms
from infra.command_cli import operator_command
from schemas.commands import ScalePool, target
from tests.integration.analytics_support import caught_up_sink

pytestmark = pytest.mark.integration


async def _timeline(bootstrap, catalog, location) -> list[dict]:
    at = now_ms() - 10 * 60_000
    earlier = ScalePool(event_time_ms=at - 1_000, command_id="scale-1", issued_by="autoscaler",
                        pool="h100@m", gpu_type="h100", model="m", replicas=2, reason="deep")
    command = operator_command("set_admission_limits", '{"limits": {"acme": {"requests_per_s": '
                               '5, "tokens_per_s": 5e4}}}', reason="incident 42",
                               issued_by="alice", now_ms=at)
    overrides = OperatorOverrides()
    overrides.take(command, at)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox = Outbox(producer)
        outbox.emit(catalog.control, earlier, target(earlier))
        outbox.emit(catalog.control, command, target(command))
        for n in range(1, 4):  # what the controllers send while it holds
            for restated in overrides.restatements(at + int(n * RESTATE_S * 1000)):
                outbox.emit(catalog.control, restated, target(restated))
        await outbox.flush()
    finally:
        await producer.stop()
    async with caught_up_sink(bootstrap, catalog, location) as (_, source, _):
        return run_report(source, "actions", days=1).dicts()


def test_the_actions_timeline_shows_a_restated_command_once(kafka_bootstrap, catalog, tmp_path):
    location = StoreLocation.for_namespace(catalog.namespace, tmp_path)
    got = asyncio.run(_timeline(kafka_bootstrap, catalog, location))
    assert [(r["action"], r["actor"], r["reason"]) for r in got] == [
        ("set_admission_limits", "alice", "incident 42"),
        ("scale_pool", "autoscaler", "deep")]
