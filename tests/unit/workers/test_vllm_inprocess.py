"""The in-process vLLM engine: a clear error without vLLM; a real run where a model is named."""

import asyncio
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.engine import EngineRequest


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_importing_it_without_vllm_says_what_to_install():
    with pytest.raises(ImportError, match=r"governor\[vllm\]"):
        importlib.import_module("workers.vllm_inprocess")


def test_nothing_imports_it_unless_asked():
    """In a fresh interpreter, importing the engine factory and the HTTP vLLM engine does not
    so much as try to import the in-process one (a tried import is recorded even where it
    fails for want of vLLM and the failure is caught)."""
    probe = textwrap.dedent("""
        import sys
        tried = []
        class Recorder:
            def find_spec(self, name, path=None, target=None):
                tried.append(name)
                return None
        sys.meta_path.insert(0, Recorder())
        import workers.factory, workers.vllm_engine
        print("workers.vllm_inprocess" in tried, "workers.vllm_engine" in tried)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]  # (the recorder sees the imports it should)


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
