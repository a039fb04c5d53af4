"""A vLLM server may list several models in ``/v1/models``: its ``--served-model-name`` given
more than one name, or LoRA adapters (``--lora-modules``), each listed beside the base model.
The worker serves the one its ``--model`` names; a server of one model, whatever its name (a
fleet's ``h100@llama-3-8b`` served by ``meta-llama/Meta-Llama-3-8B``). Here, a stand-in for
such a server."""

import asyncio
import contextlib

import pytest
from aiohttp import web

from schemas.errors import TerminalError
from tests.http_stand_ins import serving
from workers.engine import EngineRequest
from workers.factory import build_engine

METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


@contextlib.asynccontextmanager
async def _server(served: list[str], asked: list[str]):
    """A server listing ``served``, noting the model each completion asks for in ``asked``."""
    async def models(request):
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "max_model_len": 4096} for name in served]})

    async def completions(request):
        asked.append((await request.json())["model"])
        return web.json_response({"error": {"message": "not here", "code": 400}}, status=400)

    async def scrape(request):
        return web.Response(text=METRICS)

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions),
                    web.get("/metrics", scrape)])
    async with serving(app) as url:
        yield url


def _served(served: list[str], model: str) -> str:
    """The model a worker of ``--model model`` serves, as its completions ask the server."""
    async def scenario():
        asked: list[str] = []
        async with _server(served, asked) as url:
            engine = build_engine("vllm", model=model, vllm_url=url)
            await engine.start()
            try:
                engine.add(EngineRequest("r", prompt_tokens=8, max_tokens=1), 0.0)
                async with asyncio.timeout(10):
                    while not any(b.finished for b in engine.advance(0.0)):
                        await asyncio.sleep(0.01)
            finally:
                await engine.close()
        return asked[0]
    return asyncio.run(scenario())


def test_a_server_of_several_models_serves_the_one_the_worker_names():
    """Before, such a worker could not start: ``serves [...]; name the model to use``, though
    its ``--model`` named one (the worker never gave it to its engine)."""
    base, adapter = "meta-llama/Llama-3.1-8B-Instruct", "sql-lora"
    assert _served([base, adapter], adapter) == adapter
    assert _served([base, adapter], base) == base


def test_a_server_of_one_model_serves_it_under_the_worker_s_name():
    assert _served(["meta-llama/Meta-Llama-3-8B"], "llama-3-8b") == "meta-llama/Meta-Llama-3-8B"


def test_a_server_of_several_models_none_of_them_the_worker_s_is_refused_naming_them():
    async def scenario():
        async with _server(["a", "b"], []) as url:
            await build_engine("vllm", model="llama-3-8b", vllm_url=url).start()

    with pytest.raises(TerminalError, match=r"serves \['a', 'b'\], not llama-3-8b.*--model"):
        asyncio.run(scenario())
