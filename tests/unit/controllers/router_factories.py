"""Factories shared by the router's unit tests: requests, worker views, candidates and heartbeats.

Everything here is plain data; times are explicit epoch milliseconds from ``T0``.
"""

from __future__ import annotations

from typing import Any

from controllers.router.candidates import Candidate, perf_model
from controllers.router.fleet import WorkerView
from controllers.router.scorers import PlacementContext
from schemas.events import WorkerStatus
from schemas.requests import InferenceRequest

T0 = 1_700_000_000_000
MODEL = "llama-3-8b"


def request_factory(request_id: str = "r1", **fields: Any) -> InferenceRequest:
    base: dict[str, Any] = dict(event_time_ms=T0, request_id=request_id, prompt_tokens=256,
                                max_tokens=32, created_ms=T0)
    base.update(fields)
    return InferenceRequest(**base)


def view_factory(worker_id: str = "w0", slot: int = 0, **fields: Any) -> WorkerView:
    base: dict[str, Any] = dict(worker_id=worker_id, slot=slot, pool="h100@m", gpu_type="h100",
                                models=(MODEL,), running=0, waiting=0, last_seen_ms=T0)
    base.update(fields)
    return WorkerView(**base)


def candidate_factory(worker_id: str = "w0", slot: int = 0, *, gpu_type: str = "h100",
                      price_per_hour: float = 3.0, overlap_blocks: int = 0, pending: int = 0,
                      pending_prompt_tokens: int = 0, predicted_ttft_s: float = 0.1,
                      breaker: str = "closed", affinity: bool = False,
                      **worker_fields: Any) -> Candidate:
    worker = view_factory(worker_id, slot, gpu_type=gpu_type, **worker_fields)
    return Candidate(worker=worker, perf=perf_model(gpu_type, MODEL), price_per_hour=price_per_hour,
                     overlap_blocks=overlap_blocks, pending=pending,
                     pending_prompt_tokens=pending_prompt_tokens, predicted_ttft_s=predicted_ttft_s,
                     breaker=breaker, affinity=affinity)


def context_factory(request: InferenceRequest | None = None, *, budget_s: float = 2.0,
                    has_deadline: bool = False,
                    pool_weights: dict[str, float] | None = None) -> PlacementContext:
    return PlacementContext(request or request_factory(), T0, budget_s, has_deadline,
                            pool_weights or {})


def status_factory(worker_id: str = "w0", slot: int = 0, at: int = T0,
                   **fields: Any) -> WorkerStatus:
    base: dict[str, Any] = dict(event_time_ms=at, worker_id=worker_id, slot=slot, pool="h100@m",
                                gpu_type="h100", models_loaded=[MODEL], started_ms=T0 - 1,
                                kv_blocks_free=10_000)
    base.update(fields)
    return WorkerStatus(**base)
