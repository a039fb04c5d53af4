"""Task admission under overload: when the tasks in progress need more than the fleet can do,
the largest new ones are refused before they start. Pure: time is passed in.

Load shedding acts on measured pressure (queues, KV use). By the time that rises, the tasks it
will fail have started and spent GPU time on their first steps, and a workflow that fails at its
fifth step wastes four. A task's size is known when it starts (its first request states how many
steps it has), so the router chooses which tasks to start instead:

- a new task (a request at step 1; a request outside any task is a task of one step) gets an
  expected work: the GPU-seconds its steps take at a worker's best throughput, with the prefix
  cache missing the share of prompt tokens its model's workers report it has missed lately
  (``expected_work_s``, ``CacheMisses``);
- the task is spread over its span: ``steps_total - 1`` gaps between consecutive steps'
  arrivals, the upper quartile of those its model's tasks have had lately (measured from the
  later steps the router sees), and a step's own time (its mean step's work: a lower bound);
  while no gap is measured, or if shorter, over ``window_s``. It is in progress over that span
  from when its client sent it, at its work over the span a second (all of them spread again
  when the gap moves by a tenth);
- the offered load of a model is the rate of its tasks in progress (those refused too), over
  what its live workers do a second (one GPU-second each; with several routers, this router's
  share of the requests). In steady state that is the rate of task starts times their work, as
  when each task's work counted in the window of its start; in a burst it is the work the
  conversations send a second, not all of their turns at once (a step is sent when the one
  before it has been answered, a user's next turn some seconds later);
- while the offered load exceeds ``target_load``, new tasks are admitted by priority (higher
  first), then by expected work (smaller first; equal ones in order of arrival), up to
  ``target_load`` of what the fleet does a second: a task of several steps that starts past
  that mark is refused (``load_shed``) before it spends anything. A request of one step is
  never refused here (request shedding judges it with its queue in view); its work counts.
  Serving the small tasks first completes the most tasks for the GPU time there is.

At ``target_load`` 1 the line is the fleet's best throughput: offered work below it can all be
served (it may queue for a while), so nothing is refused. The first tasks a router sees are
the tasks in progress (a router started mid-stream weighs those it has not seen the start of
for none). On the ShareGPT workload of the simulator (``tests/unit/infra/
test_sim_task_admission.py``, two H100s, steps sent closed loop) it refuses none of the 332
conversations at 14x, which the fleet serves; with 1,882 conversations at 14x it refuses the
long ones, and more tasks succeed (1,015 against 937) at a lower SLO attainment of requests
(0.40 against 0.43); the other workloads have no multi-step tasks and do not change.
"""

import bisect
import dataclasses
import heapq
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
#: Tasks remembered per model (in progress; and by their latest step, for the gap between
#: steps): a bound for traffic far beyond any fleet.
MAX_WINDOW_TASKS = 50_000
#: Gaps between steps the upper quartile is taken over; a task not heard of for this long is
#: forgotten (its user gone: no gap measured).
GAP_SAMPLES, MAX_GAP_S = 63, 600.0
#: The change in the gap between steps that has the tasks in progress reckoned again.
REGAP = 1.1
#: The prefix-cache counts of a window are kept in this many buckets of time at most (one a
#: heartbeat, a worker's every 0.5 s, would be 7M at a window of an hour and 1,000 workers).
MISS_BUCKETS = 1_000
#: Request priorities (0-9), and the buckets of task work each keeps its tasks' rates in.
PRIORITIES = 10
SMALLEST_WORK_S, BUCKETS_PER_OCTAVE, BUCKETS = 1e-3, 4, 128


