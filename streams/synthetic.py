"""A synthetic telemetry stream with known contents, for tests, the benchmark and demos.

``synthetic_telemetry`` returns heartbeats and request lifecycles in event-time order. What it
contains is known in closed form (``SyntheticCounts``), so a consumer of the signals can check
them: every ``shed_every``-th request is shed by admission (Rejected, load_shed), every
``retry_every``-th is requeued by its first worker and completed by the next one (attempt 2), and
the rest complete on their first attempt with the TTFT and e2e latency given.
"""

from dataclasses import dataclass, field

from schemas.base import Message
from schemas.events import (
    Cancelled, Completed, Failed, FirstToken, Queued, Rejected, Requeued, Started, WorkerStatus,
)
from schemas.requests import InferenceRequest


@dataclass(frozen=True)
class SyntheticCounts:
    requests: int
    completed: int
    rejected: int
    retried: int
    heartbeats: int
    lifecycle_events: int
    per_tenant_completed: dict[str, int] = field(default_factory=dict)


def _status(t: int, worker: int, pool: str, gpu: str, running: int, start: int) -> WorkerStatus:
    return WorkerStatus(event_time_ms=t, worker_id=f"worker-{worker}", slot=worker, pool=pool,
                        gpu_type=gpu, models_loaded=["llama-3-8b"], running=running,
                        kv_blocks_used=10 * running, kv_blocks_free=1000 - 10 * running,
                        started_ms=start)


def synthetic_telemetry(start_ms: int, requests: int, *, workers: int = 4, spacing_ms: int = 50,
                        ttft_ms: int = 200, e2e_ms: int = 800, output_tokens: int = 61,
                        shed_every: int = 10, retry_every: int = 7, tenants: int = 2,
                        prefix: str = "syn", heartbeat_ms: int = 500, heartbeats: bool = True,
                        ) -> tuple[list[Message], SyntheticCounts]:
    """Requests arrive every ``spacing_ms`` round-robin over ``workers`` (pools alternate
    ``h100@llama-3-8b`` and ``a100@llama-3-8b``); heartbeats every ``heartbeat_ms`` cover the
    whole span. Returns the messages sorted by event time and their counts."""
    events: list[tuple[int, int, Message]] = []
    completed = rejected = retried = 0
    per_tenant: dict[str, int] = {}
    busy: dict[str, list[tuple[int, int]]] = {}
    seq = 0

    def put(message: Message) -> None:
        nonlocal seq
        events.append((message.event_time_ms, seq, message))
        seq += 1

    for i in range(requests):
        t0 = start_ms + (heartbeat_ms if heartbeats else 0) + i * spacing_ms
        rid, tenant = f"{prefix}-{i:06d}", f"tenant-{i % tenants}"
        worker = f"worker-{i % workers}"
        common = dict(request_id=rid, tenant=tenant)
        if shed_every and i % shed_every == shed_every - 1:
            put(Rejected(event_time_ms=t0, reason="load_shed", **common))
            rejected += 1
            continue
        put(Queued(event_time_ms=t0, prompt_tokens=100, max_tokens=output_tokens, created_ms=t0,
                   deadline_ms=t0 + 10_000, **common))
        attempt, begin = 1, t0 + 10
        put(Started(event_time_ms=begin, worker_id=worker, **common))
        if retry_every and i % retry_every == retry_every - 1:
            put(Requeued(event_time_ms=begin + 50, worker_id=worker, tokens_done=0, **common))
            worker, attempt, begin = f"worker-{(i + 1) % workers}", 2, begin + 60
            put(Started(event_time_ms=begin, worker_id=worker, attempt=2, **common))
            retried += 1
        put(FirstToken(event_time_ms=t0 + ttft_ms, worker_id=worker, attempt=attempt,
                       ttft_s=ttft_ms / 1000, **common))
        busy.setdefault(worker, []).append((begin, t0 + e2e_ms))
        put(Completed(event_time_ms=t0 + e2e_ms, worker_id=worker, attempt=attempt,
                      prompt_tokens=100, output_tokens=output_tokens, e2e_s=e2e_ms / 1000,
                      **common))
        completed += 1
        per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
    lifecycle = len(events)
    end = start_ms + heartbeat_ms + requests * spacing_ms + e2e_ms + 2 * heartbeat_ms
    beats = 0
    for t in range(start_ms, end + 1, heartbeat_ms) if heartbeats else ():
        for w in range(workers):
            pool, gpu = ("h100@llama-3-8b", "h100") if w % 2 == 0 else ("a100@llama-3-8b", "a100")
            running = sum(1 for a, b in busy.get(f"worker-{w}", ()) if a <= t < b)
            put(_status(t, w, pool, gpu, running, start_ms))
            beats += 1
    events.sort(key=lambda e: (e[0], e[1]))
    counts = SyntheticCounts(requests, completed, rejected, retried, beats, lifecycle,
                             per_tenant)
    return [m for _, _, m in events], counts


