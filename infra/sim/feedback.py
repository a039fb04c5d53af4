"""What flows back from the simulated workers to the router and the controllers.

A worker's engine is advanced to an event's time; the tokens it produced go to the router as
token counts (``RouterCore.streamed``: what a ``ResponseChunk`` tells it, so that a resumed
stream starts at the right offset; no controller reads chunks), finished
requests as ``Completed``, prefix-cache changes as what KV block events tell
(``RouterCore.kv_stored``, ``kv_evicted``: no controller reads them either). Every message goes
to the ``RouterCore``; those the live controllers consume (``governor.telemetry``: heartbeats and
lifecycle events) go to the controllers too. Terminal states are recorded here, once each, and
passed on to ``on_end`` (which releases the next step of the request's task).
"""

from collections.abc import Callable, Sequence
from time import perf_counter

from controllers.router.core import RouterCore
from infra.sim.controllers import Tickable
from infra.sim.fleet import VirtualWorker
from infra.sim.messages import construct
from infra.sim.outcomes import COMPLETED, REJECTED, Outcomes
from infra.traces import TraceRequest
from schemas.base import Message
from schemas.events import Completed, Rejected
from workers.sim.engine import Output

#: What the controllers consume live (governor.telemetry); chunks and KV events go to the router only.
TELEMETRY = frozenset({"worker_status", "started", "completed", "failed", "rejected"})


def ms(t: float) -> int:
    return int(t * 1000)


class Feedback:
    def __init__(self, core: RouterCore, controllers: list[Tickable], outcomes: Outcomes,
                 trace: Sequence[TraceRequest],
                 on_end: Callable[[int], None] | None = None) -> None:
        self.core = core
        self.controllers = controllers
        self.outcomes = outcomes
        self.trace = trace
        self.on_end = on_end
        self.where: dict[str, str] = {}  # request id -> worker of its current attempt
        self.done = 0  # requests in a terminal state
        self.wall_engines_s = 0.0

    def observe(self, message: Message, now_ms: int) -> None:
        self.core.observe(message, now_ms)
        if self.controllers and message.type in TELEMETRY:
            for c in self.controllers:
                c.observe(message, now_ms)

    def advance(self, w: VirtualWorker, t: float) -> None:
        """Run ``w``'s engine up to ``t`` and report what it did."""
        engine = w.engine
        if self.controllers:  # inter-token latency for the breakers, as the live worker counts it
            decoding, elapsed = engine.decoding(), max(0.0, t - w.last_advance_s)
            w.seq_seconds += decoding * elapsed
            w.decode_seconds += elapsed if decoding else 0.0
        w.last_advance_s = t
        started = perf_counter()
        produced = engine.produced(t)
        self.wall_engines_s += perf_counter() - started
        now_ms = ms(t)
        for rid, out in produced.items():
            self._tokens(w, rid, out, now_ms)
        kv = engine.kv
        if kv.stored or kv.evicted:  # what its KvBlocksStored and KvBlocksEvicted would tell the
            # router (no controller reads them; the router takes no block size but its own)
            stored, evicted = engine.drain_kv_events()
            for hashes in kv.by_unit(stored).values():  # (as the live worker sends them)
                self.core.kv_stored(w.worker_id, hashes, now_ms)
            if evicted:
                self.core.kv_evicted(w.worker_id, evicted)

    def _tokens(self, w: VirtualWorker, rid: str, out: Output, now_ms: int) -> None:
        """What request ``rid``'s engine produced (a ``TokenBatch``'s worth) reaches the router."""
        i = int(rid[1:])
        if out.first_token_s is not None:
            self.outcomes.first_token(i, out.first_token_s)
        count = out.count
        w.tokens += count
        attempt = w.attempts.get(rid, 1)
        # a ResponseChunk; no controller reads it
        self.core.streamed(rid, out.offset, count, attempt,
                           out.finish_reason if out.finished else None)
        if out.finished:
            w.completed += 1
            w.attempts.pop(rid, None)
            self.finish(i, COMPLETED, out.time_s, worker=w.worker_id)
            spec, r = self.outcomes.specs[i], self.trace[i]
            self.observe(construct(
                Completed, event_time_ms=now_ms, request_id=rid, task_id=r.task_id,
                tenant=r.tenant, model=r.model, worker_id=w.worker_id, attempt=attempt,
                prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens,
                cached_tokens=min(out.cached_tokens, spec.prompt_tokens),
                finish_reason=out.finish_reason, e2e_s=out.time_s - spec.arrival_s), now_ms)

    def finish(self, i: int, state: str, t: float, reason: str | None = None,
               worker: str | None = None, retry_after_s: float | None = None) -> None:
        """Request ``i`` reached ``state`` (a second terminal state is only counted);
        ``retry_after_s``: a rejection's hint, as the router publishes it (a refusal with one,
        ``rate_limited`` or ``no_capacity``, fails no task)."""
        if self.outcomes.finish(i, state, t, reason, worker):
            self.where.pop(f"r{i}", None)
            self.done += 1
            if self.on_end is not None:
                self.on_end(i)
            if state == REJECTED:  # the router publishes it; the autoscaler counts no_capacity
                r = self.trace[i]
                self.observe(construct(Rejected, event_time_ms=ms(t), request_id=f"r{i}",
                                       task_id=r.task_id, tenant=r.tenant, model=r.model,
                                       reason=reason, retry_after_s=retry_after_s), ms(t))
