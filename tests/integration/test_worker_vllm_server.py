"""A worker on the vLLM adapter whose server dies: the request it runs, and one dispatched to it
after, are handed back (``Requeued``, to continue elsewhere), not failed, and it says
``crashed`` at once; one whose server sends what vLLM would not serves on; one that cannot start
closes its engine. A real worker (in this process) on a real broker, against a sim-server
subprocess that is SIGKILLed or an OpenAI-compatible server of the test's own; the test plays
the router."""

import asyncio
import contextlib
import json

import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError
from sim_server_support import MODEL, sim_server

from infra.bus import Outbox, TypedConsumer, make_producer, now_ms
from schemas.events import RequestEvent, WorkerStatus
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from workers.metrics import EngineMetrics
from workers.service import WorkerIdentity, WorkerService
from workers.vllm_engine import VllmHttpEngine
from tests.http_stand_ins import serving

pytestmark = pytest.mark.integration

ME = WorkerIdentity(0, "worker-0", f"h100@{MODEL}", "h100", MODEL)


def _dispatch(request_id: str, max_tokens: int) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id,
                               prompt_tokens=128, max_tokens=max_tokens, model=MODEL)
    return Dispatch(event_time_ms=t, request=request, worker_id=ME.worker_id, slot=ME.slot)


class _Router:
    """The test's side of the bus: dispatches sent to the worker's slot, its telemetry read."""

    def __init__(self, bootstrap, catalog) -> None:
        self.catalog = catalog
        self.producer = make_producer(bootstrap)
        self.outbox = Outbox(self.producer)
        self.consumer = AIOKafkaConsumer(catalog.telemetry, bootstrap_servers=bootstrap,
                                         auto_offset_reset="earliest")
        self.typed = TypedConsumer(self.consumer, catalog, self.producer, "vllm-server-test")
        self.seen: list = []

    async def start(self) -> None:
        await self.producer.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def send(self, dispatch: Dispatch) -> None:
        self.outbox.emit(self.catalog.dispatch, dispatch, dispatch.request.request_id,
                         partition=ME.slot)
        await self.outbox.flush()

    async def until(self, condition, timeout_s=30) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.seen.extend(i.message for i in await self.typed.fetch(200))

    def event(self, request_id, *kinds):
        return next((m for m in self.seen if isinstance(m, RequestEvent)
                     and m.request_id == request_id and m.type in kinds), None)


@contextlib.asynccontextmanager
async def _worker_and_router(bootstrap, catalog, url, **options):
    """A worker on slot 0 on the vLLM adapter at ``url``, running; stopped after."""
    router = _Router(bootstrap, catalog)
    await router.start()
    stop = asyncio.Event()
    worker = WorkerService(bootstrap, catalog, ME, VllmHttpEngine(url), **options)
    running = asyncio.create_task(worker.run(stop))
    try:
        yield router, running
    finally:
        stop.set()
        try:
            await asyncio.wait_for(running, 30)
        finally:
            await router.stop()


async def _scenario(bootstrap, catalog, url, server) -> list:
    # (no heartbeat is due within the test: the state it tells, it tells as it changes)
    async with _worker_and_router(bootstrap, catalog, url, status_interval_s=600) as (router, _):
        event = router.event
        await router.send(_dispatch("cut", 20_000))  # minutes of tokens at speedup 1
        await router.until(lambda: event("cut", "first_token"))  # its first chunk flushed with it
        server.kill()
        server.wait()
        await router.until(lambda: event("cut", "requeued", "failed"))
        await router.send(_dispatch("after", 10))
        await router.until(lambda: event("after", "requeued", "failed"))
        await router.until(lambda: any(isinstance(m, WorkerStatus) and m.state == "crashed"
                                       for m in router.seen))
    return router.seen


def test_a_worker_hands_back_what_its_dead_server_held_and_what_came_after(
        kafka_bootstrap, catalog):
    with sim_server(speedup=1) as (url, server):
        seen = asyncio.run(_scenario(kafka_bootstrap, catalog, url, server))
    events = [m for m in seen if isinstance(m, RequestEvent)]

    def kinds(request_id):
        return [m.type for m in events if m.request_id == request_id]

    assert kinds("cut") == ["started", "first_token", "requeued"]
    assert kinds("after") == ["started", "requeued"]
    cut = next(m for m in events if m.request_id == "cut" and m.type == "requeued")
    assert cut.tokens_done >= 1 and cut.attempt == 1  # continued from the tokens it sent
    assert "the engine's server" in cut.detail
    assert cut.engine_failed  # (its breaker counts it)


#: What the test's server streams, by request id: events of one token each, and the last.
_STREAMS = {
    "filtered": [{"choices": [{"text": "a", "token_ids": [5], "finish_reason": "content_filter"}]}],
    "aborted": [{"choices": [{"text": "a", "token_ids": [6], "finish_reason": "abort"}]}],
    "bad-ids": [{"choices": [{"text": "ab", "token_ids": [-1, 2**40], "finish_reason": None}]}],
    "overlong": [{"choices": [{"text": "a", "finish_reason": "length"}],
                  "usage": {"completion_tokens": 10**9}}],
    "fine": [{"choices": [{"text": "a", "token_ids": [7 + i],
                           "finish_reason": "length" if i == 3 else None}]} for i in range(4)],
}


