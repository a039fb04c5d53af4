"""Cost per successful task on the real broker equals the hand computation, across a SIGKILL and
restart of the only Faust worker (its tables come back from their changelogs).

The scenario (``streams.synthetic.cost_scenario``): an h100 ($3.00/GPU-hour) and an a100 ($1.80)
worker heartbeat every second for 20 s, requests never overlap on a worker.
* task-a (2 steps): a1 runs 2 s on the h100 and is requeued, is retried 2 s on the a100 and
  completes; a2 runs 2 s on the h100. Succeeds; cost 4 h100-seconds + 2 a100-seconds.
* task-b (5 steps): 1 s each of b1, b2, b3 on the a100; b3 fails. Cost 3 a100-seconds, no success.
* c1 (no task id): 1 h100-second, succeeds. d1 (no task id): shed, costs nothing, fails.
"""

import asyncio
import time

import pytest

from streams.synthetic import cost_scenario
from streams_support import SignalsReader, produce, start_streams_worker, stop, wait_for_members

pytestmark = pytest.mark.integration

H100_S, A100_S = 3.00 / 3600, 1.80 / 3600
TASK_A = 4 * H100_S + 2 * A100_S
TASK_B = 3 * A100_S
TASK_C = 1 * H100_S
SPEND = 20 * H100_S + 20 * A100_S
SCOPES = ("fleet:all", "tenant:t1", "tenant:t2", "worker:w-h")


def _settled(signals: SignalsReader) -> bool:
    """Every scope the test reads has its final snapshot: the fleet, both tenants and the h100
    are keyed to different partitions of the signals topic, so one arriving says nothing of the
    others."""
    fleet = signals.total("fleet:all")
    tenant_costs = [signals.total(f"tenant:{t}").get("task_cost_usd", 0) for t in ("t1", "t2")]
    return (fleet.get("tasks_closed") == 4
            and fleet.get("task_cost_usd", 0) >= TASK_A + TASK_B + TASK_C - 1e-12
            and fleet.get("provisioned_s") == 40.0
            and tenant_costs[0] >= TASK_A + TASK_B - 1e-12 and tenant_costs[1] >= TASK_C - 1e-12
            and [signals.total(f"tenant:{t}").get("tasks_closed") for t in ("t1", "t2")] == [2, 2]
            and signals.total("worker:w-h").get("provisioned_s") == 20.0)


async def _scenario(bootstrap, catalog, tmp_path):
    messages = cost_scenario(int(time.time() * 1000) - 30_000)
    cut = next(i for i, m in enumerate(messages) if m.event_time_ms - messages[0].event_time_ms
               >= 7_000)  # mid-way: task-a and task-b are open, b3 still running
    group = f"{catalog.namespace}.streams"
    worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "first.log")
    try:
        async with SignalsReader(bootstrap, catalog) as signals:
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            await produce(bootstrap, catalog, messages[:cut])
            await signals.wait_until(
                lambda: signals.total("fleet:all").get("events") == sum(
                    1 for m in messages[:cut] if m.type != "worker_status"), 60,
                "the first part's signals", [worker])
            worker.kill()
            worker.wait()
            worker = start_streams_worker(bootstrap, catalog.namespace, tmp_path / "second.log")
            await wait_for_members(bootstrap, group, 1, 90, [worker])
            await produce(bootstrap, catalog, messages[cut:])
            await signals.wait_until(lambda: _settled(signals), 180,
                                     "every task closed and costed after the restart", [worker],
                                     lambda: {k: signals.total(k) for k in SCOPES})
            return signals
    finally:
        stop(worker)


def test_cost_per_successful_task_survives_a_restart_and_equals_the_hand_computation(
        kafka_bootstrap, catalog, tmp_path):
    signals = asyncio.run(_scenario(kafka_bootstrap, catalog, tmp_path))
    fleet = signals.total("fleet:all")
    assert (fleet["tasks_succeeded"], fleet["tasks_failed"]) == (2, 2)
    assert fleet["task_cost_usd"] == pytest.approx(TASK_A + TASK_B + TASK_C)
    assert fleet["cost_per_successful_task_usd"] == pytest.approx((TASK_A + TASK_B + TASK_C) / 2)
    assert fleet["spend_usd"] == pytest.approx(SPEND)
    assert fleet["spend_per_successful_task_usd"] == pytest.approx(SPEND / 2)
    assert (fleet["completed"], fleet["failed"], fleet["rejected"]) == (5, 1, 1)
    assert fleet["retries"] == 1 and fleet["sheds"] == 1
    tenant_1, tenant_2 = signals.total("tenant:t1"), signals.total("tenant:t2")
    assert tenant_1["cost_per_successful_task_usd"] == pytest.approx(TASK_A + TASK_B)
    assert tenant_2["cost_per_successful_task_usd"] == pytest.approx(TASK_C)
    assert signals.total("worker:w-h")["utilisation_ratio"] == pytest.approx(5 / 20)
