"""An engine over vLLM's ``AsyncLLM`` (the V1 engine) inside the worker's own process.

Needs the ``vllm`` package and a GPU: ``pip install 'governor[vllm]'`` on a GPU host. It is written
against the ``AsyncLLM`` API that vLLM has kept since 0.8 (``AsyncLLM.from_engine_args``,
``generate(prompt, sampling_params, request_id)`` yielding ``RequestOutput`` deltas with
``RequestOutputKind.DELTA``, cancellation of ``generate`` aborting the request, ``errored``
(where a release has it say so: its first V1 releases said False always), ``shutdown``) and has
not been run where it was written (no GPU, no vLLM there); ``tests/unit/workers/test_vllm_inprocess.py``
runs it where ``GOVERNOR_VLLM_TEST_MODEL`` names a model, and elsewhere over a stand-in for
``AsyncLLM`` (its outputs and exceptions: ``generate_failure`` says what each means).

Nothing in Governor imports this module unless asked; importing it without vLLM raises an
``ImportError`` that says what to install. Prompts and continuations are placeholders as in
``workers.vllm_engine``; load comes from the vLLM metrics this process registers with
prometheus-client's default registry, read through ``VLLM_METRICS``.
"""

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, generate_latest

try:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
except ImportError as exc:  # pragma: no cover - depends on the host
    raise ImportError("workers.vllm_inprocess needs vLLM and a GPU: "
                      "pip install 'governor[vllm]' on a GPU host") from exc

from workers.engine import EngineFailure, EngineStats
from workers.vllm_engine import (
    StreamingEngine, _dead, _Stream, is_server_trouble, prompt_token_ids, stats_from_text,
)

logger = logging.getLogger(__name__)


class VllmInProcessEngine(StreamingEngine):
    def __init__(self, model: str, *, engine_args: Mapping[str, Any] | None = None,
                 stats_interval_s: float = 0.5, poll_s: float = 0.005) -> None:
        """``engine_args``: more ``AsyncEngineArgs`` fields, by vLLM's names
        (``max_num_seqs``, ``gpu_memory_utilization``, ``tensor_parallel_size`` ...)."""
        super().__init__(poll_s=poll_s)
        self.model = model
        self.engine_args = dict(engine_args or {})
        # its tensor parallelism, as a heartbeat's ``gpus`` says it (the router predicts its
        # TTFT at that degree; vLLM's default 1); before 7 Dec not set at all, and its first
        # heartbeat's stats raised AttributeError
        self.gpus = int(self.engine_args.get("tensor_parallel_size") or 1)
        self.stats_interval_s = stats_interval_s
        self.llm: AsyncLLM | None = None
        self._stats = EngineStats(running=0, waiting=0, state="loading")
        self._stats_task: asyncio.Task | None = None

    async def start(self) -> None:
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **self.engine_args))
        self.max_model_len = getattr(getattr(self.llm, "model_config", None), "max_model_len", None)
        self._stats_task = asyncio.create_task(self._refresh_stats(), name="vllm-stats")

    async def close(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            await asyncio.gather(self._stats_task, return_exceptions=True)
        await self._cancel_streams()
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    def _ready(self) -> None:
        if self.llm is None:
            raise RuntimeError("await engine.start() before adding requests")

    def stats(self) -> EngineStats:
        """The load vLLM's metrics last said; ``crashed`` once ``AsyncLLM.errored`` says its
        engine core died (it does not come back: every request sent there fails, and before 7
        Dec the worker went on saying ``warm``, so the router kept sending them there)."""
        if self.llm is not None and self.llm.errored:
            return self._in_flight_stats(_dead(self._stats))
        return self._in_flight_stats(self._stats)

    async def _refresh_stats(self) -> None:
        while True:
            try:
                self._stats = stats_from_text(generate_latest(REGISTRY).decode())
            except Exception:  # read on (the loop ended unseen, and the worker said "loading"
                logger.exception("reading vLLM's metrics failed")  # for good)
            await asyncio.sleep(self.stats_interval_s)

    async def _run(self, stream: _Stream) -> None:
        req = stream.request
        params = SamplingParams(max_tokens=req.max_tokens - req.resume_from_token, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        prompt = {"prompt_token_ids": prompt_token_ids(req)}
        try:
            async for output in self.llm.generate(prompt, params, req.request_id):
                completion = output.outputs[0]
                ids = list(completion.token_ids)
                stream.receive(ids, len(ids))
                cached = getattr(output, "num_cached_tokens", None)  # (vLLM's usage says it)
                if type(cached) is int and cached >= 0:
                    stream.cached = cached
                if output.finished:
                    stream.finish(completion.finish_reason)
        except Exception as exc:  # (a CancelledError, the worker's abort, goes on up)
            stream.finish("error", generate_failure(exc))


def generate_failure(exc: Exception) -> EngineFailure:
    """What an exception from ``AsyncLLM.generate`` means for its request
    (``vllm/v1/engine/async_llm.py``, 0.8 on): ``EngineDeadError`` (its engine core died) and
    ``EngineGenerateError`` (whatever else failed in it) are the engine's trouble, retryable
    elsewhere; a ``ValueError`` (``VLLMValidationError`` is one: a prompt past
    ``max_model_len``, ids out of the vocabulary) or a ``VLLMClientError`` is the request's
    refusal (but "Request id ... already running": an earlier attempt of the same id not yet
    aborted there, retryable), as the HTTP server answers 400. (All of it was an ``engine_error``, "the adapter
    failed", which the worker's breaker counts and no other worker retries.) By class name,
    so that no vLLM release's module layout is assumed."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    said = f"{type(exc).__name__}: {exc}"[:1_000]
    if names & {"EngineDeadError", "EngineGenerateError"} or is_server_trouble(str(exc)):
        return EngineFailure("retryable", f"vLLM's engine: {said}")
    if isinstance(exc, ValueError) or "VLLMClientError" in names:
        return EngineFailure("invalid_request", f"vLLM refused the request: {said}")
    return EngineFailure("engine_error", f"vLLM's engine: {said}")
