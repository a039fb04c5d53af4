"""``governor report actions`` on the real broker and a real chdb store, for an operator's
``scale_pool`` the local stack's supervisor cannot carry out (more workers than the dispatch
topic has partitions): the timeline says so. Before, the supervisor only logged it, and the
report listed the command as if the pool had been scaled."""

import asyncio

import pytest

from analytics.reports import run_report
from analytics.store import StoreLocation
from infra.bus import Outbox, now_ms, reading
from infra.command_cli import operator_command
from infra.supervisor import supervise
from schemas.commands import target
from schemas.events import DeadLetter
from tests.integration.analytics_support import caught_up_sink

pytestmark = pytest.mark.integration

FIELDS = '{"pool": "h100@llama-3-8b", "gpu_type": "h100", "model": "llama-3-8b", "replicas": 40}'


class _NoWorkers:
    """A local stack running no worker: what the supervisor reads of one before it scales."""

    vllm_urls = ()
    processes: dict = {}
    fleet: list = []  # (no pool of its own: a pool's workers run on the least degree)

    def workers_of(self, pool: str) -> list[int]:
        return []

    def scale(self, *args):
        raise AssertionError("nothing to scale: the command cannot be carried out")


async def _refused_scale(bootstrap, catalog, location) -> list[dict]:
    command = operator_command("scale_pool", FIELDS, reason="big day", issued_by="alice",
                               now_ms=now_ms())
    stop = asyncio.Event()
    supervising = asyncio.create_task(supervise(_NoWorkers(), bootstrap, catalog, stop))
    try:
        async with reading(bootstrap, catalog, [catalog.deadletter], "refused-scale-test",
                           offset_reset="earliest") as typed:
            outbox = Outbox(typed.producer)
            async with asyncio.timeout(60):
                letters: list = []
                while not letters:  # (sent again until the supervisor, reading from its
                    outbox.emit(catalog.control, command, target(command))  # start, has it)
                    await outbox.flush()
                    letters = [item for item in await typed.fetch(500)
                               if isinstance(item.message, DeadLetter)]
                    assert not supervising.done(), supervising.exception()
    finally:
        stop.set()
        await supervising
    async with caught_up_sink(bootstrap, catalog, location) as (_, source, _):
        return run_report(source, "actions", days=1).dicts()


def test_the_actions_timeline_says_which_pool_sizes_the_supervisor_left(kafka_bootstrap,
                                                                       catalog, tmp_path):
    location = StoreLocation.for_namespace(catalog.namespace, tmp_path)
    got = asyncio.run(_refused_scale(kafka_bootstrap, catalog, location))
    (row,) = [r for r in got if r["kind"] == "command"]  # (the command once, sent as often)
    assert (row["action"], row["actor"], row["reason"]) == ("scale_pool", "alice", "big day")
    assert row["refused"].startswith("unprocessable by supervisor: supervisor leaves "
                                     "h100@llama-3-8b as it is: 40 workers"), row["refused"]
