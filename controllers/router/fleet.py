"""The router's view of the fleet, built from WorkerStatus heartbeats. Pure: time is passed in."""

from collections.abc import Iterable
from dataclasses import dataclass, replace

from schemas.events import WorkerStatus


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What placement knows of one worker."""

    worker_id: str
    slot: int
    pool: str
    gpu_type: str
    models: tuple[str, ...]
    running: int
    waiting: int
    last_seen_ms: int
    state: str = "warm"
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefill_backlog_tokens: int | None = None  # None: the worker does not report it
    prefill_context_tokens: int | None = None  # (idem)
    max_model_len: int | None = None  # (idem)
    gpus: int = 1  # it says (``WorkerStatus.gpus``): its engine's tensor parallelism

    def holds(self, request_tokens: int) -> bool:
        """Whether a request of this many prompt and output tokens fits its context."""
        return self.max_model_len is None or request_tokens <= self.max_model_len

    @property
    def kv_utilisation(self) -> float:
        total = self.kv_blocks_used + self.kv_blocks_free
        return self.kv_blocks_used / total if total else 0.0


#: The last heartbeat viewed and its view. One heartbeat usually reaches two FleetViews in a row
#: (the router's and the controllers'; the offline simulator hands it to both, ~110k times a run),
#: and a view is immutable, so the second gets the same one. Compared by identity: holding the
#: heartbeat keeps its id from being reused.
_last_viewed: tuple[WorkerStatus | None, "WorkerView | None"] = (None, None)


def view_of(status: WorkerStatus) -> WorkerView:
    global _last_viewed
    last, view = _last_viewed  # one read: the pair stays a pair even if threads share it
    if last is status:
        return view
    view = WorkerView(
        worker_id=status.worker_id, slot=status.slot, pool=status.pool, gpu_type=status.gpu_type,
        models=tuple(status.models_loaded), running=status.running, waiting=status.waiting,
        last_seen_ms=status.event_time_ms, state=status.state,
        kv_blocks_used=status.kv_blocks_used, kv_blocks_free=status.kv_blocks_free,
        prefill_backlog_tokens=status.prefill_backlog_tokens,
        prefill_context_tokens=status.prefill_context_tokens,
        max_model_len=status.max_model_len, gpus=status.gpus,
    )
    _last_viewed = (status, view)
    return view


#: How long after a worker said it stopped its requests count as lost. Its last events (a
#: request's end, a hand-back) went out just before, but on other partitions of the telemetry
#: topic: a router reading the stop first would end a finished request a second time. So are a
#: worker's whose engine it reports crashed (its server unreachable), counted from its first
#: heartbeat that says so: the streams cut there end or are handed back as it tells.
STOPPED_GRACE_MS = 2_000


#: How far ahead of the receiver's clock a heartbeat counts as heard (the streams'
#: ``max_event_ahead_s``). A heartbeat stamped further ahead (its host's clock stepped forward,
#: later set right by NTP) counts as heard this far ahead: taken at its own time, it would make
#: every later heartbeat of its worker look older, so they would be dropped, ``stopped`` and a
#: restart included, and the worker kept live as it was for as long as the stamp stayed ahead.
#: Clamped rather than refused (as the streams do): a worker whose clock runs ahead is still
#: heard and served; a clock set right freezes its view for at most this long.
MAX_AHEAD_MS = 10_000


def heard_ms(status: WorkerStatus, now_ms: int | None) -> int:
    """When ``status`` counts as heard: its own time, or ``MAX_AHEAD_MS`` after ``now_ms``, the
    receiver's clock, if that is earlier (None: its own time)."""
    if now_ms is None or status.event_time_ms <= now_ms + MAX_AHEAD_MS:
        return status.event_time_ms
    return now_ms + MAX_AHEAD_MS