def expected_work_s(request: InferenceRequest, perf: PerfModel,
                    miss_rate: float | None = None, answer_tokens: float | None = None) -> float:
    """GPU-seconds of all of a task's steps at a worker's best throughput, from its first request.

    Step ``i`` re-sends the conversation so far, about ``i`` prompts of this size and ``i - 1``
    answers of ``answer_tokens`` (None: ``max_tokens``). It prefills its new part, or
    ``miss_rate`` of all of it where that is more (the share of prompt tokens the prefix cache
    has been missing; None: the rest is always cached). Its answer is decoded in the largest
    batch the KV cache holds at that context, each token costing its share of the batch's
    step."""
    prompt = request.prompt_tokens
    answer = request.max_tokens if answer_tokens is None else max(round(answer_tokens), 1)
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
    """The share of prompt tokens each model's prefix caches missed in the last ``window_s`` (to
    a ``MISS_BUCKETS``-th of it), from the cumulative counters its workers' heartbeats carry
    (None until one has reported twice)."""

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
                    now_s, queries - last[0], hits - last[1], window_s / MISS_BUCKETS)
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
    """One model's prefix-cache queries and hits in the window, by bucket of time."""

    def __init__(self) -> None:
        #: (the bucket's first count's time, queries, hits): a bucket expires as a whole
        self.deltas: deque[tuple[float, int, int]] = deque()
        self.queries = self.hits = 0

    def add(self, at_s: float, queries: int, hits: int, bucket_s: float) -> None:
        """Counts heard at ``at_s``: in the newest bucket if it began less than ``bucket_s``
        before, else in a new one."""
        deltas = self.deltas
        if deltas and at_s - deltas[-1][0] < bucket_s:
            since, in_queries, in_hits = deltas[-1]
            deltas[-1] = (since, in_queries + queries, in_hits + hits)
        else:
            deltas.append((at_s, queries, hits))
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
    ends_s: float  # in progress until then
    priority: int
    work_s: float  # its expected work: its place in the order
    steps: int
    rate: float  # its work a second while in progress
    admitted: bool


def _task(started_s: float, priority: int, work_s: float, steps: int, admitted: bool,
          gap_s: float | None, window_s: float) -> _Task:
    """A task's work spread over its span, ``steps - 1`` gaps of ``gap_s`` and its mean step's
    work (a lower bound on a step's time), or over ``window_s`` if longer (or ``gap_s`` is None:
    none measured yet)."""
    span_s = window_s if gap_s is None else max(window_s, (steps - 1) * gap_s + work_s / steps)
    return _Task(started_s, started_s + span_s, priority, work_s, steps, work_s / span_s,
                 admitted)


class _InProgress:
    """The tasks of one model in progress (the refused ones too: they are offered load), and
    their rates by priority and by work (log-spaced buckets, ``_bucket``), so that the rate of
    the tasks ahead of a new one is summed over buckets rather than over every task."""

    def __init__(self) -> None:
        self.gap_s: float | None = None  # the gap between steps their spans are reckoned at
        self._clear()

    def _clear(self) -> None:
        self.tasks: dict[tuple[str, str], _Task] = {}
        self.rate = 0.0
        self._by_priority = [0.0] * PRIORITIES
        self._buckets = [[0.0] * BUCKETS for _ in range(PRIORITIES)]
        # each bucket's tasks' works, sorted, and their rates in that order
        self._members: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        self._ends: list[tuple[float, int, tuple[str, str]]] = []  # a heap: (end, seq, key)
        self._added = 0

    def reckon(self, gap_s: float, window_s: float) -> None:
        """Spreads every task in progress over its span at ``gap_s`` between steps (the tasks
        that started before the gap was known, or in a burst, included)."""
        tasks = self.tasks
        self._clear()
        self.gap_s = gap_s
        for key, t in tasks.items():
            self.add(key, _task(t.started_s, t.priority, t.work_s, t.steps, t.admitted, gap_s,
                                window_s))

    def add(self, key: tuple[str, str], task: _Task) -> None:
        self.tasks[key] = task
        self._count(task, 1)
        self._added += 1
        heapq.heappush(self._ends, (task.ends_s, self._added, key))

    def expire(self, now_s: float) -> None:
        """Forgets the tasks ended by ``now_s`` and, past ``MAX_WINDOW_TASKS``, the first to end."""
        ends = self._ends
        while ends and (ends[0][0] <= now_s or len(ends) > MAX_WINDOW_TASKS):
            self._count(self.tasks.pop(heapq.heappop(ends)[2]), -1)
        if not self.tasks:  # no float residue from a long run of additions and removals
            self.rate = 0.0
            self._by_priority = [0.0] * PRIORITIES
            self._buckets = [[0.0] * BUCKETS for _ in range(PRIORITIES)]

    def ahead(self, priority: int, work_s: float) -> float:
        """The rate of the tasks that come before a new one of ``priority`` and ``work_s``:
        higher priority, or the same priority and no more work (an equal one started earlier)."""
        bucket = _bucket(work_s)
        return (sum(self._by_priority[priority + 1:]) + sum(self._buckets[priority][:bucket])
                + self._up_to(priority, bucket, work_s))

    def _up_to(self, priority: int, bucket: int, work_s: float) -> float:
        """The rate of one bucket's tasks of no more work than ``work_s``. Its members are
        sorted: the shorter side of the cut is summed, the other is the bucket's total less it
        (tasks of one template fill few buckets, with tens of thousands each)."""
        works, rates = self._members.get((priority, bucket), ([], []))
        cut = bisect.bisect_right(works, work_s)
        if cut <= len(works) // 2:
            return sum(rates[:cut])
        return self._buckets[priority][bucket] - sum(rates[cut:])

    def _count(self, task: _Task, sign: int) -> None:
        bucket = _bucket(task.work_s)
        self.rate += sign * task.rate
        self._by_priority[task.priority] += sign * task.rate
        self._buckets[task.priority][bucket] += sign * task.rate
        works, rates = self._members.setdefault((task.priority, bucket), ([], []))
        if sign > 0:
            at = bisect.bisect_right(works, task.work_s)
            works.insert(at, task.work_s)
            rates.insert(at, task.rate)
        else:
            at = bisect.bisect_left(works, task.work_s)
            while rates[at] != task.rate:  # (equal works, spread over other spans)
                at += 1
            del works[at], rates[at]
            if not works:
                del self._members[(task.priority, bucket)]