# The hand-computed cost scenario of the tests (tests/unit/streams/test_pipeline.py and
# tests/integration/test_streams_cost.py state the expected figures and how they follow).
# Two workers, h100 (w-h) and a100 (w-a), heartbeat every second from 0 to 20 s; requests never
# overlap on a worker. task-a: a1 requeued on w-h after 1-3 s, retried on w-a 3.5-5.5 s, then a2
# on w-h 6-8 s: succeeds. task-b (5 steps): b1 w-a 1-2 s, b2 w-a 2-3 s, b3 w-a 6-7 s fails.
# c1 (no task id) w-h 9-10 s succeeds; d1 (no task id) is shed at 4 s.
# (request, task, step, steps, tenant, [(attempt, worker, start_s, end_s)], outcome)
_REQUESTS = [
    ("a1", "task-a", 1, 2, "t1", [(1, "w-h", 1.0, 3.0), (2, "w-a", 3.5, 5.5)], "completed"),
    ("a2", "task-a", 2, 2, "t1", [(1, "w-h", 6.0, 8.0)], "completed"),
    ("b1", "task-b", 1, 5, "t1", [(1, "w-a", 1.0, 2.0)], "completed"),
    ("b2", "task-b", 2, 5, "t1", [(1, "w-a", 2.0, 3.0)], "completed"),
    ("b3", "task-b", 3, 5, "t1", [(1, "w-a", 6.0, 7.0)], "failed"),
    ("c1", None, 1, 1, "t2", [(1, "w-h", 9.0, 10.0)], "completed"),
]


def cost_scenario(t0: int, prefix: str = "") -> list:
    """The scenario's telemetry in event-time order, starting at epoch ms ``t0``."""
    ms = lambda s: t0 + int(s * 1000)  # noqa: E731
    out: list[tuple[int, int, object]] = []
    resident: dict[str, list[tuple[float, float]]] = {"w-h": [], "w-a": []}
    for rid, task, step, steps, tenant, attempts, outcome in _REQUESTS:
        rid = prefix + rid
        task = prefix + task if task else None
        first_start = attempts[0][2]
        # (every event of a request carries its creation, as the router's and workers' do)
        common = dict(request_id=rid, task_id=task, tenant=tenant, created_ms=ms(first_start))
        out.append((ms(first_start), 0, Queued(
            event_time_ms=ms(first_start), prompt_tokens=100, max_tokens=50, step=step,
            steps_total=steps, deadline_ms=ms(30), **common)))
        for attempt, worker, start, end in attempts:
            resident[worker].append((start, end))
            out.append((ms(start), 1, Started(event_time_ms=ms(start), worker_id=worker,
                                              attempt=attempt, **common)))
            if (attempt, worker, start, end) != attempts[-1]:
                out.append((ms(end), 2, Requeued(event_time_ms=ms(end), worker_id=worker,
                                                 attempt=attempt, tokens_done=0, **common)))
        attempt, worker, start, end = attempts[-1]
        if outcome == "completed":
            out.append((ms(start + 0.5), 2, FirstToken(
                event_time_ms=ms(start + 0.5), worker_id=worker, attempt=attempt,
                ttft_s=start + 0.5 - first_start, **common)))
            out.append((ms(end), 3, Completed(
                event_time_ms=ms(end), worker_id=worker, attempt=attempt, prompt_tokens=100,
                output_tokens=50, e2e_s=end - first_start, **common)))
        else:
            out.append((ms(end), 3, Failed(event_time_ms=ms(end), reason="engine_error",
                                           worker_id=worker, **common)))
    out.append((ms(4.0), -2, InferenceRequest(  # (d1's client's request, which the router sheds)
        event_time_ms=ms(4.0), request_id=prefix + "d1", tenant="t2", prompt_tokens=100,
        max_tokens=50, created_ms=ms(4.0))))
    out.append((ms(4.0), 0, Rejected(event_time_ms=ms(4.0), request_id=prefix + "d1",
                                     tenant="t2", reason="load_shed", created_ms=ms(4.0))))
    for second in range(0, 21):
        for slot, (worker, gpu) in enumerate((("w-h", "h100"), ("w-a", "a100"))):
            running = sum(1 for a, b in resident[worker] if a <= second < b)
            out.append((ms(second), -1, WorkerStatus(
                event_time_ms=ms(second), worker_id=worker, slot=slot,
                pool=f"{gpu}@llama-3-8b", gpu_type=gpu, models_loaded=["llama-3-8b"],
                running=running, started_ms=t0)))
    out.sort(key=lambda e: (e[0], e[1]))
    return [m for _, _, m in out]


