"""``Stack.revive`` (what ``governor up`` runs): a SIGKILLed router is started again and serves
requests; so is a SIGKILLed worker, on its slot, but not one drained on a command."""

import asyncio

import pytest

from infra.bus import Outbox, now_ms, reading
from infra.stack import PoolSpec, RestartBackoff, Stack
from schemas.requests import InferenceRequest

pytestmark = pytest.mark.integration


async def _served(bootstrap, catalog, request_id: str, timeout_s: float = 90) -> None:
    """Produce a request and wait for its Completed event."""
    async with reading(bootstrap, catalog, [catalog.telemetry], f"revive-{request_id}",
                       offset_reset="earliest") as typed:
        outbox = Outbox(typed.producer)
        t = now_ms()
        outbox.emit(catalog.requests, InferenceRequest(
            event_time_ms=t, created_ms=t, request_id=request_id, prompt_tokens=64,
            max_tokens=8), request_id)
        await outbox.flush()
        async with asyncio.timeout(timeout_s):
            while True:
                for item in await typed.fetch(200):
                    message = item.message
                    if (getattr(message, "request_id", None) == request_id
                            and message.type == "completed"):
                        return


def test_a_crashed_router_is_started_again_and_serves_requests(kafka_bootstrap, catalog,
                                                               tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 2)], tmp_path,
                  speedup=20, restarts=RestartBackoff(stable_s=0.0))
    stack.start()
    try:
        asyncio.run(_served(kafka_bootstrap, catalog, "before"))
        first = stack.processes["router"].pid
        for name in ("router", "worker-1"):
            stack.kill(name)
            stack.processes[name].wait(timeout=30)
        assert stack.revive() == {"router": -9, "worker-1": -9}  # the worker crashed: on its slot
        assert stack.running("router") and stack.processes["router"].pid != first
        assert stack.running("worker-1")
        asyncio.run(_served(kafka_bootstrap, catalog, "after"))
        stack.scale(PoolSpec("h100", 1), 1)  # drained on a command: exits 0, left stopped
        stack.processes["worker-1"].wait(timeout=60)
        assert stack.processes["worker-1"].returncode == 0 and stack.revive() == {}
    finally:
        stack.stop()