#: What the test's server answers instead, by request id: an HTTP status and body.
_TOO_LONG = ("This model's maximum context length is 8192 tokens. However, you requested 9000 "
             "tokens (8990 in the messages, 10 in the completion).")
_REFUSALS = {
    "too-long": (400, {"object": "error", "message": _TOO_LONG, "type": "BadRequestError",
                       "param": None, "code": 400}),
    "too-big": (413, "Maximum request body size 1048576 exceeded."),
    "overloaded": (503, {"error": {"message": "the engine is overloaded", "code": 503}}),
}


@contextlib.asynccontextmanager
async def _other_server(streams: dict, refusals: dict | None = None):
    """An OpenAI-compatible server that is not vLLM, on any free port: its URL. It streams
    ``streams[request id]``, or answers ``refusals[request id]``."""
    metrics = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n'
               '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n')

    async def models(request):
        return web.json_response({"data": [{"id": MODEL}]})

    async def scrape(request):
        return web.Response(text=metrics)

    async def completions(request):
        refusal = (refusals or {}).get(request.headers["X-Request-Id"])
        if refusal is not None:
            status, body = refusal
            return (web.json_response(body, status=status) if isinstance(body, dict)
                    else web.Response(text=body, status=status))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in streams[request.headers["X-Request-Id"]]:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.get("/metrics", scrape),
                    web.post("/v1/completions", completions)])
    async with serving(app) as url:
        yield url


async def _other_scenario(bootstrap, catalog) -> tuple[list, bool]:
    async with _other_server(_STREAMS) as url, \
            _worker_and_router(bootstrap, catalog, url) as (router, running):
        for rid in _STREAMS:
            await router.send(_dispatch(rid, 8 if rid == "overlong" else 4))
        await router.until(lambda: all(router.event(rid, "completed", "failed", "requeued")
                                       for rid in _STREAMS) or running.done())
        serving = not running.done()
    return router.seen, serving


def test_a_worker_serves_on_past_what_another_server_sends_and_vllm_would_not(
        kafka_bootstrap, catalog):
    """A finish reason vLLM does not have (``content_filter``), token ids that are none, a
    count of tokens past ``max_tokens``: the request ends as its server's error (or complete,
    at ``max_tokens``), and the worker serves on (each failed a chunk's or an event's schema
    and stopped it, and then the next worker on the slot). A request the server aborts is
    handed back."""
    seen, serving = asyncio.run(_other_scenario(kafka_bootstrap, catalog))
    assert serving
    ended = {m.request_id: m for m in seen if isinstance(m, RequestEvent)
             and m.type in ("completed", "failed", "requeued")}
    assert ended["filtered"].reason == "engine_error"
    assert "'content_filter'" in ended["filtered"].detail
    assert ended["aborted"].type == "requeued" and "aborted" in ended["aborted"].detail
    assert ended["bad-ids"].reason == "engine_error"
    assert "invalid token ids" in ended["bad-ids"].detail
    assert ended["overlong"].type == "completed" and ended["overlong"].output_tokens == 8
    assert ended["fine"].type == "completed" and ended["fine"].output_tokens == 4


async def _refused_scenario(bootstrap, catalog) -> list:
    async with _other_server(_STREAMS, _REFUSALS) as url, \
            _worker_and_router(bootstrap, catalog, url) as (router, _):
        for rid in [*_REFUSALS, "fine"]:
            await router.send(_dispatch(rid, 4))
        await router.until(lambda: all(router.event(rid, "completed", "failed", "requeued")
                                       for rid in [*_REFUSALS, "fine"]))
        ended_ms = max(m.event_time_ms for m in router.seen if isinstance(m, RequestEvent))
        await router.until(lambda: any(isinstance(m, WorkerStatus) and m.event_time_ms > ended_ms
                                       for m in router.seen))
    return router.seen


def test_a_request_its_server_refuses_fails_as_invalid_with_the_servers_message(
        kafka_bootstrap, catalog):
    """A 4xx is the request's refusal (its prompt longer than the model's context), not the
    engine's failure: ``invalid_request`` with what the server said, which no breaker counts
    against the worker (as ``engine_error``, the old "engine finished the stream with 'error'",
    one tenant's oversized prompts could open the breakers of healthy workers). A 503 is the
    server's trouble: handed back."""
    seen = asyncio.run(_refused_scenario(kafka_bootstrap, catalog))
    ended = {m.request_id: m for m in seen if isinstance(m, RequestEvent)
             and m.type in ("completed", "failed", "requeued")}
    too_long, too_big = ended["too-long"], ended["too-big"]
    assert (too_long.type, too_long.reason) == ("failed", "invalid_request")
    assert (too_long.worker_id, too_long.attempt) == ("worker-0", 1)  # (the attempt it ends)
    assert too_long.detail == f"HTTP 400 from the engine's server: {_TOO_LONG}"
    assert (too_big.type, too_big.reason) == ("failed", "invalid_request")
    assert too_big.detail == f"HTTP 413 from the engine's server: {_REFUSALS['too-big'][1]}"
    assert ended["overloaded"].type == "requeued" and ended["overloaded"].engine_failed
    assert ended["overloaded"].detail == "HTTP 503 from the engine's server: the engine is overloaded"
    assert ended["fine"].type == "completed"


