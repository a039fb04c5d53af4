"""One valid example of every message model, shared by the schema tests (see conftest.py).

``EXAMPLES`` must hold an example of every model in ``schemas.topics.all_models()``;
``test_codec.py`` fails when a model is added to the catalog without one here. Unlike the
project's own ``schemas.examples`` (also checked), these set nearly every optional field and put
values at their limits: extreme hashes and token ids, non-ASCII text, non-UTF-8 bytes.
"""

from __future__ import annotations

from typing import Any

from schemas import commands, events
from schemas.base import Message
from schemas.config import ConfigSet
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk

T0 = 1_700_000_000_000  # a plausible event time in epoch ms


def make_request(**overrides: Any) -> InferenceRequest:
    """A valid InferenceRequest using most optional fields; ``overrides`` replace fields."""
    fields: dict[str, Any] = dict(
        event_time_ms=T0,
        request_id="req-0001",
        task_id="task-7",
        step=2,
        steps_total=3,
        tenant="acme",
        priority=5,
        model="llama-3-8b",
        prompt_tokens=40,
        prompt_text="Hello, wörld — ☃",
        prompt_token_ids=list(range(40)),
        prefix_hashes=[-(2**63), 2**64 - 1, 12345],
        block_size=16,
        max_tokens=64,
        ttft_slo_s=2.5,
        deadline_ms=T0 + 60_000,
        reply_to="governor.responses",
        created_ms=T0,
    )
    fields.update(overrides)
    return InferenceRequest(**fields)


def _examples() -> dict[type[Message], Message]:
    common = dict(event_time_ms=T0, request_id="req-0001", task_id="task-7", tenant="acme")
    cmd = dict(event_time_ms=T0, command_id="cmd-1", issued_by="autoscaler", reason="because")
    out: list[Message] = [
        make_request(),
        CancelRequest(event_time_ms=T0, request_id="req-0001", reason="user closed the tab"),
        Dispatch(event_time_ms=T0, request=make_request(), worker_id="w-3", slot=3, attempt=2,
                 resume_from_token=17, router_id="router-a"),
        ResponseChunk(event_time_ms=T0, request_id="req-0001", worker_id="w-3", attempt=2,
                      token_offset=17, tokens=[1, 2, 2**31 - 1], text="abc", final=True,
                      finish_reason="length"),
        events.Queued(**common, prompt_tokens=40, max_tokens=64, priority=5, step=2,
                      steps_total=3, created_ms=T0, deadline_ms=T0 + 1000),
        events.Started(**common, worker_id="w-3", attempt=2),
        events.FirstToken(**common, worker_id="w-3", ttft_s=0.125),
        events.Preempted(**common, worker_id="w-3", tokens_done=9),
        events.Requeued(**common, worker_id="w-3", attempt=2, tokens_done=11,
                        detail="drain deadline"),
        events.Completed(**common, worker_id="w-3", prompt_tokens=40, output_tokens=64,
                         cached_tokens=32, finish_reason="stop", e2e_s=1.5),
        events.Failed(**common, reason="worker_lost", detail="SIGKILL", worker_id="w-3"),
        events.Rejected(**common, reason="rate_limited", detail="over 10 rps", retry_after_s=1.0),
        events.Cancelled(**common, reason="client", worker_id="w-3"),
        events.ConfigApplied(event_time_ms=T0, key="breaker.itl_ratio", component="router-0",
                             config_offset=12),
        events.ConfigRejected(event_time_ms=T0, key="slo.ttft_slo_s", component="controllers",
                              config_offset=13, reason="slo.ttft_slo_s: Input should be greater than 0"),
        events.WorkerStatus(event_time_ms=T0, worker_id="w-3", slot=3, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], state="draining",
                            kv_blocks_used=10, kv_blocks_free=90, running=2, waiting=1,
                            prefix_cache_queries=5, prefix_cache_hits=3, preemptions=1,
                            requests_completed=7,
                            started_ms=T0 - 5000),
        events.KvBlocksStored(event_time_ms=T0, worker_id="w-3", block_size=16,
                              block_hashes=[1, -2, 2**64 - 1], parent_hash=-(2**63)),
        events.KvBlocksEvicted(event_time_ms=T0, worker_id="w-3", block_hashes=[1, 2]),
        events.KvCacheCleared(event_time_ms=T0, worker_id="w-3"),
        events.SignalSnapshot(event_time_ms=T0, scope="pool", key="h100@llama-3-8b",
                              window_s=10.0, window_end_ms=T0,
                              values={"ttft_p99_s": 0.8, "queue_depth": 3.0}),
        events.DeadLetter(event_time_ms=T0, source_topic="governor.requests", partition=2,
                          offset=99, consumer="router", reason="undecodable", error="bad json",
                          key=b"\x00\xffkey", raw=b"\xff\xfe\x00not json\x80", raw_size=12),
        commands.SetRoutingWeights(**cmd, weights={"h100@llama-3-8b": 0.7, "a100@llama-3-8b": 0.3}),
        commands.SetAdmissionLimits(**cmd, limits={"acme": commands.TenantLimit(
            requests_per_s=10, tokens_per_s=10_000, burst_s=5, priority=3)}),
        commands.SetLoadShedLevel(**cmd, min_value=0.5),
        commands.SetBreakerState(**cmd, worker_id="w-3", state="half_open", until_ms=T0 + 5000),
        commands.SetRetryBudget(**cmd, ratio=0.1, min_per_s=2.0),
        commands.ScalePool(**cmd, pool="h100@llama-3-8b", gpu_type="h100", model="llama-3-8b",
                           replicas=4),
        commands.DrainWorker(**cmd, worker_id="w-3", deadline_ms=T0 + 30_000),
        commands.LoadModel(**cmd, worker_id="w-3", model="llama-3-70b"),
        commands.SleepWorker(**cmd, worker_id="w-3", level=1),
        commands.InjectFault(**cmd, worker_id="w-3", fault="slow", factor=2.5, duration_s=30.0),
        ConfigSet(event_time_ms=T0, key="slo.ttft_slo_s", value={"nested": [1, 2.5, "x", None]},
                  set_by="ops"),
    ]
    by_model = {type(m): m for m in out}
    assert len(by_model) == len(out), "two examples of the same model"
    return by_model


EXAMPLES: dict[type[Message], Message] = _examples()
