"""Per-request facts about each candidate worker, computed once and shared by filters and scorers.

The predicted time to first token uses the same performance model as the simulated engine: the
prefill of this request's uncached tokens behind the prefill work queued ahead of it (pending
dispatches and waiting requests), in a step that also decodes the worker's running batch.
"""

from dataclasses import dataclass
from functools import lru_cache

from controllers.router.fleet import WorkerView
from controllers.router.ledger import PendingLedger
from controllers.router.prefix import PrefixIndex
from schemas.requests import InferenceRequest
from workers.sim.perf import PerfModel

#: Prompt tokens assumed for each waiting request whose size the router does not know.
TYPICAL_PROMPT_TOKENS = 1_024
TYPICAL_CONTEXT_TOKENS = 1_024
#: What a worker's model load adds to TTFT when it is not warm yet.
FALLBACK_GPU = "h100"


@lru_cache(maxsize=64)
def perf_model(gpu_type: str, model: str) -> PerfModel:
    """The performance model of a GPU type and model; unknown names fall back to an H100."""
    try:
        return PerfModel.load(gpu_type, model)
    except ValueError:
        try:
            return PerfModel.load(FALLBACK_GPU, model)
        except ValueError:
            return PerfModel.load(FALLBACK_GPU, "llama-3-8b")


@dataclass(slots=True)
class Candidate:
    worker: WorkerView
    perf: PerfModel
    price_per_hour: float
    overlap_blocks: int
    pending: int
    pending_prompt_tokens: int
    predicted_ttft_s: float
    breaker: str = "closed"
    affinity: bool = False

    @property
    def load(self) -> int:
        return self.worker.running + self.worker.waiting + self.pending


def build_candidates(
    request: InferenceRequest,
    workers: list[WorkerView],
    ledger: PendingLedger,
    prefix: PrefixIndex,
    prices: dict[str, float],
    breakers: dict[str, str],
    affinity_worker: str | None,
) -> list[Candidate]:
    out = []
    hashes = request.prefix_hashes
    for w in workers:
        perf = perf_model(w.gpu_type, request.model)
        overlap = prefix.overlap(w.worker_id, hashes) if hashes else 0
        uncached = max(request.prompt_tokens - overlap * request.block_size, 1)
        pending = ledger.requests(w.worker_id)
        pending_tokens = ledger.prompt_tokens(w.worker_id)
        queued = pending_tokens + w.waiting * TYPICAL_PROMPT_TOKENS
        ttft = perf.step_s(queued + uncached, 0, w.running, TYPICAL_CONTEXT_TOKENS,
                           prefill_seqs=1 + pending + w.waiting)
        if w.state == "loading":
            ttft += perf.load_s()
        out.append(Candidate(
            worker=w, perf=perf, price_per_hour=prices.get(w.gpu_type, 0.0),
            overlap_blocks=overlap, pending=pending, pending_prompt_tokens=pending_tokens,
            predicted_ttft_s=ttft,
            breaker=breakers.get(w.worker_id, "closed"),
            affinity=affinity_worker == w.worker_id,
        ))
    return out