def test_a_workers_heartbeat_counts_the_requests_that_completed_only(kafka_bootstrap, catalog):
    """``requests_completed`` counted the failed requests too."""
    seen = asyncio.run(_refused_scenario(kafka_bootstrap, catalog))
    completed = [m for m in seen if isinstance(m, RequestEvent) and m.type == "completed"]
    failed = [m for m in seen if isinstance(m, RequestEvent) and m.type == "failed"]
    assert len(completed) == 1 and len(failed) == 2
    last = max((m for m in seen if isinstance(m, WorkerStatus)), key=lambda m: m.event_time_ms)
    assert last.requests_completed == len(completed)


def test_a_worker_that_cannot_start_closes_its_engine():
    """No broker answers: the worker's start fails, and the vLLM adapter it had started is
    closed (its HTTP session and scrapes ran on, unseen)."""
    from schemas.topics import TopicCatalog

    async def scenario():
        async with _other_server(_STREAMS) as url:
            engine = VllmHttpEngine(url)
            worker = WorkerService("127.0.0.1:1", TopicCatalog("nobroker"), ME, engine)
            with pytest.raises(Exception) as raised:
                await worker.run(asyncio.Event())
            return engine, raised.value

    engine, error = asyncio.run(scenario())
    assert isinstance(error, KafkaConnectionError)  # (the broker's, not the engine's)
    assert engine._session is None and engine._scrape_task.done()



MASS, SEQS = 200, 32  # requests cancelled at once; the server's running batch holds SEQS of them
#: The longest the worker may say it runs what it no longer does: its engine's scrape interval
#: (0.5 s), a scrape in flight as the cancellations came, and room for a loaded machine.
STALE_AT_MOST_S = 2.0


async def _mass_cancel_scenario(bootstrap, catalog, url, metrics) -> dict:
    """MASS long requests on a worker whose server runs SEQS at a time, all cancelled at once;
    what the worker says of its load before and after (its heartbeats, its vLLM gauges)."""
    async with _worker_and_router(bootstrap, catalog, url, status_interval_s=0.1,
                                  metrics=metrics) as (router, _):
        rids = [f"mass-{i}" for i in range(MASS)]
        for rid in rids:
            await router.send(_dispatch(rid, 20_000))  # minutes of tokens at speedup 1

        def statuses():
            return [m for m in router.seen if isinstance(m, WorkerStatus)]

        def gauges():
            return (metrics.running.labels(MODEL)._value.get(),
                    metrics.waiting.labels(MODEL)._value.get())

        def idle(status) -> bool:
            return (status.running, status.waiting, status.kv_blocks_used) == (0, 0, 0)

        await router.until(lambda: (s := statuses()) and (s[-1].running, s[-1].waiting)
                           == (SEQS, MASS - SEQS))
        loaded = gauges()
        for rid in rids:
            router.outbox.emit(catalog.dispatch, CancelRequest(event_time_ms=now_ms(),
                                                               request_id=rid),
                               rid, partition=ME.slot)
        await router.outbox.flush()
        await router.until(lambda: all(router.event(rid, "cancelled") for rid in rids))
        last_cancel_ms = max(router.event(rid, "cancelled").event_time_ms for rid in rids)

        def after():
            return [s for s in statuses() if s.event_time_ms > last_cancel_ms]

        await router.until(lambda: any(idle(s) for s in after()) and gauges() == (0, 0))
        first_idle = next(s for s in after() if idle(s))
        return {"loaded": loaded, "stale_s": (first_idle.event_time_ms - last_cancel_ms) / 1000,
                "said_after": [(s.running, s.waiting) for s in after()]}


def test_a_worker_whose_requests_are_all_cancelled_says_it_runs_none(kafka_bootstrap, catalog):
    """Its heartbeats and its exported ``vllm:num_requests_running``/``waiting`` (read from its
    server's) come back to 0 within its scrape interval of the last cancellation, and stay."""
    metrics = EngineMetrics(MODEL)
    with sim_server(1, "--max-num-seqs", str(SEQS)) as (url, _server):
        seen = asyncio.run(_mass_cancel_scenario(kafka_bootstrap, catalog, url, metrics))
    assert seen["loaded"] == (SEQS, MASS - SEQS)
    assert seen["stale_s"] <= STALE_AT_MOST_S, seen
    assert seen["said_after"][-1] == (0, 0), seen
