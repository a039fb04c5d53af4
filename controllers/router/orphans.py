"""Which requests were left behind by a worker that stopped heart-beating. Pure.

From the topics alone (dispatch placements, lifecycle events, response chunks, heartbeats) it
tells, for every request that started on a worker and reached no terminal state, whether that
worker has gone silent and how many tokens the client already has, so the request can be
re-dispatched as a continuation from that offset.
"""

from dataclasses import dataclass, field

from schemas.base import Message
from schemas.events import TERMINAL_EVENT_TYPES, Requeued, Started, WorkerStatus
from schemas.requests import Dispatch, ResponseChunk


@dataclass(frozen=True, slots=True)
class Orphan:
    request_id: str
    worker_id: str
    tokens_done: int  # the next token offset the client expects


@dataclass
class _Track:
    worker_id: str
    tokens_done: int = 0
    handed_back: bool = False


@dataclass
class OrphanFinder:
    heartbeat_timeout_ms: int = 3_000
    _open: dict[str, _Track] = field(default_factory=dict)
    _last_seen: dict[str, int] = field(default_factory=dict)
    _stopped: set[str] = field(default_factory=set)
    dispatches: dict[str, Dispatch] = field(default_factory=dict)

    def observe(self, message: Message) -> None:
        match message:
            case WorkerStatus(worker_id=wid, event_time_ms=t, state=state):
                self._last_seen[wid] = max(t, self._last_seen.get(wid, 0))
                if state == "stopped":
                    self._stopped.add(wid)
            case Dispatch(request=req, worker_id=wid):
                self.dispatches[req.request_id] = message
                self._open.setdefault(req.request_id, _Track(wid)).worker_id = wid
            case Started(request_id=rid, worker_id=wid):
                self._open.setdefault(rid, _Track(wid)).worker_id = wid
            case ResponseChunk(request_id=rid, worker_id=wid, token_offset=off, tokens=tokens):
                track = self._open.get(rid)
                if track is not None and off <= track.tokens_done:
                    track.tokens_done = max(track.tokens_done, off + len(tokens))
            case Requeued(request_id=rid, tokens_done=done):
                track = self._open.get(rid)
                if track is not None:
                    track.handed_back = True
                    track.tokens_done = max(track.tokens_done, done)
            case _ if message.type in TERMINAL_EVENT_TYPES:
                self._open.pop(message.request_id, None)

    def silent_workers(self, now_ms: int) -> set[str]:
        horizon = now_ms - self.heartbeat_timeout_ms
        return {w for w, t in self._last_seen.items() if t < horizon} | self._stopped

    def orphans(self, now_ms: int) -> list[Orphan]:
        """Unfinished requests whose worker is silent or handed them back, oldest first."""
        silent = self.silent_workers(now_ms)
        return [
            Orphan(rid, track.worker_id, track.tokens_done)
            for rid, track in self._open.items()
            if track.worker_id in silent or track.handed_back
        ]
