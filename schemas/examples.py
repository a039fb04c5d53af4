"""One valid example of every message model: for documentation, tests and producers' smoke checks."""

from schemas import commands, events
from schemas.base import Message
from schemas.config import ConfigSet
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk

T = 1_764_000_000_000  # an event time in epoch milliseconds


def example_request(request_id: str = "req-1") -> InferenceRequest:
    return InferenceRequest(
        event_time_ms=T, created_ms=T, request_id=request_id, task_id="task-1", step=2,
        steps_total=5, tenant="acme", priority=3, model="llama-3-8b", prompt_tokens=40,
        prefix_hashes=[11, 22], block_size=16, max_tokens=64, ttft_slo_s=1.5,
        deadline_ms=T + 30_000,
    )


def examples() -> dict[type[Message], Message]:
    """A valid instance of each model, keyed by model."""
    req = example_request()
    who = dict(event_time_ms=T, request_id=req.request_id, task_id="task-1", tenant="acme")
    made = [
        req,
        CancelRequest(event_time_ms=T, request_id="req-1"),
        Dispatch(event_time_ms=T, request=req, worker_id="worker-3", slot=3, attempt=2,
                 resume_from_token=10),
        ResponseChunk(event_time_ms=T, request_id="req-1", worker_id="worker-3", token_offset=10,
                      tokens=[1, 2, 3], final=True, finish_reason="length"),
        events.Queued(**who, prompt_tokens=40, max_tokens=64, created_ms=T, deadline_ms=T + 1),
        events.Started(**who, worker_id="worker-3"),
        events.FirstToken(**who, worker_id="worker-3", ttft_s=0.25),
        events.Preempted(**who, worker_id="worker-3", tokens_done=5),
        events.Requeued(**who, worker_id="worker-3", tokens_done=7, detail="worker shutting down"),
        events.Completed(**who, worker_id="worker-3", prompt_tokens=40, output_tokens=64, e2e_s=2.0),
        events.Failed(**who, reason="worker_lost", detail="heartbeat missed"),
        events.Rejected(**who, reason="rate_limited", retry_after_s=1.0),
        events.Cancelled(**who, reason="client went away", worker_id="worker-3", attempt=2),
        events.WorkerStatus(event_time_ms=T, worker_id="worker-3", slot=3, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], kv_blocks_used=10,
                            kv_blocks_free=90, running=2, waiting=1, started_ms=T - 5_000,
                            reply_progress=[events.StreamProgress(request_id="req-1",
                                                                  tokens_sent=12)]),
        events.ConfigApplied(event_time_ms=T, key="slo.ttft_slo_s", component="router-0",
                             config_offset=3),
        events.ConfigRejected(event_time_ms=T, key="slo.ttft_slo_s", component="router-0",
                              config_offset=4, reason="slo.ttft_slo_s: Input should be greater than 0"),
        events.KvBlocksStored(event_time_ms=T, worker_id="worker-3", block_size=16,
                              block_hashes=[11, 22], parent_hash=None),
        events.KvBlocksEvicted(event_time_ms=T, worker_id="worker-3", block_hashes=[11]),
        events.KvCacheCleared(event_time_ms=T, worker_id="worker-3"),
        events.SignalSnapshot(event_time_ms=T, scope="pool", key="h100@llama-3-8b", window_s=10,
                              window_end_ms=T, values={"ttft_p99_s": 0.8, "queue_depth": 3}),
        events.DeadLetter(event_time_ms=T, source_topic="governor.requests", partition=0,
                          offset=7, consumer="router-0", reason="undecodable",
                          error="Invalid JSON", key=b"k", raw=b"\xff\x00not json", raw_size=11),
        commands.SetRoutingWeights(event_time_ms=T, command_id="c1", weights={"h100@llama-3-8b": 0.7}),
        commands.SetAdmissionLimits(event_time_ms=T, command_id="c2", limits={
            "acme": commands.TenantLimit(requests_per_s=10, tokens_per_s=50_000)}),
        commands.SetLoadShedLevel(event_time_ms=T, command_id="c3", min_value=0.5),
        commands.SetBreakerState(event_time_ms=T, command_id="c4", worker_id="worker-3",
                                 state="open", reason="p99 TTFT 8x its pool's"),
        commands.SetRetryBudget(event_time_ms=T, command_id="c5", ratio=0.1),
        commands.ScalePool(event_time_ms=T, command_id="c6", pool="h100@llama-3-8b",
                           gpu_type="h100", model="llama-3-8b", replicas=4),
        commands.DrainWorker(event_time_ms=T, command_id="c7", worker_id="worker-3"),
        commands.LoadModel(event_time_ms=T, command_id="c8", worker_id="worker-3", model="llama-3-70b"),
        commands.SleepWorker(event_time_ms=T, command_id="c9", worker_id="worker-3", level=1),
        commands.InjectFault(event_time_ms=T, command_id="c10", worker_id="worker-3", fault="slow",
                             factor=4.0),
        ConfigSet(event_time_ms=T, key="slo.ttft_slo_s", value=1.0),
    ]
    return {type(m): m for m in made}
