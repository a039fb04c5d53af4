"""A stand-in HTTP server for the tests of vLLM's clients: an aiohttp app on a free port."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from workers.engine import Engine, EngineRequest, TokenBatch


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 at a free port, as long as the block runs: its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


#: What a stand-in vLLM server's ``/metrics`` say unless told otherwise: it holds no request.
IDLE_METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


def vllm_app(completions: Callable[[web.Request], Awaitable[web.StreamResponse]],
             metrics: Callable[[], str] = lambda: IDLE_METRICS) -> web.Application:
    """A stand-in vLLM server of one model, ``m``: ``completions`` answers
    ``POST /v1/completions``, ``GET /metrics`` serves what ``metrics()`` gives."""
    async def models(request):
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def scrape(request):
        return web.Response(text=metrics())

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions),
                    web.get("/metrics", scrape)])
    return app


async def finished_batches(engine: Engine, request: EngineRequest) -> list[TokenBatch]:
    """``request`` added to a started ``engine`` and advanced until it finishes (10 s at
    most): its batches."""
    engine.add(request, 0.0)
    batches: list[TokenBatch] = []
    async with asyncio.timeout(10):
        while not (batches and batches[-1].finished):
            await asyncio.sleep(0.01)
            batches += engine.advance(0.0)
    return batches