class FleetView:
    """Latest status of every worker, and which of them are alive."""

    def __init__(self, heartbeat_timeout_ms: int = 3_000) -> None:
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self._workers: dict[str, WorkerView] = {}
        #: The receiver has read every heartbeat sent before this (its clock); None: all sent
        #: before ``now``. A receiver that reads behind (a router short of CPU) judges
        #: liveness as of then: by ``now``, a worker heard long ago may be one whose heartbeats
        #: it has not read yet, not one gone silent.
        self.heard_until_ms: int | None = None
        #: worker -> its first heartbeat of those in a row that report it crashed (a worker
        #: whose engine crashed heart-beats on)
        self._crashed_since: dict[str, int] = {}

    def judged(self, now_ms: int) -> int:
        """The time liveness is judged at: ``now_ms``, or ``heard_until_ms`` if earlier."""
        heard = self.heard_until_ms
        return now_ms if heard is None or heard >= now_ms else heard

    def observe(self, status: WorkerStatus, now_ms: int | None = None) -> bool:
        """Take a heartbeat, heard at ``now_ms`` (the receiver's clock; None: trust the
        heartbeat's own time); False for an older one delivered late (left out)."""
        at_ms = heard_ms(status, now_ms)
        known = self._workers.get(status.worker_id)
        if known is not None and known.last_seen_ms > at_ms:
            return False
        view = view_of(status)
        self.put(view if at_ms == status.event_time_ms else replace(view, last_seen_ms=at_ms))
        return True

    def put(self, worker: WorkerView) -> None:
        """Set a worker's view directly (the offline simulator does)."""
        self._workers[worker.worker_id] = worker
        if worker.state == "crashed":
            self._crashed_since.setdefault(worker.worker_id, worker.last_seen_ms)
        elif self._crashed_since:  # (at every heartbeat: nothing to do where none crashed)
            self._crashed_since.pop(worker.worker_id, None)

    def get(self, worker_id: str) -> WorkerView | None:
        return self._workers.get(worker_id)

    def forget(self, worker_ids: Iterable[str]) -> None:
        """Drop ``worker_ids`` (gone for good): a heartbeat of one heard later makes it new."""
        workers = self._workers
        for worker_id in worker_ids:
            workers.pop(worker_id, None)
            self._crashed_since.pop(worker_id, None)
        # A dict keeps the room of what it held: a pass over it (``alive``, at every request)
        # would still go over every slot of the workers dropped.
        self._workers = dict(workers)

    def alive(self, now_ms: int) -> list[WorkerView]:
        """Workers heard from within the heartbeat timeout that have not stopped, by slot."""
        horizon = self.judged(now_ms) - self.heartbeat_timeout_ms
        return sorted(
            (w for w in self._workers.values()
             if w.last_seen_ms >= horizon and w.state not in ("stopped", "crashed")),
            key=lambda w: w.slot,
        )

    def live(self, now_ms: int, model: str | None = None) -> list[WorkerView]:
        """Warm workers heard from within the heartbeat timeout (serving ``model`` if given), by
        slot. Loading, draining and sleeping workers take no new work."""
        return [
            w for w in self.alive(now_ms)
            if w.state == "warm" and (model is None or model in w.models)
        ]

    def silent(self, now_ms: int) -> set[str]:
        """Workers that stopped heart-beating, or said they stopped or crashed
        ``STOPPED_GRACE_MS`` ago or more (a crashed one: since it first said so)."""
        now_ms = self.judged(now_ms)
        horizon = now_ms - self.heartbeat_timeout_ms
        crashed = self._crashed_since
        return {w.worker_id for w in self._workers.values()
                if w.last_seen_ms < horizon
                or (w.state == "stopped" and now_ms - w.last_seen_ms >= STOPPED_GRACE_MS)
                or (w.state == "crashed"
                    and now_ms - crashed.get(w.worker_id, w.last_seen_ms) >= STOPPED_GRACE_MS)}

    def workers(self) -> list[WorkerView]:
        return list(self._workers.values())

    def __len__(self) -> int:
        return len(self._workers)
