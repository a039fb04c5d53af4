"""A simulated vLLM v1 engine on one GPU: a pure object advanced by an injected clock.

What it models, using vLLM's argument names:
- continuous batching: every iteration (step) schedules running requests first, one decode token
  each or a chunk of their prefill, then admits waiting requests FIFO while the token budget
  (``max_num_batched_tokens``), ``max_num_seqs`` and free KV blocks allow (chunked prefill);
- a paged KV cache of ``block_size``-token blocks sized from GPU memory (see ``PerfModel``), with
  automatic prefix caching of full blocks identified by the prompt's hash chain, the blocks its
  answer fills too, each as it fills (``EngineRequest.answer_hashes``: a conversation's next
  turn re-sends the answer), LRU eviction of unreferenced blocks, and cached blocks skipping
  prefill compute;
- preemption by recompute when a running request needs a block and none is free: the most
  recently admitted request loses its KV and goes back to the front of the queue;
- step time from the calibrated performance model; tokens appear at the end of their step;
- cold start: no step runs until the model's weights are loaded;
- faults: crash (everything is lost), slowdown by a factor, stall until a time;
- speed: in a pure-decode stretch it jumps over many steps at once (up to the next finish, the next
  KV block shortage or ``now``) instead of looping per token.

Time: ``advance(now)`` applies every step that *ends* by ``now``. A step is scheduled when it
starts, so a request added while a step runs joins the next one, as in vLLM.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.engine import CapacityError, EngineRequest, EngineStats, TokenBatch, reference_token
from workers.sim.kv_cache import KvCache

if TYPE_CHECKING:
    from workers.sim.perf import PerfModel


@dataclass(frozen=True)
class SimEngineConfig:
    """Engine arguments, named as vLLM names them."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    #: The longest prompt and output served. None: the model's (``PerfModel.max_model_len``).
    max_model_len: int | None = None
    #: Seconds to load the weights (cold start). None: ``PerfModel.load_s()``.
    load_s: float | None = None
    #: Produce token ids (the offline simulator only needs counts).
    emit_tokens: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.block_size < 1:
            raise ValueError("max_num_batched_tokens, max_num_seqs and block_size must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")


@dataclass(slots=True, eq=False)
class _Request:
    """A request in the engine, equal to itself alone (by value, the running list's ``remove``
    and ``in`` compared every field of each request ahead of it)."""

    rid: str
    arrival_s: float
    prompt_len: int  # tokens to prefill: the prompt, plus tokens already sent on a continuation
    stop_at: int  # output offset it ends at: its answer's end, or the client's max_tokens
    out_start: int  # first output offset this attempt produces
    #: One per cacheable unit of ``unit_tokens`` tokens of its sequence: its prompt's full units,
    #: then those its answer fills (``EngineRequest.answer_hashes``), cached as they fill.
    hashes: tuple[int, ...]
    unit_tokens: int
    unit_blocks: int
    generated: int = 0  # next output offset
    ends_itself: bool = False  # its answer ends before max_tokens (finish reason "stop")
    computed: int = 0  # tokens whose KV is computed
    held_units: int = 0  # leading hash units referenced in the cache
    private_blocks: int = 0
    first_token_s: float | None = None
    queried: bool = False  # its prefix looked up once (admitted again after a preemption: not)
    cached: int = 0  # prompt tokens the prefix cache held when it was first admitted
    #: Tokens whose KV must exist before the next token can be sampled (kept up to date by
    #: ``sampled``, as it is read far more often than ``generated`` changes).
    kv_needed: int = field(init=False)

    def __post_init__(self) -> None:
        self.sampled(0)

    def sampled(self, count: int) -> None:
        """``count`` more output tokens."""
        self.generated += count
        self.kv_needed = self.prompt_len + max(self.generated - self.out_start - 1, 0)

    @property
    def held_blocks(self) -> int:
        return self.held_units * self.unit_blocks + self.private_blocks


@dataclass(slots=True)
class Output:
    """The tokens one request produced since the last ``advance``, as the engine keeps them
    (``advance`` hands each out as a ``TokenBatch``; the offline simulator reads them as they
    are, through ``produced``: a frozen ``TokenBatch`` costs several times as much to build)."""

    offset: int
    count: int = 0
    first_token_s: float | None = None
    time_s: float = 0.0
    finished: bool = False
    finish_reason: str = "length"
    cached_tokens: int = 0


@dataclass
class _Step:
    end_s: float
    work: list[tuple[_Request, int]] = field(default_factory=list)


