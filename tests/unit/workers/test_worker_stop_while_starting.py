"""A worker told to stop while its engine starts (the vLLM adapter waits up to 600 s for its
server, which refuses connections until its model is loaded) stops then, its engine closed,
and reaches for no broker."""

import asyncio
import socket

from schemas.topics import TopicCatalog
from workers.service import WorkerIdentity, WorkerService
from workers.vllm_engine import VllmHttpEngine

ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _closed_port() -> int:
    """A port nothing listens on (a server not up yet: connections refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_stop_while_the_engine_waits_for_its_server_stops_the_worker_then():
    """Before, a SIGTERM (or Ctrl-C) was not heard until the server answered or the wait ran
    out: up to 600 s by default (``governor up``'s stop killed such a worker after its timeouts,
    as one that does not exit on SIGTERM)."""
    async def scenario():
        engine = VllmHttpEngine(f"http://127.0.0.1:{_closed_port()}", connect_timeout_s=30)
        worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, stop.set)
        started = loop.time()
        async with asyncio.timeout(10):
            await worker.run(stop)
        return loop.time() - started, engine

    took_s, engine = asyncio.run(scenario())
    assert took_s < 3, f"stopped {took_s:.1f} s after it began, 0.3 s after the stop"
    assert engine._session is None  # closed
