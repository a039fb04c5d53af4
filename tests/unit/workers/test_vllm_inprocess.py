"""The in-process vLLM engine: a clear error without vLLM; a real run where a model is named."""

import asyncio
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import types
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


# -- against a stand-in for vLLM's AsyncLLM (the API of vllm/v1/engine/async_llm.py) ---------------
class _EngineDeadError(Exception):
    """vLLM's ``EngineDeadError``: its engine core died."""


class _EngineGenerateError(Exception):
    """vLLM's ``EngineGenerateError``: anything else that failed in ``generate``."""


_EngineDeadError.__name__, _EngineGenerateError.__name__ = "EngineDeadError", "EngineGenerateError"


def _output(ids, reason=None, cached=0):
    return types.SimpleNamespace(
        outputs=[types.SimpleNamespace(token_ids=ids, finish_reason=reason)],
        finished=reason is not None, num_cached_tokens=cached)


class _AsyncLLM:
    """What ``generate`` does, by request id, as vLLM's does it: ``RequestOutput`` deltas,
    or one of its exceptions."""

    def __init__(self):
        self.model_config = types.SimpleNamespace(max_model_len=4096)
        self.errored = False  # (True once its engine core died: it stays dead)

    @classmethod
    def from_engine_args(cls, args):
        return cls()

    async def generate(self, prompt, params, request_id):
        await asyncio.sleep(0)
        if request_id == "too-long":  # (input processing: before any output)
            raise ValueError("The decoder prompt (length 5000) is longer than the maximum "
                             "model length of 4096.")
        if request_id == "again":  # (an earlier attempt of the id, not yet aborted)
            raise ValueError(f"Request id {request_id} already running.")
        yield _output([11, 12], cached=32 if request_id == "fine" else 0)
        if request_id == "dead":
            self.errored = True
            raise _EngineDeadError("EngineCore encountered an issue.")
        if request_id == "broken":
            raise _EngineGenerateError()
        if request_id == "kv-load-failed":  # (vLLM's FinishReason.ERROR)
            yield _output([], "error")
            return
        yield _output([13], "length", cached=32)

    def shutdown(self):
        pass


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """``workers.vllm_inprocess`` imported over a stand-in ``vllm`` package; forgotten after."""
    def module(name, **attrs):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))

    module("vllm", SamplingParams=lambda **kw: types.SimpleNamespace(**kw))
    module("vllm.engine")
    module("vllm.engine.arg_utils", AsyncEngineArgs=lambda **kw: types.SimpleNamespace(**kw))
    module("vllm.sampling_params", RequestOutputKind=types.SimpleNamespace(DELTA=1))
    module("vllm.v1")
    module("vllm.v1.engine")
    module("vllm.v1.engine.async_llm", AsyncLLM=_AsyncLLM)
    sys.modules.pop("workers.vllm_inprocess", None)
    yield importlib.import_module("workers.vllm_inprocess")
    sys.modules.pop("workers.vllm_inprocess", None)


def test_a_request_vllm_fails_is_handed_back_refused_or_completed_with_its_cached_tokens(
        stand_in_vllm):
    """``AsyncLLM.generate`` raises ``EngineDeadError``/``EngineGenerateError`` for the engine's
    trouble and ``ValueError`` for a request it refuses: all three were an ``engine_error``
    ("the adapter failed"), never retried elsewhere nor told as the request's; and a
    ``RequestOutput``'s ``num_cached_tokens`` was not read (every Completed said 0)."""
    async def scenario():
        engine = stand_in_vllm.VllmInProcessEngine("m")
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            assert engine.max_model_len == 4096
            for rid in ("fine", "dead", "broken", "too-long", "again", "kv-load-failed"):
                engine.add(EngineRequest(rid, prompt_tokens=64, max_tokens=3), loop.time())
            batches = []
            while sum(b.finished for b in batches) < 6:
                batches += engine.advance(loop.time())
                await asyncio.sleep(0.001)
        finally:
            await engine.close()
        return {b.request_id: b for b in batches if b.finished}

    ends = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert (ends["fine"].finish_reason, ends["fine"].failure) == ("length", None)
    assert ends["fine"].cached_tokens == 32
    assert {ends[rid].failure.kind for rid in ("dead", "broken", "again", "kv-load-failed")} \
        == {"retryable"}
    assert "EngineDeadError" in ends["dead"].failure.detail
    assert ends["too-long"].failure.kind == "invalid_request"
    assert "maximum model length" in ends["too-long"].failure.detail


def test_an_engine_whose_core_died_says_crashed_and_holds_nothing(stand_in_vllm):
    """Once ``AsyncLLM.errored`` says the engine core died, the worker's heartbeat says
    ``crashed`` (the router sends it nothing more and resumes its requests elsewhere), with no
    load the dead engine held; its requests still in flight count as waiting until handed back.
    Before, it said what vLLM's metrics last said (``warm``) for as long as the worker ran."""
    async def scenario():
        engine = stand_in_vllm.VllmInProcessEngine("m")
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            healthy = engine.stats().state
            engine.add(EngineRequest("dead", prompt_tokens=64, max_tokens=3), loop.time())
            finished = []
            while not finished:
                finished += [b for b in engine.advance(loop.time()) if b.finished]
                await asyncio.sleep(0.001)
            engine.add(EngineRequest("later", prompt_tokens=64, max_tokens=3), loop.time())
            return healthy, engine.stats()
        finally:
            await engine.close()

    healthy, dead = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert healthy != "crashed"
    assert dead.state == "crashed"
    assert (dead.running, dead.kv_blocks_used) == (0, 0)
    assert dead.waiting == 1  # ("later", sent after it died, until it is handed back)


def test_its_heartbeat_bills_the_gpus_it_runs_on(stand_in_vllm):
    """Its stats name its tensor parallelism, the degree a heartbeat's ``gpus`` says (before,
    reading its stats at all raised ``AttributeError``: the engine had no ``gpus``)."""
    engine_of = stand_in_vllm.VllmInProcessEngine

    async def scenario():
        engine = engine_of("m", engine_args={"tensor_parallel_size": 2})
        await engine.start()
        try:
            return engine.stats().gpus
        finally:
            await engine.close()

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=30)) == 2
    assert engine_of("m").gpus == 1
    assert engine_of("m", engine_args={"tensor_parallel_size": None}).gpus == 1
    assert engine_of("m", engine_args={"tensor_parallel_size": 2,
                                       "pipeline_parallel_size": 2}).gpus == 2
