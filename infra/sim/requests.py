"""From trace rows to what the simulator tracks (``RequestSpec``) and what it routes
(``InferenceRequest``): arrival times scaled, SLOs filled in from the default rule."""

from collections.abc import Sequence

from infra.sim.messages import construct
from infra.sim.outcomes import RequestSpec
from infra.sim.slo import SloRule
from infra.traces import TraceRequest
from schemas.requests import InferenceRequest


def request_specs(trace: Sequence[TraceRequest], rate_scale: float, slo: SloRule) -> list[RequestSpec]:
    out = []
    for i, r in enumerate(trace):
        output = max(r.output_tokens, 1)  # an engine always samples at least one token
        ttft = r.ttft_slo_s or slo.ttft_slo_s(r.prompt_tokens)
        out.append(RequestSpec(
            arrival_s=r.arrival_s / rate_scale, prompt_tokens=r.prompt_tokens, output_tokens=output,
            ttft_slo_s=ttft, deadline_s=r.deadline_s or slo.deadline_s(r.prompt_tokens, output, ttft),
            task=(r.tenant, r.task_id) if r.task_id else ("", f"r{i}"),
            steps_total=r.steps_total if r.task_id else 1, step=r.step if r.task_id else 1))
    return out


def inference_request(i: int, r: TraceRequest, spec: RequestSpec, created_ms: int) -> InferenceRequest:
    """Request ``r{i}`` as a client would produce it at ``created_ms`` (virtual)."""
    return construct(
        InferenceRequest, request_id=f"r{i}", task_id=r.task_id, step=r.step,
        steps_total=r.steps_total, tenant=r.tenant, priority=min(max(r.priority, 0), 9),
        model=r.model, prompt_tokens=r.prompt_tokens, prefix_hashes=list(r.hash_ids),
        block_size=r.block_size, max_tokens=spec.output_tokens, ttft_slo_s=spec.ttft_slo_s,
        deadline_ms=created_ms + int(spec.deadline_s * 1000), created_ms=created_ms)
