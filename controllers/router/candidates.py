"""Per-request facts about each candidate worker, computed once and shared by filters and scorers.

The predicted time to first token uses the same performance model as the simulated engine: the
prefill of this request's uncached tokens behind the prefill work queued ahead of it (dispatches
not yet reported, plus the prompt tokens the worker reports as not yet prefilled — or, for a
worker that does not report them, its waiting requests at a typical prompt size), in a step that
also decodes the worker's running batch.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from controllers.router.fleet import WorkerView
from controllers.router.ledger import PendingLedger
from controllers.router.prefix import PrefixIndex
from schemas.config import ModelShape, unpriced_gpu_price
from schemas.requests import InferenceRequest
from workers.sim import models
from workers.sim.perf import PerfModel

logger = logging.getLogger(__name__)

#: Prompt tokens assumed for each waiting request whose size the router does not know.
TYPICAL_PROMPT_TOKENS = 1_024
TYPICAL_CONTEXT_TOKENS = 1_024
#: Prefill tokens per engine step (vLLM's default max_num_batched_tokens).
CHUNK_TOKENS = 8_192
#: What a worker's model load adds to TTFT when it is not warm yet.
FALLBACK_GPU, FALLBACK_MODEL = "h100", "llama-3-8b"


@lru_cache(maxsize=1024)
def perf_model(gpu_type: str, model: str, gpus: int = 1) -> PerfModel:
    """The performance model of a worker of ``model`` on ``gpus`` GPUs of a type (as it reports
    them, ``WorkerStatus.gpus``), at that tensor parallelism where the model runs there
    (``models.tp_refusal``), and at the least whose GPUs hold the model otherwise (a worker
    that reports fewer, of before 6 Dec or ``--engine vllm`` without ``--tp``; or a degree the
    model cannot run at). Unknown names fall back to an H100 and Llama-3-8B, said once in the
    log. Cached per (GPU type, model, GPUs): the router's hottest path asks it per worker."""
    try:
        return _at_degree(gpu_type, model, gpus)
    except ValueError as exc:
        why = exc
    for gpu, name in ((FALLBACK_GPU, model), (FALLBACK_GPU, FALLBACK_MODEL)):
        try:
            perf = _at_degree(gpu, name, gpus)
        except ValueError:
            continue
        logger.warning("%s: %s on %s is predicted as %s on %s%s", why, model, gpu_type, name,
                       gpu, "" if models.is_known(model) else
                       " (declare it by its shape under the setting models)")
        return perf
    raise AssertionError("the fallback model loads")


def _at_degree(gpu_type: str, model: str, gpus: int) -> PerfModel:
    spec, gpu = models.model_spec(model), models.gpu_spec(gpu_type)  # (names checked)
    tp = gpus if models.tp_refusal(spec, gpu, gpus) is None else models.least_tp(spec, gpu)
    if tp is None:
        raise ValueError(models.no_tp(spec, gpu))
    return PerfModel.load(gpu_type, model, tp)


def worker_gpus(reported: int, perf: PerfModel) -> int:
    """The GPUs a worker is priced at: those it reports (``WorkerStatus.gpus``), and at least
    ``perf.tp``, those its model needs on its GPU type (a worker that reports none, of before
    6 Dec or ``--engine vllm`` without ``--tp``, still runs on that many)."""
    return max(reported, perf.tp)


def configure_models(shapes: Mapping[str, ModelShape]) -> None:
    """The configuration's models (``GovernorConfig.models``), for every performance model
    looked up from now on; raises ``ValueError`` naming a model that cannot be declared."""
    if models.configure_models(shapes):
        perf_model.cache_clear()


@dataclass(slots=True)
class Candidate:
    worker: WorkerView
    perf: PerfModel
    #: the worker's: its GPU's price times its GPUs (``worker_gpus``)
    price_per_hour: float
    overlap_blocks: int
    pending: int
    pending_prompt_tokens: int
    predicted_ttft_s: float
    breaker: str = "closed"
    affinity: bool = False
    #: requests in flight on the worker that this request's prefill would push past their
    #: deadline (``mark_deadlines_at_risk``; 0 where not counted)
    deadlines_at_risk: int = 0
    #: running + waiting + pending requests, summed once: scorers and tie-breaks read it often
    load: int = field(init=False)

    def __post_init__(self) -> None:
        self.load = self.worker.running + self.worker.waiting + self.pending


