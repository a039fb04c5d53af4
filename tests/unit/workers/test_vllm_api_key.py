"""A vLLM server started with ``--api-key`` (or ``VLLM_API_KEY``) answers 401 on every ``/v1``
route without ``Authorization: Bearer KEY`` and leaves ``/metrics`` and ``/version`` open
(``AuthenticationMiddleware``, ``vllm/entrypoints/serve/middleware/authenticate.py``; its body
``{"error": "Unauthorized"}``). Here, a stand-in for such a server."""

import asyncio
import contextlib
import json

import pytest
from aiohttp import web
from typer.testing import CliRunner

from infra.cli import app
from schemas.errors import TerminalError
from workers.engine import EngineRequest
from workers.factory import build_engine
from workers.vllm_engine import VllmHttpEngine
from tests.http_stand_ins import serving

KEY = "sk-governor-test"
METRICS = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n'
           '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n')


@contextlib.asynccontextmanager
async def _guarded_server():
    """A server that wants ``KEY`` on ``/v1``: its URL."""
    @web.middleware
    async def authenticate(request, handler):
        if request.path.startswith("/v1") and \
                request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def models(request):
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def completions(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "text": " a", "token_ids": [7],
                              "finish_reason": "length"}]}
        await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def scrape(request):
        return web.Response(text=METRICS)

    app = web.Application(middlewares=[authenticate])
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions),
                    web.get("/metrics", scrape)])
    async with serving(app) as url:
        yield url


def test_a_server_that_wants_an_api_key_is_refused_at_once_not_waited_for():
    """Before, a 401 was waited on as a server still loading its model (600 s by default), then
    reported as ``no vLLM server answers``."""
    async def scenario():
        async with _guarded_server() as url:
            engine = VllmHttpEngine(url, connect_timeout_s=5)
            started = asyncio.get_running_loop().time()
            with pytest.raises(TerminalError) as refused:
                await engine.start()
            return asyncio.get_running_loop().time() - started, str(refused.value)

    waited, said = asyncio.run(scenario())
    assert waited < 2
    assert "HTTP 401" in said and "Unauthorized" in said and "VLLM_API_KEY" in said


def test_the_api_key_goes_with_every_request():
    async def scenario():
        async with _guarded_server() as url:
            engine = VllmHttpEngine(url, api_key=KEY, connect_timeout_s=5)
            await engine.start()
            try:
                loop = asyncio.get_running_loop()
                engine.add(EngineRequest("k-1", prompt_tokens=8, max_tokens=1), loop.time())
                batches = []
                while not any(b.finished for b in batches):
                    batches += engine.advance(loop.time())
                    await asyncio.sleep(0.005)  # a worker's poll interval
                return engine.model, batches[-1]
            finally:
                await engine.close()

    model, last = asyncio.run(scenario())
    assert model == "m"
    assert (last.tokens, last.finish_reason, last.failure) == ((7,), "length", None)


def test_a_worker_takes_its_server_s_key_from_vllm_api_key(monkeypatch):
    """``governor worker --engine vllm`` reads ``VLLM_API_KEY``, the variable ``vllm serve``
    reads its own key from."""
    seen = {}
    monkeypatch.setattr("workers.factory.build_engine",
                        lambda kind, **options: seen.update(options) or 1 / 0)
    monkeypatch.setattr("infra.cli._serve_metrics", lambda port: None)  # (no port, no broker)
    monkeypatch.setattr("infra.cli._with_topics", lambda bootstrap, catalog: bootstrap)
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    CliRunner().invoke(app, ["worker", "--slot", "0", "--engine", "vllm", "--vllm-url", "http://h:8000"])
    assert seen["vllm_api_key"] == KEY
    assert build_engine("vllm", vllm_url="http://h:8000", vllm_api_key=KEY).api_key == KEY
    assert build_engine("vllm", vllm_url="http://h:8000").api_key is None
