"""The in-process vLLM engine: a clear error without vLLM; a real run where a model is named."""

import asyncio
import importlib
import importlib.util
import os

import pytest

from workers.engine import EngineRequest


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_importing_it_without_vllm_says_what_to_install():
    with pytest.raises(ImportError, match=r"governor\[vllm\]"):
        importlib.import_module("workers.vllm_inprocess")


def test_nothing_imports_it_unless_asked():
    import sys

    import workers.factory  # noqa: F401
    import workers.vllm_engine  # noqa: F401

    assert "workers.vllm_inprocess" not in sys.modules or importlib.util.find_spec("vllm")


def test_streams_a_request_on_a_gpu():
    pytest.importorskip("vllm")
    model = os.environ.get("GOVERNOR_VLLM_TEST_MODEL")
    if not model:
        pytest.skip("set GOVERNOR_VLLM_TEST_MODEL to a local model to run vLLM in-process")
    from workers.vllm_inprocess import VllmInProcessEngine

    async def scenario():
        engine = VllmInProcessEngine(model, engine_args={"gpu_memory_utilization": 0.5,
                                                         "enforce_eager": True})
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            engine.add(EngineRequest("gpu-1", prompt_tokens=64, max_tokens=16), loop.time())
            batches = []
            while not any(b.finished for b in batches):
                batches += engine.advance(loop.time())
                await asyncio.sleep(0.01)
        finally:
            await engine.close()
        assert sum(b.count for b in batches) == 16 and batches[0].first
        assert batches[-1].finish_reason == "length"

    asyncio.run(asyncio.wait_for(scenario(), timeout=600))
