"""A worker paused (SIGSTOP: a frozen VM, a debugger, a swapped-out process) past the routers'
heartbeat timeout, whose request the router continued elsewhere meanwhile, reads the supersede
the router left on its slot before its engine moves on: it hands the request back rather than
complete it a second time.

Before, resumed, it stepped its engine over the whole pause first (a real server went on
generating while it slept), completed the request and sent its ``Completed``: a second terminal
event of one request, its tokens counted again wherever the first was forgotten (the streams
forget an ended request 300 s after its end). A real worker process on a real broker; the test
plays the router."""

import asyncio
import os
import signal
import time

import pytest

from infra.bus import Outbox, make_producer, now_ms
from schemas.requests import CancelRequest
from test_worker_handback import _dispatch, _on_one_worker, _Telemetry

pytestmark = pytest.mark.integration

#: The request's length: about 5.7 s of decode at 4x, the time the test has to pause the
#: worker once it reads the first token (900 tokens left it 1.7 s: a test or broker stalled
#: that long by a loaded machine paused a worker that had completed the request already).
MAX_TOKENS = 3_000
#: Longer than the routers' heartbeat timeout (3 s by default) and than what the request has
#: left to run (under 5.7 s).
PAUSE_S = 9.0
#: When the router supersedes it: after its heartbeat timeout.
SUPERSEDE_AFTER_S = 3.5


async def _scenario(bootstrap, catalog, stack) -> list:
    producer = make_producer(bootstrap)
    await producer.start()
    outbox = Outbox(producer)
    watch = _Telemetry(bootstrap, catalog, producer)
    await watch.consumer.start()
    first = lambda kind: next(iter(watch.events("r", kind, 1)), None)  # noqa: E731
    try:
        outbox.emit(catalog.dispatch, _dispatch("r", max_tokens=MAX_TOKENS), "r", partition=0)
        await outbox.flush()
        await watch.until(lambda: first("first_token"))
        pid = stack.processes["worker-0"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            # The router, hearing nothing for its heartbeat timeout, continues the request
            # elsewhere and supersedes it here (by then the worker's last fetch request has
            # been answered: its next one goes out only once it runs again)
            await asyncio.sleep(SUPERSEDE_AFTER_S)  # the router's timeline, not a wait on it
            outbox.emit(catalog.dispatch, CancelRequest(
                event_time_ms=now_ms(), request_id="r", attempt=1,
                reason="superseded: its worker went silent"), "r", partition=0)
            await outbox.flush()
            await asyncio.sleep(max(0.0, paused_at + PAUSE_S - time.monotonic()))  # the pause
        finally:
            os.kill(pid, signal.SIGCONT)
        await watch.until(lambda: first("completed") or first("requeued"))
    finally:
        await watch.consumer.stop()
        await producer.stop()
    return watch.seen


def test_a_worker_paused_past_the_heartbeat_timeout_does_not_complete_what_was_moved(
        kafka_bootstrap, catalog, tmp_path):
    seen = _on_one_worker(kafka_bootstrap, catalog, tmp_path, _scenario, started=True)
    ends = [(m.type, m.attempt) for m in seen if getattr(m, "request_id", None) == "r"
            and m.type in ("completed", "requeued", "failed", "cancelled")]
    assert ends == [("requeued", 1)]