def _max_model_len(configured: int | None, model: int | None) -> int | None:
    """The engine's ``max_model_len``: the configured one, at most the model's (vLLM refuses
    to start past it), else the model's."""
    if configured is not None and model is not None and configured > model:
        raise ValueError(f"max_model_len {configured} is greater than the model's "
                         f"maximum context length, {model}")
    return configured if configured is not None else model


class SimEngine:
    def __init__(
        self,
        perf: "PerfModel",
        config: SimEngineConfig = SimEngineConfig(),
        *,
        now_s: float = 0.0,
        warm: bool = True,
    ) -> None:
        self.perf = perf
        self.config = config
        self.kv = KvCache(self._blocks_for(perf), config.block_size)
        self.max_model_len = _max_model_len(config.max_model_len, perf.max_model_len)
        self.load_s = perf.load_s() if config.load_s is None else config.load_s
        self.ready_s = now_s if warm else now_s + self.load_s
        self.t = now_s  # when the engine is next free to start a step
        self.worked_until_s = now_s  # the end of its last step (or decode stretch)
        self.slowdown = 1.0
        self.stalled_until = 0.0
        self.crashed = False
        self.preemptions = 0
        self.steps = 0
        self.prefilled_tokens = 0  # prompt tokens computed, recomputation included
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._inflight: _Step | None = None
        self._out: dict[str, Output] = {}

    # -- the Engine interface -------------------------------------------------------------
    def add(self, request: EngineRequest, now_s: float) -> None:
        if request.resume_from_token >= request.max_tokens:
            raise ValueError(f"{request.request_id}: nothing left to generate")
        if self.crashed:
            raise RuntimeError("the engine crashed; it accepts no request")
        req = self._new_request(request, now_s)
        output = req.stop_at - req.out_start
        asked = request.max_tokens - request.resume_from_token  # (as vLLM counts: what may
        # come, not the answer the simulator knows it will run to)
        if self.max_model_len is not None and req.prompt_len + asked > self.max_model_len:
            raise CapacityError(
                f"{request.request_id}: this model's maximum context length is "
                f"{self.max_model_len} tokens; the request has {req.prompt_len} prompt and "
                f"{asked} output tokens ({req.prompt_len + asked})")
        blocks = self.kv.blocks_for(req.prompt_len + output)
        if blocks > self.kv.num_blocks:
            raise CapacityError(
                f"{request.request_id}: {req.prompt_len} prompt + {output} output tokens need "
                f"{blocks} KV blocks; this GPU holds {self.kv.num_blocks}"
            )
        self._waiting.append(req)

    def abort(self, request_id: str) -> bool:
        for queue in (self._waiting, self._running):
            for req in queue:
                if req.rid == request_id:
                    queue.remove(req)
                    self._release(req)
                    if self._inflight is not None:
                        self._inflight.work = [(r, n) for r, n in self._inflight.work if r is not req]
                    self._out.pop(request_id, None)
                    return True
        return False

    def advance(self, now_s: float) -> list[TokenBatch]:
        return self._batches(self.produced(now_s))

    def produced(self, now_s: float) -> dict[str, Output]:
        """``advance`` without the ``TokenBatch``: each request's ``Output``, by request id."""
        if self.crashed:
            return {}
        while True:
            if self._inflight is None and not self._schedule(now_s):
                break
            step = self._inflight
            if step.end_s > now_s:
                break
            self._inflight = None
            self._apply(step)
        produced, self._out = self._out, {}
        return produced

    def next_event_s(self) -> float | None:
        if self.crashed:
            return None
        if self._inflight is not None:
            return self._inflight.end_s
        if self._waiting or self._running:
            return max(self.t, self.ready_s, self.stalled_until)
        return None

    def stats(self) -> EngineStats:
        return EngineStats(**self.status_fields(), steps=self.steps,
                           prefilled_tokens=self.prefilled_tokens,
                           max_model_len=self.max_model_len, gpus=self.perf.tp)

    def status_fields(self) -> dict:
        """What ``stats`` says of the engine's state now, as a dict keyed as ``WorkerStatus``
        names the same fields: the offline simulator builds its heartbeats from it, ~113k a run,
        where an ``EngineStats`` in between cost a tenth of the run."""
        backlog, context = self._prefill_backlog()
        kv = self.kv
        free = kv.available_blocks
        return {
            "running": len(self._running),
            "waiting": len(self._waiting),
            "kv_blocks_used": kv.num_blocks - free,
            "kv_blocks_free": free,
            "prefix_cache_queries": kv.queries_tokens,
            "prefix_cache_hits": kv.hits_tokens,
            "preemptions": self.preemptions,
            "state": "crashed" if self.crashed else (
                "loading" if self.t < self.ready_s else "warm"),
            "prefill_backlog_tokens": backlog,
            "prefill_context_tokens": context,
        }

    def _prefill_backlog(self) -> tuple[int, int]:
        """Prompt tokens admitted or waiting whose KV is not computed yet, and the tokens
        already computed of their sequences."""
        backlog = context = 0
        for queue in (self._waiting, self._running):
            for r in queue:
                left = r.kv_needed - r.computed
                if left > 0:
                    backlog += left
                    context += r.computed
        return backlog, context

    def decoding(self) -> int:
        """Running sequences past their prefill (those producing a token every step)."""
        return sum(1 for r in self._running if r.computed >= r.kv_needed)

    def drain_kv_events(self) -> tuple[list[int], list[int]]:
        """Prefix-block hashes stored and evicted since the last call."""
        return self.kv.drain_events()

    # -- faults and lifecycle -------------------------------------------------------------
    def crash(self) -> None:
        """The GPU is gone: every request and every cached block with it."""
        self.crashed = True
        self._waiting.clear()
        self._running.clear()
        self._inflight = None
        self._out.clear()
        self.kv.clear()

    def slow_down(self, factor: float) -> None:
        """A degraded GPU: every later step takes ``factor`` times as long."""
        if factor <= 0:
            raise ValueError("slowdown factor must be positive")
        self.slowdown = factor

    def stall(self, until_s: float) -> None:
        """No step starts before ``until_s`` (a hung kernel, a stuck host)."""
        self.stalled_until = max(self.stalled_until, until_s)

    def load_model(self, perf: "PerfModel", now_s: float) -> None:
        """Switch models: a cold start that drops the KV cache, sized anew for the new model's
        weights and per-token KV, and taking its context. The engine must be idle."""
        if self._waiting or self._running:
            raise RuntimeError("drain the engine before switching models")
        self.max_model_len = _max_model_len(self.config.max_model_len, perf.max_model_len)
        self.perf = perf
        self.kv.clear(self._blocks_for(perf))
        self.load_s = perf.load_s() if self.config.load_s is None else self.config.load_s
        self.ready_s = max(now_s, self.t) + self.load_s

    def _blocks_for(self, perf: "PerfModel") -> int:
        return self.config.num_gpu_blocks_override or perf.kv_capacity_blocks(
            self.config.block_size, self.config.gpu_memory_utilization)

    # -- scheduling -----------------------------------------------------------------------
    def _new_request(self, request: EngineRequest, now_s: float) -> _Request:
        prompt_len = request.prompt_tokens + request.resume_from_token
        hashed = request.prefix_hashes or request.answer_hashes
        unit = request.hash_block_size if hashed else self.config.block_size
        cacheable = (
            self.config.enable_prefix_caching
            and hashed
            and unit % self.config.block_size == 0
        )
        full_units = request.prompt_tokens // unit
        hashes = tuple(request.prefix_hashes[:full_units]) if cacheable else ()
        if cacheable and request.answer_hashes and len(hashes) == full_units:
            # (the answer's blocks follow the prompt's full ones: behind a prompt block with no
            # id they would stand at other offsets, and could never be matched)
            hashes += tuple(request.answer_hashes)
        stop = request.max_tokens
        if request.answer_tokens is not None:  # (a resumed attempt past its answer's end, its
            # worker lost before it said so, samples one more token, the end of sequence)
            stop = min(stop, max(request.answer_tokens, request.resume_from_token + 1))
        return _Request(
            rid=request.request_id, arrival_s=now_s, prompt_len=max(prompt_len, 1),
            stop_at=stop, ends_itself=stop < request.max_tokens,
            out_start=request.resume_from_token,
            hashes=hashes, unit_tokens=unit, unit_blocks=unit // self.config.block_size,
            generated=request.resume_from_token,
        )

    def _schedule(self, now_s: float) -> bool:
        """Start the next step if there is work and it can start by ``now_s``; jump over
        pure-decode stretches that end by ``now_s``."""
        while True:
            if not self._running and not self._waiting:
                self.t = max(self.t, now_s)  # idle: the clock moves on
                return False
            start = max(self.t, self.ready_s, self.stalled_until)
            if not self._running:
                start = max(start, self._waiting[0].arrival_s)
            if start > now_s:
                return False
            self.t = start
            if not self._skip_decode(now_s):
                break
        step = self._plan(start)
        if not step.work:
            return False
        self._inflight = step
        return True

    def _plan(self, start: float) -> _Step:
        budget = self.config.max_num_batched_tokens
        work: list[tuple[_Request, int]] = []
        preempted = False
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            need = req.kv_needed - req.computed
            tokens = 1 if need <= 0 else min(need, budget)
            if not self._reserve(req, tokens):
                preempted = True
                if req not in self._running:
                    break
                continue
            work.append((req, tokens))
            budget -= tokens
            i += 1
        while (
            self._waiting and not preempted and budget > 0
            and len(self._running) < self.config.max_num_seqs
            and self._waiting[0].arrival_s <= start
        ):
            req = self._waiting[0]
            units = self._cached_units(req)
            tokens = min(req.kv_needed - units * req.unit_tokens, budget)
            if not self._fits(req, units, tokens):
                break  # (its cached prefix left where it stands in the LRU order, as vLLM does)
            self._match_prefix(req, units)
            if not self._reserve(req, tokens, may_preempt=False):  # (_fits said it would)
                raise RuntimeError(f"KV cache cannot hold {req.rid}'s first {tokens} tokens")
            if not req.queried:  # as vLLM counts its hit rate: preempted requests left out
                req.queried = True
                req.cached = req.computed
                self.kv.record_query(req.kv_needed, req.computed)
            self._waiting.popleft()
            self._running.append(req)
            work.append((req, tokens))
            budget -= tokens
        prefill = prefill_ctx = prefilling = decoding = decode_ctx_total = 0
        for r, n in work:
            if r.computed < r.kv_needed:
                prefill += n
                prefill_ctx += r.computed
                prefilling += 1
            else:
                decoding += 1
                decode_ctx_total += r.computed
        decode_ctx = decode_ctx_total / decoding if decoding else 0.0
        duration = self.perf.step_s(
            prefill, prefill_ctx, decoding, decode_ctx, prefill_seqs=max(prefilling, 1)
        )
        return _Step(start + duration * self.slowdown, work)

    def _reserve(self, req: _Request, tokens: int, may_preempt: bool = True) -> bool:
        """Allocate the blocks ``req`` needs for ``tokens`` more; preempt others if allowed."""
        blocks = -(-(req.computed + tokens) // self.kv.block_size) - req.held_blocks
        while blocks > 0 and not self.kv.allocate(blocks):
            if not may_preempt or not self._running:
                return False
            victim = self._running.pop()
            self._preempt(victim)
            if victim is req:
                return False
        req.private_blocks += max(blocks, 0)
        return True

    def _cached_units(self, req: _Request) -> int:
        """The leading hash units of ``req`` the cache holds that it may skip: at least one
        prompt token is always computed, to sample from, so a new request matches its prompt's
        units alone, never those its answer will fill (a resumed attempt's prompt holds the
        tokens already sent, and one admitted again after a preemption those it generated)."""
        units = self.kv.cached_prefix(req.hashes, req.unit_blocks)
        return min(units, (req.kv_needed - 1) // req.unit_tokens)

    def _fits(self, req: _Request, units: int, tokens: int) -> bool:
        """Whether waiting ``req`` can be admitted with its first ``units`` cached and ``tokens``
        more computed. Asked before its cached units are referenced: a request that cannot be
        admitted does not touch them (vLLM touches a hit only once its blocks are allocated),
        where referencing and releasing them again made them the most recently used, and a
        request waiting for room kept its prefix from eviction at every step."""
        blocks = self.kv.blocks_for(units * req.unit_tokens + tokens) - units * req.unit_blocks
        return self.kv.can_take(req.hashes[:units], blocks)

    def _match_prefix(self, req: _Request, units: int) -> None:
        self.kv.acquire(req.hashes[:units])
        req.held_units = units
        req.computed = units * req.unit_tokens

    def _preempt(self, req: _Request) -> None:
        self._release(req)
        self._waiting.appendleft(req)
        self.preemptions += 1

    def _release(self, req: _Request) -> None:
        """Give back ``req``'s blocks in reverse, as vLLM does: its private tail, then its
        cached prefix from the end (``KvCache``: freed in that order, evicted in that order)."""
        self.kv.free(req.private_blocks)
        self.kv.release(req.hashes[: req.held_units])
        req.held_units = req.private_blocks = req.computed = 0

    # -- applying steps -------------------------------------------------------------------
    def _apply(self, step: _Step) -> None:
        self.t = self.worked_until_s = step.end_s
        self.steps += 1
        for req, tokens in step.work:
            prefilling = req.computed < req.kv_needed
            if prefilling:
                self.prefilled_tokens += tokens
            req.computed += tokens
            if req.held_units < len(req.hashes):
                self._promote(req)
            if prefilling and req.computed < req.kv_needed:
                continue  # a chunk of prefill; no token sampled yet
            self._emit(req, 1, step.end_s)

    def _emit(self, req: _Request, count: int, time_s: float) -> None:
        out = self._out.get(req.rid)
        if out is None:
            out = self._out[req.rid] = Output(offset=req.generated)
        if req.first_token_s is None:
            req.first_token_s = out.first_token_s = time_s
        req.sampled(count)
        out.count += count
        out.time_s = time_s
        if req.generated >= req.stop_at:
            out.finished = True
            out.finish_reason = "stop" if req.ends_itself else "length"
            out.cached_tokens = req.cached
            self._running.remove(req)
            self._release(req)

    def _promote(self, req: _Request) -> None:
        while req.held_units < len(req.hashes) and (req.held_units + 1) * req.unit_tokens <= req.computed:
            if self.kv.promote(req.hashes[req.held_units], req.unit_blocks) is None:
                req.hashes = req.hashes[:req.held_units]  # cached at another size: no further
                return
            req.private_blocks -= req.unit_blocks
            req.held_units += 1

    def _skip_decode(self, now_s: float) -> bool:
        """Apply k >= 2 pure-decode steps that all end by ``now_s`` at once; False if none."""
        running = self._running
        if not running or (self._waiting and len(running) < self.config.max_num_seqs):
            return False
        n = len(running)
        k = None
        context = 0
        for r in running:
            if r.computed < r.kv_needed:
                return False  # still prefilling
            left = r.stop_at - r.generated
            if k is None or left < k:
                k = left
            context += r.computed
        mean_ctx = context / n
        most = k
        step_s = self.perf.decode_step_s(n, mean_ctx + k / 2) * self.slowdown
        k = min(k, int((now_s - self.t) / step_s))
        if k < 2:
            return False
        k = min(k, self._steps_kv_allows(k))
        if k < 2:
            return False
        if k != most:
            step_s = self.perf.decode_step_s(n, mean_ctx + k / 2) * self.slowdown
        end = self.t + k * step_s
        kv = self.kv
        size = kv.block_size
        for req in running:  # every step's blocks before any request finishes, as step by step
            blocks = -(-(req.computed + k) // size) - req.held_blocks
            if blocks > 0:
                if not kv.allocate(blocks):  # the skip was sized to what the cache holds
                    raise RuntimeError(f"KV cache cannot hold {blocks} more blocks for {req.rid}")
                req.private_blocks += blocks
        for req in list(running):
            req.computed += k
            if req.held_units < len(req.hashes):
                self._promote(req)
            self._emit(req, k, end)
        self.t = self.worked_until_s = end
        self.steps += k
        return True

    def _steps_kv_allows(self, k: int) -> int:
        """The most decode steps (<= k) whose new blocks fit in the free ones."""
        size = self.kv.block_size
        held = [(r.computed, r.held_units * r.unit_blocks + r.private_blocks) for r in self._running]

        def blocks_needed(steps: int) -> int:
            total = 0
            for computed, blocks in held:
                more = -(-(computed + steps) // size) - blocks
                if more > 0:
                    total += more
            return total

        available = self.kv.available_blocks
        if blocks_needed(k) <= available:
            return k
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks_needed(mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _batches(self, produced: dict[str, Output]) -> list[TokenBatch]:
        batches = []
        emit = self.config.emit_tokens
        for rid, out in produced.items():
            tokens = (
                tuple(reference_token(rid, i) for i in range(out.offset, out.offset + out.count))
                if emit else ()
            )
            batches.append(TokenBatch(
                request_id=rid, token_offset=out.offset, tokens=tokens,
                first=out.first_token_s is not None, finished=out.finished,
                finish_reason=out.finish_reason if out.finished else None, time_s=out.time_s,
                first_token_s=out.first_token_s, token_count=out.count,
                cached_tokens=out.cached_tokens,
            ))
        return batches
