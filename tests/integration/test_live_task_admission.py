"""Task admission in the live router, on the real broker: an overloaded fleet refuses a task at
its first step (and then its later steps), and routers in one group weigh the tasks they read
against their share of the request partitions."""

import asyncio
import contextlib

import pytest

from controllers.router.service import RouterService
from infra.bus import now_ms
from schemas.config import GovernorConfig, TaskAdmissionConfig
from schemas.events import Queued, Rejected
from schemas.requests import InferenceRequest
from tests.integration.test_router_waiting import _LiveRouter

pytestmark = pytest.mark.integration

#: So little work per second that one task fills the fleet: the next one is refused.
OVERLOADED = GovernorConfig(task_admission=TaskAdmissionConfig(target_load=1e-6))


def _step(task_id: str, step: int) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=f"{task_id}-{step}",
                            task_id=task_id, step=step, steps_total=4, model="llama-3-8b",
                            prompt_tokens=512, max_tokens=64)


async def _overloaded(bootstrap, catalog) -> dict:
    async with _LiveRouter(bootstrap, catalog, config=OVERLOADED) as live:
        steps = [_step("first", 1), _step("second", 1), _step("second", 2)]
        for request in steps:  # one partition: the router reads them in this order
            live.outbox.emit(catalog.requests, request, request.request_id, 0)
        await live.outbox.flush()
        await live.until(lambda: all(live.answer(r.request_id) for r in steps))
        return {r.request_id: live.answer(r.request_id)[0] for r in steps}


def test_an_overloaded_fleet_refuses_a_task_at_its_first_step(kafka_bootstrap, catalog):
    answers = asyncio.run(_overloaded(kafka_bootstrap, catalog))
    assert isinstance(answers["first-1"], Queued)
    refused, later = answers["second-1"], answers["second-2"]
    assert isinstance(refused, Rejected) and refused.reason == "load_shed"
    assert "GPU-seconds" in refused.detail and "task second fails with it" in refused.detail
    assert refused.retry_after_s is None
    assert isinstance(later, Rejected) and later.reason == "task_failed"


async def _two_routers(bootstrap, catalog) -> list[float]:
    stop = asyncio.Event()
    routers = [RouterService(bootstrap, catalog, router_id=f"router-{i}", recovery_window_s=0)
               for i in range(2)]
    running = [asyncio.create_task(r.run(stop)) for r in routers]
    try:
        async with asyncio.timeout(60):
            while sorted(r.core.request_share for r in routers) != [0.5, 0.5]:
                await asyncio.sleep(0.1)  # polling the condition; the group rebalances meanwhile
        return [r.core.request_share for r in routers]
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running)


def test_two_routers_each_weigh_tasks_against_half_the_fleet(kafka_bootstrap, catalog):
    # The request topic has 4 partitions; a group of two routers splits them 2 and 2.
    assert catalog.spec(catalog.requests).partitions == 4
    assert asyncio.run(_two_routers(kafka_bootstrap, catalog)) == [0.5, 0.5]