# Steps retried (tests/unit/analytics/test_retried_steps.py and
# tests/integration/test_retried_steps.py feed it to the streams and to the analytics store):
# two h100 workers, w-r and w-s, heartbeat every 0.5 s from 0 to 20 s; every deadline is 10 s
# after its request's creation but the first of t3's. Five tasks succeed, each step of theirs
# having a request that completed in time: t1's step 2 is cancelled, then retried under a new
# request id; t2's fails, then is retried; t3's one step completes late (a 1 s deadline), then
# is retried; t4's step 1 is retried while it runs and cancelled once the retry has completed;
# t6's one step is the router's retry: its worker w-r, thought lost, is replaced by w-s, where
# the request completes, and w-r's failure of the attempt replaced is read before the Started
# of the one that replaced it. t5's step 2 fails, and is not retried: it fails.
# (request, task, step, steps, created_s, start_s, end_s, outcome, deadline_s)
RETRIED_STEPS_SUCCEEDED, RETRIED_STEPS_FAILED = 5, 1
_RETRIED_STEPS = [
    ("t1-1", "t1", 1, 2, 1.0, 1.0, 2.0, "completed", 10.0),
    ("t1-2", "t1", 2, 2, 2.5, 2.5, 3.0, "cancelled", 10.0),
    ("t1-2b", "t1", 2, 2, 3.2, 3.5, 4.5, "completed", 10.0),
    ("t2-1", "t2", 1, 2, 1.0, 1.0, 1.5, "completed", 10.0),
    ("t2-2", "t2", 2, 2, 2.0, 2.0, 2.5, "failed", 10.0),
    ("t2-2b", "t2", 2, 2, 3.0, 3.0, 4.0, "completed", 10.0),
    ("t3-1", "t3", 1, 1, 5.0, 5.0, 7.0, "completed", 1.0),
    ("t3-1b", "t3", 1, 1, 7.2, 7.2, 8.0, "completed", 10.0),
    ("t4-1", "t4", 1, 2, 9.0, 9.0, 10.5, "cancelled", 10.0),
    ("t4-1b", "t4", 1, 2, 9.5, 9.5, 10.0, "completed", 10.0),
    ("t4-2", "t4", 2, 2, 11.0, 11.0, 12.0, "completed", 10.0),
    ("t5-1", "t5", 1, 2, 12.0, 12.0, 13.0, "completed", 10.0),
    ("t5-2", "t5", 2, 2, 13.0, 13.0, 14.0, "failed", 10.0),
    ("t6-1", "t6", 1, 1, 15.0, 15.0, 17.0, "resumed", 10.0),
]


def retried_steps_scenario(t0: int, prefix: str = "") -> list[Message]:
    """The retried-steps scenario's telemetry in event-time order, from epoch ms ``t0``."""
    ms = lambda s: t0 + int(s * 1000)  # noqa: E731
    out: list[tuple[int, int, Message]] = []
    for rid, task, step, steps, created, start, end, outcome, deadline in _RETRIED_STEPS:
        common = dict(request_id=prefix + rid, task_id=prefix + task, tenant="acme",
                      created_ms=ms(created))
        out.append((ms(created), 0, Queued(
            event_time_ms=ms(created), prompt_tokens=100, max_tokens=50, step=step,
            steps_total=steps, deadline_ms=ms(created + deadline), **common)))
        out.append((ms(start), 1, Started(event_time_ms=ms(start), worker_id="w-r", **common)))
        if outcome == "resumed":  # failed on w-r, then attempt 2 started on w-s and completed
            out.append((ms(start + 0.5), 2, Failed(event_time_ms=ms(start + 0.5),
                                                   reason="engine_error", worker_id="w-r",
                                                   **common)))
            out.append((ms(start + 0.6), 2, Started(event_time_ms=ms(start + 0.6),
                                                    worker_id="w-s", attempt=2, **common)))
            out.append((ms(end), 2, Completed(
                event_time_ms=ms(end), worker_id="w-s", attempt=2, prompt_tokens=100,
                output_tokens=50, e2e_s=end - created, **common)))
        elif outcome == "completed":
            out.append((ms(end), 2, Completed(
                event_time_ms=ms(end), worker_id="w-r", prompt_tokens=100, output_tokens=50,
                e2e_s=end - created, **common)))
        elif outcome == "failed":
            out.append((ms(end), 2, Failed(event_time_ms=ms(end), reason="engine_error",
                                           worker_id="w-r", **common)))
        else:
            out.append((ms(end), 2, Cancelled(event_time_ms=ms(end), reason="client retried",
                                              worker_id="w-r", **common)))
    for tick in range(41):
        for slot, worker in enumerate(("w-r", "w-s")):
            out.append((ms(tick / 2), -1, WorkerStatus(
                event_time_ms=ms(tick / 2), worker_id=worker, slot=slot,
                pool="h100@llama-3-8b", gpu_type="h100", models_loaded=["llama-3-8b"],
                started_ms=t0)))
    out.sort(key=lambda e: (e[0], e[1]))
    return [m for _, _, m in out]
