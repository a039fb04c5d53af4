"""Task admission under overload: when the tasks starting need more than the fleet can do, the
largest are refused before they start. Pure: time is passed in.

Load shedding acts on measured pressure (queues, KV use). By the time that rises, the tasks it
will fail have started and spent GPU time on their first steps, and a workflow that fails at its
fifth step wastes four. A task's size is known when it starts (its first request states how many
steps it has), so the router chooses which tasks to start instead:

- a new task (a request at step 1; a request outside any task is a task of one step) gets an
  expected work: the GPU-seconds its steps take at a worker's best throughput, with the prefix
  cache missing the share of prompt tokens its model's workers report it has missed lately
  (``expected_work_s``, ``CacheMisses``);
- the offered load of a model is the expected work of the tasks that started in the last
  ``window_s`` (those refused too), over what its live workers do in that time (one GPU-second
  per second each; with several routers, this router's share of the requests);
- while the offered load exceeds ``target_load``, new tasks are admitted by priority (higher
  first), then by expected work (smaller first; equal ones in order of arrival), up to
  ``target_load`` of the fleet's work in the window: a task of several steps that starts past
  that mark is refused (``load_shed``) before it spends anything. A request of one step is
  never refused here (request shedding judges it with its queue in view); its work counts.
  Serving the small tasks first completes the most tasks for the GPU time there is.

At ``target_load`` 1 the line is the fleet's best throughput: offered work below it can all be
served (it may queue for a while), so nothing is refused. Measured with ``governor bench``
(benchmarks/results/ANALYSIS.md): on ShareGPT workflows at 14x on two H100s it turns a 14%
saving into 26% at better SLO attainment, a burst that starts the run (after a quiet 30 s
window the average reacts too late: 14%); at 4x it refuses nothing; the other workloads have
no multi-step tasks and do not change.
"""

import bisect
import math
from collections import Counter, deque
from dataclasses import dataclass

from controllers.router.admission import Denial
from controllers.router.candidates import perf_model
from controllers.router.fleet import WorkerView
from schemas.config import TaskAdmissionConfig
from schemas.events import WorkerStatus
from schemas.requests import InferenceRequest
from workers.sim.perf import PerfModel

#: vLLM's default ``max_num_seqs``: the largest decode batch.
MAX_BATCH = 256
#: Steps estimated one by one; each further step counts as the last of these (a lower bound).
ESTIMATED_STEPS = 64
#: The least time an offered load is measured over (the first tasks a router sees).
MIN_SPAN_S = 1.0
#: Tasks remembered per model: a bound on the window for traffic far beyond any fleet.
MAX_WINDOW_TASKS = 50_000
#: Request priorities (0-9), and the buckets of task work each keeps its window's work in.
PRIORITIES = 10
SMALLEST_WORK_S, BUCKETS_PER_OCTAVE, BUCKETS = 1e-3, 4, 128


