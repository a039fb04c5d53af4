"""A trivial engine: prefill and decode at fixed token rates, up to ``max_num_seqs`` at once.

It stands in for a GPU in the first end-to-end loop; the calibrated simulated engine replaces it.
Requests wait in FIFO order for a free sequence slot. A sequence admitted at ``t`` emits its
first token after ``prompt_tokens / prefill_tokens_per_s`` and one more every
``1 / decode_tokens_per_s`` seconds. It models no GPU: ``gpus`` are those its worker bills (a
pool's workers of two GPUs each bill two, whatever the rates).
"""

import math
from collections import deque
from dataclasses import dataclass

from workers.engine import EngineRequest, EngineStats, TokenBatch, reference_token


@dataclass(slots=True)
class _Sequence:
    request: EngineRequest
    first_token_s: float
    emitted: int  # index of the next token to emit


class FixedRateEngine:
    def __init__(
        self,
        *,
        prefill_tokens_per_s: float = 10_000.0,
        decode_tokens_per_s: float = 100.0,
        max_num_seqs: int = 64,
        gpus: int = 1,
    ) -> None:
        if prefill_tokens_per_s <= 0 or decode_tokens_per_s <= 0:
            raise ValueError("token rates must be positive")
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.decode_tokens_per_s = decode_tokens_per_s
        self.max_num_seqs = max_num_seqs
        self.gpus = gpus
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[str, _Sequence] = {}

    def add(self, request: EngineRequest, now_s: float) -> None:
        if request.resume_from_token >= request.max_tokens:
            raise ValueError(f"{request.request_id}: nothing left to generate")
        self._waiting.append(request)
        self._admit(now_s)

    def abort(self, request_id: str) -> bool:
        if self._running.pop(request_id, None) is not None:
            return True
        for queued in self._waiting:
            if queued.request_id == request_id:
                self._waiting.remove(queued)
                return True
        return False

    def advance(self, now_s: float) -> list[TokenBatch]:
        out = []
        for rid, seq in list(self._running.items()):
            due = self._tokens_due(seq, now_s)
            if due <= seq.emitted:
                continue
            req = seq.request
            tokens = tuple(reference_token(rid, i) for i in range(seq.emitted, due))
            finished = due >= req.max_tokens
            first = seq.emitted == req.resume_from_token
            out.append(
                TokenBatch(
                    request_id=rid,
                    token_offset=seq.emitted,
                    tokens=tokens,
                    first=first,
                    finished=finished,
                    finish_reason="length" if finished else None,
                    time_s=self._token_s(seq, due - 1),
                    first_token_s=seq.first_token_s if first else None,
                )
            )
            seq.emitted = due
            if finished:
                del self._running[rid]
        self._admit(now_s)
        return out

    def next_event_s(self) -> float | None:
        times = [self._token_s(seq, seq.emitted) for seq in self._running.values()]
        return min(times, default=None)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=len(self._waiting),
                           gpus=self.gpus)

    def _token_s(self, seq: _Sequence, index: int) -> float:
        """When token ``index`` of the response is due."""
        decoded = index - seq.request.resume_from_token
        return seq.first_token_s + decoded / self.decode_tokens_per_s

    def _tokens_due(self, seq: _Sequence, now_s: float) -> int:
        if now_s < seq.first_token_s:
            return seq.emitted
        # The slack absorbs the rounding of ``now_s - first_token_s``, which grows with the clock's
        # magnitude, so that advancing to ``next_event_s()`` always yields the token due then.
        slack = 1e-9 + 4 * math.ulp(now_s) * self.decode_tokens_per_s
        decoded = math.floor((now_s - seq.first_token_s) * self.decode_tokens_per_s + slack)
        return min(seq.request.max_tokens, seq.request.resume_from_token + 1 + decoded)

    def _admit(self, now_s: float) -> None:
        while self._waiting and len(self._running) < self.max_num_seqs:
            req = self._waiting.popleft()
            # A continuation re-reads its prompt plus the tokens already sent.
            prefill = (req.prompt_tokens + req.resume_from_token) / self.prefill_tokens_per_s
            self._running[req.request_id] = _Sequence(req, now_s + prefill, req.resume_from_token)
