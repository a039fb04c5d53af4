"""A run's tally of lifecycle events and response streams, for the demo's report. Pure.

It counts each request's terminal states (the invariant is exactly one, counted as the
analytics audit counts it), measures time to first token, and checks every response stream token
by token against the deterministic reference: offsets contiguous from 0, no duplicate, no gap.
"""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from schemas.base import Message
from schemas.commands import SetBreakerState
from controllers.router.admission import value_of
from schemas.events import (
    TERMINAL_EVENT_TYPES, Completed, Failed, FirstToken, Queued, Rejected, Started, WorkerStatus,
)
from schemas.requests import ResponseChunk
from workers.engine import reference_token


@dataclass
class _Stream:
    next_offset: int = 0
    attempt: int = 1  # the newest attempt read
    broken_at: int | None = None  # the first offset of a gap or a wrong token
    final: bool = False
    answered: bool = False  # ended in an answer ("stop", "length"), not cancelled or failed

    @property
    def broken(self) -> bool:
        return self.broken_at is not None

    def break_at(self, offset: int) -> None:
        self.broken_at = offset if self.broken_at is None else min(self.broken_at, offset)


@dataclass
class RunTally:
    """Everything observed about requests whose ids start with ``prefix``."""

    prefix: str
    sent: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)
    terminal: dict[str, Counter] = field(default_factory=dict)
    ttft_s: dict[str, float] = field(default_factory=dict)
    #: the least TTFT of each request's continuations' first tokens (resumed after tokens were
    #: streamed: no TTFT sample, as the streams and ``report slo`` take it); it bounds the SLO
    #: of a request whose first one was lost
    continuation_ttft_s: dict[str, float] = field(default_factory=dict)
    workers_seen: set[int] = field(default_factory=set)
    resumed: set[str] = field(default_factory=set)  # requests served by more than one attempt
    #: worker -> when its breaker opened, each time (from another state: the controllers
    #: restate an open breaker every few seconds)
    breaker_opened_ms: dict[str, list[int]] = field(default_factory=dict)
    _breakers: dict[str, str] = field(default_factory=dict)  # worker -> its breaker's state
    accepted_info: dict[str, Queued] = field(default_factory=dict)
    rejected_reasons: dict[str, str] = field(default_factory=dict)
    e2e_s: dict[str, float] = field(default_factory=dict)
    sent_value: dict[str, float] = field(default_factory=dict)
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _reports: dict[str, Counter] = field(default_factory=dict)  # (type, attempt) -> count
    _newest: dict[str, tuple[int, str]] = field(default_factory=dict)  # (attempt, its worker)

    def observe(self, message: Message) -> None:
        if isinstance(message, WorkerStatus):
            if message.state != "stopped":
                self.workers_seen.add(message.slot)
            return
        if isinstance(message, SetBreakerState):
            if message.state == "open" and self._breakers.get(message.worker_id) != "open":
                self.breaker_opened_ms.setdefault(message.worker_id, []).append(
                    message.event_time_ms)
            self._breakers[message.worker_id] = message.state
            return
        request_id = getattr(message, "request_id", "")
        if not request_id.startswith(self.prefix):
            return
        if isinstance(message, ResponseChunk):
            self._observe_chunk(message)
        elif isinstance(message, Queued):
            self.queued.add(request_id)
            self.accepted_info[request_id] = message
        elif isinstance(message, Started):
            if message.attempt > 1:
                self.resumed.add(request_id)
            newest = self._newest.get(request_id)
            if newest is None or message.attempt > newest[0]:
                self._newest[request_id] = (message.attempt, message.worker_id)
        elif isinstance(message, FirstToken) and message.tokens_done:
            self.continuation_ttft_s[request_id] = min(
                message.ttft_s, self.continuation_ttft_s.get(request_id, message.ttft_s))
        elif isinstance(message, FirstToken):
            self.ttft_s.setdefault(request_id, message.ttft_s)
        elif isinstance(message, Failed) and self._replaced(message):
            pass  # a replaced attempt failing late: the newer attempt goes on (as the audit)
        elif message.type in TERMINAL_EVENT_TYPES:
            self.terminal.setdefault(request_id, Counter())[message.type] += 1
            self._reports.setdefault(request_id, Counter())[
                (message.type, getattr(message, "attempt", None) or 0)] += 1
            if isinstance(message, Rejected):
                self.rejected_reasons[request_id] = message.reason
            elif isinstance(message, Completed):
                self.e2e_s[request_id] = message.e2e_s

    def _replaced(self, failed: Failed) -> bool:
        """Whether ``failed`` is of an attempt a newer started one replaced: told by its
        attempt, or where it names none (a worker older than the field) by its worker."""
        newest = self._newest.get(failed.request_id)
        if newest is None:
            return False
        if failed.attempt is not None:
            return failed.attempt < newest[0]
        return failed.worker_id is not None and failed.worker_id != newest[1]

    def _observe_chunk(self, chunk: ResponseChunk) -> None:
        """Read as a client reads a stream (README, "Reading a response stream"): by token
        offset, the newest attempt winning until a final chunk settles the stream. A chunk of
        an attempt older than one already read is dropped (a worker the router had given up
        on, streaming until it learns); the first chunk of a newer attempt replaces what the
        reader has from its offset on; once a final chunk is read, other attempts' chunks are
        dropped."""
        stream = self._streams.setdefault(chunk.request_id, _Stream())
        if chunk.attempt < stream.attempt or (stream.final and chunk.attempt != stream.attempt):
            return  # an older attempt's; or the answer is whole (a continuation the router
            # made before it read the end, then cancelled, replaces nothing)
        if chunk.attempt > stream.attempt:
            stream.attempt = chunk.attempt
            if chunk.token_offset < stream.next_offset:
                stream.next_offset = chunk.token_offset
                stream.final = stream.answered = False
                if stream.broken_at is not None and stream.broken_at >= chunk.token_offset:
                    stream.broken_at = None  # what was wrong from there on is replaced
        if chunk.token_offset > stream.next_offset:
            stream.break_at(stream.next_offset)  # a gap: tokens the client never received
        for index, token in enumerate(chunk.tokens, start=chunk.token_offset):
            if token != reference_token(chunk.request_id, index):
                stream.break_at(index)
        # A redelivered chunk repeats offsets the client already has; readers drop it by offset.
        stream.next_offset = max(stream.next_offset, chunk.token_offset + len(chunk.tokens))
        if chunk.final and not stream.final:
            stream.final, stream.answered = True, chunk.finish_reason in ("stop", "length")

    @property
    def streams_unfinished(self) -> int:
        """Requests that ended (any terminal state) whose stream was not read to its final
        chunk: a client reading only its stream would wait for ever."""
        return sum(1 for rid in self.terminal
                   if rid not in self._streams or not self._streams[rid].final)

    @property
    def finished(self) -> int:
        return sum(1 for rid in self.sent if rid in self.terminal)

    def count(self, kind: str) -> int:
        return sum(1 for c in self.terminal.values() if c[kind])

    def record_sent(self, request) -> None:
        """A request the run produced (an ``InferenceRequest``)."""
        self.sent.add(request.request_id)
        self.sent_value[request.request_id] = value_of(
            request.priority, request.step, request.steps_total, request.deadline_ms is not None)

    def met_slo(self, request_id: str) -> bool:
        """Completed within its deadline, with its first token within its TTFT SLO."""
        info = self.accepted_info.get(request_id)
        if info is None or request_id not in self.e2e_s:
            return False
        if info.deadline_ms is not None and self.e2e_s[request_id] * 1000 > info.deadline_ms - info.created_ms:
            return False
        ttft = self.ttft_s.get(request_id, self.continuation_ttft_s.get(request_id))
        return info.ttft_slo_s is None or (ttft is not None and ttft <= info.ttft_slo_s)

    def slo_by_value(self, threshold: float = 0.5) -> dict[str, float | None]:
        """SLO attainment among accepted requests worth at least / less than ``threshold``."""
        groups: dict[str, list[bool]] = {"high_value": [], "low_value": []}
        for rid, info in self.accepted_info.items():
            value = value_of(info.priority, info.step, info.steps_total, info.deadline_ms is not None)
            groups["high_value" if value >= threshold else "low_value"].append(self.met_slo(rid))
        out: dict[str, float | None] = {
            f"slo_attainment_{k}_accepted": round(sum(v) / len(v), 4) if v else None
            for k, v in groups.items()}
        high = [rid for rid, v in self.sent_value.items() if v >= threshold]
        out["high_value_sent"] = len(high)
        out["high_value_accepted"] = sum(1 for rid in high if rid in self.accepted_info)
        return out

    def summary(self) -> dict[str, float | int | None]:
        ttfts = np.array(list(self.ttft_s.values()), dtype=float)
        streams = [s for s in self._streams.values() if s.final]
        answers = [s for s in streams if s.answered]
        return {
            "requests_sent": len(self.sent),
            "accepted": len(self.queued),
            "completed": self.count("completed"),
            "rejected": self.count("rejected"),
            "failed": self.count("failed"),
            "cancelled": self.count("cancelled"),
            "unfinished": len(self.sent) - self.finished,
            # As the audit counts them: two states, or one attempt reporting one twice; one
            # state reported by two attempts (a replaced one completed too) is work done twice.
            "multiple_terminal_states": sum(
                1 for rid, c in self.terminal.items()
                if len(c) > 1 or max(self._reports[rid].values()) > 1),
            "repeated_terminal_states": sum(
                1 for rid, c in self.terminal.items()
                if len(c) == 1 and len(self._reports[rid]) > 1
                and max(self._reports[rid].values()) == 1),
            "ttft_p50_s": _quantile(ttfts, 0.50),
            "ttft_p99_s": _quantile(ttfts, 0.99),
            "streams_verified": sum(1 for s in answers if not s.broken),
            "streams_broken": sum(1 for s in streams if s.broken),
            # ended, and its stream read without its end: its client would wait for ever
            "streams_unfinished": self.streams_unfinished,
            "slo_attainment": round(sum(self.met_slo(r) for r in self.sent) / len(self.sent), 4)
            if self.sent else None,
            **self.slo_by_value(),
            "rejected_by_reason": dict(Counter(self.rejected_reasons.values())),
            "resumed_streams": len(self.resumed),
            "resumed_streams_verified": sum(
                1 for rid in self.resumed
                if rid in self._streams and self._streams[rid].final and not self._streams[rid].broken
            ),
        }


def _quantile(values: np.ndarray, q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if len(values) else None
