"""The worker's vLLM-named Prometheus metrics, read off what it streams (no broker: its handler of
the engine's tokens)."""

from infra.bus import Outbox, now_ms
from schemas.requests import Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from workers.engine import TokenBatch
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService, _Running

ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def test_a_continuation_resumed_after_its_first_token_is_no_new_ttft() -> None:
    """A continuation of a request whose first token a lost worker had streamed (resumed from
    token 18) had its first token here counted as a TTFT, measured from the request's creation:
    a run with one worker killed showed 3.656 s in the next worker's
    ``vllm:time_to_first_token_seconds`` for a request whose client had its first token after
    0.228 s. One resumed from token 0 (lost before any token) is the client's first token."""
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=100))
    worker.outbox = Outbox(producer=None)
    created = now_ms() - 3_000
    for n, resume in enumerate((0, 18)):
        req = InferenceRequest(event_time_ms=created, created_ms=created, request_id=f"r{n}",
                               prompt_tokens=256, max_tokens=32)
        worker._running[req.request_id] = _Running(Dispatch(
            event_time_ms=created, request=req, worker_id=ME.worker_id, slot=ME.slot,
            router_id="router-0", attempt=2, resume_from_token=resume), n, resume)
        worker._on_tokens(TokenBatch(request_id=req.request_id, token_offset=resume,
                                     tokens=(1, 2), first=True, finished=False))
    value = worker.metrics.registry.get_sample_value
    labels = {"model_name": "llama-3-8b"}
    assert value("vllm:time_to_first_token_seconds_count", labels) == 1
    assert value("vllm:time_to_first_token_seconds_sum", labels) >= 3.0
    assert value("vllm:generation_tokens_total", labels) == 4