def build_candidates(
    request: InferenceRequest,
    workers: list[WorkerView],
    ledger: PendingLedger,
    prefix: PrefixIndex,
    prices: dict[str, float],
    breakers: dict[str, str],
    affinity_worker: str | None,
    predict: bool = True,
    resumed: int = 0,
) -> list[Candidate]:
    """``predict=False`` skips the TTFT prediction (0), for policies that do not use it.
    ``resumed``: the tokens a continuation resumes after, which its prompt holds too."""
    out = []
    hashes = request.prefix_hashes
    # per kind of worker: its performance model and its price an hour
    kinds: dict[str | tuple[str, int], tuple[PerfModel, float]] = {}
    unpriced = unpriced_gpu_price(prices)
    overlap_of, requests_of, tokens_of = prefix.overlap, ledger.requests, ledger.prompt_tokens
    # (a prompt sent as text may count 0 tokens: nothing of it is cached)
    prompt, block_size = request.prompt_tokens + resumed, request.block_size
    for w in workers:
        kind = w.gpu_type if w.gpus == 1 else (w.gpu_type, w.gpus)  # (no tuple for most)
        known = kinds.get(kind)
        if known is None:
            perf = perf_model(w.gpu_type, request.model, w.gpus)
            known = kinds[kind] = (
                perf, prices.get(w.gpu_type, unpriced) * worker_gpus(w.gpus, perf))
        perf, price_per_hour = known
        overlap = overlap_of(w.worker_id, hashes) if hashes else 0
        pending = requests_of(w.worker_id)
        pending_tokens = tokens_of(w.worker_id)
        ttft = 0.0
        if predict:
            cached = max(0, min(overlap * block_size, prompt - 1))
            uncached = prompt - cached
            backlog = w.prefill_backlog_tokens
            waiting = w.waiting * TYPICAL_PROMPT_TOKENS if backlog is None else backlog
            queued = pending_tokens + waiting
            # Chunked prefill: the tokens ahead take several steps, each also decoding the batch;
            # the rest of a long prompt attends to the part already computed, this request to
            # its cached prefix.
            prefill = queued + uncached
            extra_steps = max(0, -(-prefill // CHUNK_TOKENS) - 1)
            context = (w.prefill_context_tokens or 0) + cached
            ttft = perf.step_s(prefill, context, w.running, TYPICAL_CONTEXT_TOKENS,
                               prefill_seqs=1 + pending + w.waiting)
            if extra_steps and w.running:
                ttft += extra_steps * perf.decode_step_s(w.running, TYPICAL_CONTEXT_TOKENS)
            if w.state == "loading":
                ttft += perf.load_s()
        out.append(Candidate(
            worker=w, perf=perf, price_per_hour=price_per_hour,
            overlap_blocks=overlap, pending=pending, pending_prompt_tokens=pending_tokens,
            predicted_ttft_s=ttft,
            breaker=breakers.get(w.worker_id, "closed"),
            affinity=affinity_worker == w.worker_id,
        ))
    return out


def prefill_stall_s(request: InferenceRequest, c: Candidate, resumed: int = 0) -> float:
    """How long this request's prefill would hold up the sequences decoding on ``c``'s worker:
    the time of its uncached tokens (a continuation's prompt holds the ``resumed`` tokens
    generated before it), where they take several engine steps (0 where they fit in one: a
    single chunk delays a decoding sequence by one step)."""
    prompt = request.prompt_tokens + resumed
    cached = max(0, min(c.overlap_blocks * request.block_size, prompt - 1))
    uncached = prompt - cached
    if uncached <= CHUNK_TOKENS:
        return 0.0
    return c.perf.step_s(uncached, cached, 0, 0)


def mark_deadlines_at_risk(request: InferenceRequest, cands: list[Candidate],
                           in_flight: Callable[[str], list[tuple[int, int]]],
                           now_ms: int, resumed: int = 0) -> None:
    """Set each candidate's ``deadlines_at_risk``: the requests in flight on its worker
    (``in_flight(worker_id)``: each one's deadline and tokens left to generate, queued ones
    included) that would finish in time at the worker's decode pace, and would not with this
    request's prefill stalling them. A request already bound to miss is not counted: moving
    this one would not save it."""
    for c in cands:
        stall = prefill_stall_s(request, c, resumed)
        if not stall:
            continue
        w = c.worker
        per_token = c.perf.decode_step_s(w.running + c.pending + 1, TYPICAL_CONTEXT_TOKENS)
        c.deadlines_at_risk = sum(
            1 for deadline_ms, tokens_left in in_flight(w.worker_id)
            if 0.0 <= (deadline_ms - now_ms) / 1000 - tokens_left * per_token < stall)