def expected_work_s(request: InferenceRequest, perf: PerfModel,
                    miss_rate: float | None = None) -> float:
    """GPU-seconds of all of a task's steps at a worker's best throughput, from its first request.

    Step ``i`` re-sends the conversation so far, about ``i`` prompts of this size and ``i - 1``
    answers of ``max_tokens``. It prefills its new part, or ``miss_rate`` of all of it where
    that is more (the share of prompt tokens the prefix cache has been missing; None: the rest
    is always cached). Its answer is decoded in the largest batch the KV cache holds at that
    context, each token costing its share of the batch's step."""
    prompt, answer = request.prompt_tokens, request.max_tokens
    kv_tokens = perf.kv_capacity_tokens()
    work = step = 0.0
    for i in range(1, min(request.steps_total, ESTIMATED_STEPS) + 1):
        context = i * prompt + (i - 1) * answer
        prefilled = prompt if i == 1 else prompt + answer
        if miss_rate is not None:
            prefilled = max(prefilled, int(context * miss_rate))
        batch = max(1, min(MAX_BATCH, kv_tokens // (context + answer)))
        step = (perf.prefill_s(prefilled)
                + answer * perf.decode_step_s(batch, context + answer / 2) / batch)
        work += step
    return work + max(0, request.steps_total - ESTIMATED_STEPS) * step


class CacheMisses:
    """The share of prompt tokens each model's prefix caches missed in the last ``window_s``, from
    the cumulative counters its workers' heartbeats carry (None until one has reported twice)."""

    def __init__(self) -> None:
        # worker -> (queries, hits) last reported, and when
        self._last: dict[str, tuple[int, int, float]] = {}
        self._models: dict[str, _Misses] = {}
        self._swept_s = 0.0

    def heard(self, status: WorkerStatus, now_s: float, window_s: float) -> None:
        """A heartbeat, heard at ``now_s`` (the router's time: workers' clocks differ)."""
        queries, hits = status.prefix_cache_queries, status.prefix_cache_hits
        last = self._last.get(status.worker_id)
        self._last[status.worker_id] = (queries, hits, now_s)
        if now_s - self._swept_s > window_s:  # workers gone quiet: forgotten once a window
            self._swept_s = now_s
            for worker in [w for w, (*_, at) in self._last.items() if at < now_s - window_s]:
                del self._last[worker]
        # (none for a worker that reports no prefix cache, its counters staying 0, nor for one
        # that restarted, its counters starting again)
        if last is not None and queries > last[0] and hits >= last[1]:
            for model in status.models_loaded:
                self._models.setdefault(model, _Misses()).add(
                    now_s, queries - last[0], hits - last[1])
        for misses in self._models.values():
            misses.expire(now_s - window_s)

    def rate(self, model: str, now_s: float, window_s: float) -> float | None:
        misses = self._models.get(model)
        if misses is None:
            return None
        misses.expire(now_s - window_s)
        if not misses.queries:
            return None
        return min(1.0, max(0.0, 1 - misses.hits / misses.queries))


class _Misses:
    """One model's prefix-cache queries and hits in the window."""

    def __init__(self) -> None:
        self.deltas: deque[tuple[float, int, int]] = deque()  # (at, queries, hits)
        self.queries = self.hits = 0

    def add(self, at_s: float, queries: int, hits: int) -> None:
        self.deltas.append((at_s, queries, hits))
        self.queries += queries
        self.hits += hits

    def expire(self, before_s: float) -> None:
        while self.deltas and self.deltas[0][0] < before_s:
            _, queries, hits = self.deltas.popleft()
            self.queries -= queries
            self.hits -= hits


@dataclass(frozen=True, slots=True)
class _Task:
    started_s: float
    priority: int
    work_s: float
    admitted: bool


class _Window:
    """The tasks of one model that started in the last ``window_s``, in order of start, and their
    work by priority and by size (log-spaced buckets, ``_bucket``), so that the work ahead of a
    new task is summed over buckets rather than over every task."""

    def __init__(self, since_s: float) -> None:
        self.since_s = since_s  # the oldest start the window can hold
        self.tasks: dict[tuple[str, str], _Task] = {}
        self.work_s = 0.0
        self._by_priority = [0.0] * PRIORITIES
        self._buckets = [[0.0] * BUCKETS for _ in range(PRIORITIES)]
        self._members: dict[tuple[int, int], list[float]] = {}  # its tasks' work, sorted

    def span_s(self, now_s: float, window_s: float) -> float:
        """The time the window's work came in over: ``window_s``; or, while the tasks seen go
        back less far, the time since the first of them (at least ``MIN_SPAN_S``)."""
        return min(window_s, max(now_s - self.since_s, MIN_SPAN_S))

    def add(self, key: tuple[str, str], task: _Task) -> None:
        self.tasks[key] = task
        self._count(task, 1)

    def expire(self, before_s: float) -> None:
        while self.tasks:
            key = next(iter(self.tasks))
            oldest = self.tasks[key]
            if oldest.started_s >= before_s and len(self.tasks) <= MAX_WINDOW_TASKS:
                break
            del self.tasks[key]
            self._count(oldest, -1)
            self.since_s = max(self.since_s, oldest.started_s)  # what is left covers less
        if not self.tasks:  # no float residue from a long run of additions and removals
            self.work_s = 0.0
            self._by_priority = [0.0] * PRIORITIES
            self._buckets = [[0.0] * BUCKETS for _ in range(PRIORITIES)]

    def ahead_s(self, priority: int, work_s: float) -> float:
        """The work of the window's tasks that come before a new one of ``priority`` and
        ``work_s``: higher priority, or the same priority and no more work (an equal one
        started earlier)."""
        bucket = _bucket(work_s)
        return (sum(self._by_priority[priority + 1:]) + sum(self._buckets[priority][:bucket])
                + self._up_to(priority, bucket, work_s))

    def _up_to(self, priority: int, bucket: int, work_s: float) -> float:
        """The work of one bucket's tasks of no more than ``work_s``. Its members are sorted:
        the shorter side of the cut is summed, the other is the bucket's total less it (a
        window of similar tasks fills few buckets, with tens of thousands each)."""
        members = self._members.get((priority, bucket), [])
        cut = bisect.bisect_right(members, work_s)
        if cut <= len(members) // 2:
            return sum(members[:cut])
        return self._buckets[priority][bucket] - sum(members[cut:])

    def _count(self, task: _Task, sign: int) -> None:
        bucket = _bucket(task.work_s)
        self.work_s += sign * task.work_s
        self._by_priority[task.priority] += sign * task.work_s
        self._buckets[task.priority][bucket] += sign * task.work_s
        members = self._members.setdefault((task.priority, bucket), [])
        if sign > 0:
            bisect.insort(members, task.work_s)
        else:
            del members[bisect.bisect_left(members, task.work_s)]
            if not members:
                del self._members[(task.priority, bucket)]


def _bucket(work_s: float) -> int:
    """Log-spaced: ``BUCKETS_PER_OCTAVE`` a doubling, from ``SMALLEST_WORK_S``."""
    if work_s <= SMALLEST_WORK_S:
        return 0
    return min(BUCKETS - 1, int(math.log2(work_s / SMALLEST_WORK_S) * BUCKETS_PER_OCTAVE))


class TaskAdmission:
    def __init__(self, config: TaskAdmissionConfig = TaskAdmissionConfig()) -> None:
        self.config = config
        self._windows: dict[str, _Window] = {}
        self.cache_misses = CacheMisses()

    def heard(self, status: WorkerStatus, now_ms: int) -> None:
        """A worker's heartbeat: its prefix cache's counters."""
        self.cache_misses.heard(status, now_ms / 1000, self.config.window_s)

    def configure(self, config: TaskAdmissionConfig) -> None:
        self.config = config

    def admit(self, request: InferenceRequest, workers: list[WorkerView], now_ms: int,
              share: float = 1.0) -> Denial | None:
        """None when ``request`` may start, else why not. Only a task's first step is judged, and
        only a task of several steps refused; ``workers``: the live workers of its model;
        ``share``: the share of all requests this router reads. A task asked about again (held
        for want of a worker, then routed again) gets the same answer and is counted once."""
        config = self.config
        if not config.enabled or request.step != 1 or not workers:
            return None
        now_s = now_ms / 1000
        # When the client sent it: a backlog read at once (a router starting) keeps its pace.
        started_s = min(request.created_ms, now_ms) / 1000
        for window in self._windows.values():  # (a model gone quiet keeps nothing for long)
            window.expire(now_s - config.window_s)
        window = self._windows.get(request.model)
        if window is None:
            window = self._windows[request.model] = _Window(started_s)
        window.since_s = min(window.since_s, started_s)
        # What the live workers do in the window at the target load, in GPU-seconds.
        capacity_s = (config.target_load * len(workers) * share
                      * window.span_s(now_s, config.window_s))
        key = (request.tenant, request.task_id or request.request_id)
        task = window.tasks.get(key)
        if task is None:
            misses = self.cache_misses.rate(request.model, now_s, config.window_s)
            gpus = Counter(w.gpu_type for w in workers)  # the work on an average live worker
            work = sum(n * expected_work_s(request, perf_model(gpu, request.model), misses)
                       for gpu, n in gpus.items()) / len(workers)
            # Admitted when all fits; else when the work ahead of it leaves it room to start (a
            # task larger than the whole window starts when nothing is ahead of it).
            admitted = (request.steps_total == 1 or window.work_s + work <= capacity_s
                        or window.ahead_s(request.priority, work) < capacity_s)
            task = _Task(started_s, request.priority, work, admitted)
            window.add(key, task)
        if task.admitted:
            return None
        what = f"task {request.task_id}" if request.task_id else "the request"
        load = window.work_s / capacity_s * config.target_load
        return Denial(
            "load_shed",
            f"{what} needs about {task.work_s:.1f} GPU-seconds; the tasks starting need "
            f"{load:.2f}x what the {len(workers)} live workers can do (target "
            f"{config.target_load:g}x): the larger and lower-priority ones are refused",
            retry_after_s=config.window_s)