class _Gaps:
    """The time between consecutive steps' arrivals of one model's tasks: the upper quartile of
    the last ``GAP_SAMPLES`` measured, from the latest step seen of each task. A quantile, so
    that a user gone for an hour is one sample of many and moves it little (and a task not
    heard of for ``MAX_GAP_S`` is forgotten); the upper quartile, as the gaps measured in a
    burst are the ones that have ended, the shorter ones first."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], tuple[float, float, int]] = {}  # (heard, sent, step)
        self.samples: deque[float] = deque()
        self._sorted: list[float] = []

    def gap_s(self) -> float | None:
        return self._sorted[len(self._sorted) * 3 // 4] if self._sorted else None

    def heard(self, key: tuple[str, str], step: int, sent_s: float, now_s: float) -> None:
        """Step ``step`` of task ``key``, sent at ``sent_s``, heard at ``now_s``."""
        latest = self.latest
        last = latest.get(key)
        if last is not None and last[0] < now_s - MAX_GAP_S:
            last = None  # forgotten, though no traffic since ran the expiry: no gap
        # A step asked about again (held, then routed again) is no step: the first is kept where
        # it is, as ``expire`` reads them in the order they were heard.
        if last is None or step > last[2] and sent_s >= last[1]:
            latest.pop(key, None)
            latest[key] = (now_s, sent_s, step)
            if last is not None:  # (steps this router did not see are gaps in between)
                self._sample((sent_s - last[1]) / (step - last[2]))
        self.expire(now_s)

    def expire(self, now_s: float) -> None:
        """Forgets tasks not heard of for ``MAX_GAP_S``; past ``MAX_WINDOW_TASKS``, the oldest."""
        latest = self.latest
        while latest:
            key = next(iter(latest))
            if latest[key][0] >= now_s - MAX_GAP_S and len(latest) <= MAX_WINDOW_TASKS:
                break
            del latest[key]

    def _sample(self, gap_s: float) -> None:
        self.samples.append(gap_s)
        bisect.insort(self._sorted, gap_s)
        if len(self.samples) > GAP_SAMPLES:
            del self._sorted[bisect.bisect_left(self._sorted, self.samples.popleft())]


def _bucket(work_s: float) -> int:
    """Log-spaced: ``BUCKETS_PER_OCTAVE`` a doubling, from ``SMALLEST_WORK_S``."""
    if work_s <= SMALLEST_WORK_S:
        return 0
    return min(BUCKETS - 1, int(math.log2(work_s / SMALLEST_WORK_S) * BUCKETS_PER_OCTAVE))


class TaskAdmission:
    def __init__(self, config: TaskAdmissionConfig = TaskAdmissionConfig()) -> None:
        self.config = config
        self._in_progress: dict[str, _InProgress] = {}
        self._gaps: dict[str, _Gaps] = {}
        self.cache_misses = CacheMisses()

    def heard(self, status: WorkerStatus, now_ms: int) -> None:
        """A worker's heartbeat: its prefix cache's counters."""
        self.cache_misses.heard(status, now_ms / 1000, self.config.window_s)

    def configure(self, config: TaskAdmissionConfig) -> None:
        self.config = config

    def admit(self, request: InferenceRequest, workers: list[WorkerView], now_ms: int,
              share: float = 1.0, answer_tokens: float | None = None) -> Denial | None:
        """None when ``request`` may start, else why not. Only a task's first step is judged, and
        only a task of several steps refused; its later steps measure the gap between steps
        (where a worker serves its model: one that waits for one is measured once routed).
        ``workers``: the live workers of its model; ``share``: the share of all requests this
        router reads; ``answer_tokens``: how long its answers are expected to run (None: its
        ``max_tokens``). A task asked about again (held for want of a worker, then routed again)
        gets the same answer and is counted once."""
        config = self.config
        if not config.enabled:
            return None
        now_s = now_ms / 1000
        # When the client sent it: a backlog read at once (a router starting) keeps its pace.
        sent_s = min(request.created_ms, now_ms) / 1000
        key = (request.tenant, request.task_id or request.request_id)
        if not workers:  # (a client names the model: before 7 Dec a later step of a model no
            return None  # worker serves kept an entry of its name for good)
        if request.step != 1:
            if request.task_id:
                self._gaps_of(request.model).heard(key, request.step, sent_s, now_s)
            return None
        for in_progress in self._in_progress.values():  # (a model gone quiet keeps nothing long)
            in_progress.expire(now_s)
        for gaps in self._gaps.values():
            gaps.expire(now_s)
        tasks = self._in_progress.get(request.model)
        if tasks is None:
            tasks = self._in_progress[request.model] = _InProgress()
        gaps = self._gaps.get(request.model)
        gap_s = gaps.gap_s() if gaps is not None else None
        if gap_s is not None and (tasks.gap_s is None
                                  or not 1 / REGAP <= gap_s / tasks.gap_s <= REGAP):
            tasks.reckon(gap_s, config.window_s)
        # What the live workers do a second at the target load, in GPU-seconds.
        capacity = config.target_load * len(workers) * share
        task = tasks.tasks.get(key)
        if task is None:
            misses = self.cache_misses.rate(request.model, now_s, config.window_s)
            kinds = Counter((w.gpu_type, w.gpus) for w in workers)  # an average live worker's
            work = sum(n * expected_work_s(request, perf_model(gpu, request.model, gpus), misses,
                                           answer_tokens)
                       for (gpu, gpus), n in kinds.items()) / len(workers)
            task = _task(sent_s, request.priority, work, request.steps_total, True, tasks.gap_s,
                         config.window_s)
            # Admitted when all fits; else when the rate ahead of it leaves it room to start (a
            # task larger than the whole fleet starts when nothing is ahead of it).
            if not (request.steps_total == 1 or tasks.rate + task.rate <= capacity
                    or tasks.ahead(request.priority, work) < capacity):
                task = dataclasses.replace(task, admitted=False)
            tasks.add(key, task)
            if task.admitted and request.task_id:  # (a refused one's later steps are not sent)
                self._gaps_of(request.model).heard(key, 1, sent_s, now_s)
        if task.admitted:
            return None
        what = f"task {request.task_id}" if request.task_id else "the request"
        load = tasks.rate / capacity * config.target_load
        return Denial(
            "load_shed",
            f"{what} needs about {task.work_s:.1f} GPU-seconds; the tasks in progress need "
            f"{load:.2f}x what the {len(workers)} live workers can do (target "
            f"{config.target_load:g}x): the larger and lower-priority ones are refused",
            retry_after_s=config.window_s)

    def _gaps_of(self, model: str) -> _Gaps:
        gaps = self._gaps.get(model)
        if gaps is None:
            gaps = self._gaps[model] = _Gaps()
        return gaps
