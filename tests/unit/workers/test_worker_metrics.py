"""The worker's vLLM-named Prometheus metrics, read off what it streams (no broker: its handler of
the engine's tokens)."""

import asyncio

import pytest

import workers.service as service
from infra.bus import Outbox, now_ms
from schemas.base import Message
from schemas.events import FirstToken
from schemas.requests import Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from workers.engine import EngineRequest, TokenBatch
from workers.fixed_rate import FixedRateEngine
from workers.metrics import EngineMetrics
from workers.service import WorkerIdentity, WorkerService, _Running
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.perf import PerfModel
from workers.vllm_engine import VllmHttpEngine, _Stream

ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _second_attempts_first_tokens() -> tuple[WorkerService, list[Message]]:
    """A worker given the second attempts of ``r0`` (resumed from token 0) and ``r1`` (from
    token 18), created 3 s ago, and the first tokens of each: the worker and what it emitted."""
    emitted: list[Message] = []
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=100))
    worker.outbox = Outbox(producer=None, observe=emitted.append)
    created = now_ms() - 3_000
    for n, resume in enumerate((0, 18)):
        req = InferenceRequest(event_time_ms=created, created_ms=created, request_id=f"r{n}",
                               prompt_tokens=256, max_tokens=32)
        worker._running[req.request_id] = _Running(Dispatch(
            event_time_ms=created, request=req, worker_id=ME.worker_id, slot=ME.slot,
            router_id="router-0", attempt=2, resume_from_token=resume), n, resume)
        worker._on_tokens(TokenBatch(request_id=req.request_id, token_offset=resume,
                                     tokens=(1, 2), first=True, finished=False))
    return worker, emitted


def test_a_continuations_first_token_event_says_how_many_tokens_came_before() -> None:
    """Its ``tokens_done`` tells the analytics store's TTFT digest to leave it out (0: the
    request's first token)."""
    _, emitted = _second_attempts_first_tokens()
    assert [(m.request_id, m.attempt, m.tokens_done) for m in emitted
            if isinstance(m, FirstToken)] == [("r0", 2, 0), ("r1", 2, 18)]


def test_a_continuation_resumed_after_its_first_token_is_no_new_ttft() -> None:
    """A continuation of a request whose first token a lost worker had streamed (resumed from
    token 18) had its first token here counted as a TTFT, measured from the request's creation:
    a run with one worker killed showed 3.656 s in the next worker's
    ``vllm:time_to_first_token_seconds`` for a request whose client had its first token after
    0.228 s. One resumed from token 0 (lost before any token) is the client's first token."""
    worker, _ = _second_attempts_first_tokens()
    value = worker.metrics.registry.get_sample_value
    labels = {"model_name": "llama-3-8b"}
    assert value("vllm:time_to_first_token_seconds_count", labels) == 1
    assert value("vllm:time_to_first_token_seconds_sum", labels) >= 3.0
    assert value("vllm:generation_tokens_total", labels) == 4


def test_the_latency_histograms_have_vllms_buckets() -> None:
    """The metrics carry vLLM's names so that its dashboards work unchanged, and those read its
    bucket bounds. Before 6 Dec both histograms had bounds of their own up to 640 s: a
    20-minute request fell in ``+Inf`` (histogram_quantile put it at 640 s) and a panel on
    vLLM's ``le="1920.0"`` or ``le="2560.0"`` found no series."""
    metrics = EngineMetrics("llama-3-8b")
    metrics.observe_first_token(1_000.0)
    metrics.observe_finished(1_200.0)
    bounds = {family.name: [(s.labels["le"], s.value) for s in family.samples
                            if s.name.endswith("_bucket")]
              for family in metrics.registry.collect()}
    ttft = bounds["vllm:time_to_first_token_seconds"]
    e2e = bounds["vllm:e2e_request_latency_seconds"]
    assert [float(le) for le, _ in ttft] == [  # vLLM's (vllm/v1/metrics/loggers.py)
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, float("inf")]
    assert [float(le) for le, _ in e2e] == [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0, float("inf")]
    assert dict(ttft)["2560.0"] == 1 and dict(ttft)["640.0"] == 0
    assert dict(e2e)["1920.0"] == 1 and dict(e2e)["960.0"] == 0


def test_prompt_tokens_count_as_the_prompt_is_computed_continuations_and_hand_backs_too() -> None:
    """vLLM counts ``vllm:prompt_tokens`` as a request's prompt is computed (with its first
    token). Before 6 Dec the worker counted them as the request finished: a long request's
    prompt showed minutes late, an attempt handed back never, and a continuation counted its
    request's prompt without the streamed tokens it was prompted with too."""
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=100))
    worker.outbox = Outbox(producer=None)
    created = now_ms() - 1_000
    for n, resume in enumerate((0, 18)):  # a first attempt, running; a continuation
        req = InferenceRequest(event_time_ms=created, created_ms=created, request_id=f"r{n}",
                               prompt_tokens=256, max_tokens=32)
        worker._running[req.request_id] = _Running(Dispatch(
            event_time_ms=created, request=req, worker_id=ME.worker_id, slot=ME.slot,
            router_id="router-0", attempt=1 + (resume > 0), resume_from_token=resume), n, resume)
        worker._on_tokens(TokenBatch(request_id=req.request_id, token_offset=resume,
                                     tokens=(1,), first=True, finished=False))
    value = worker.metrics.registry.get_sample_value
    assert value("vllm:prompt_tokens_total", {"model_name": "llama-3-8b"}) == 256 + 256 + 18
    worker._on_tokens(TokenBatch(request_id="r1", token_offset=19, tokens=(2,), first=False,
                                 finished=True, finish_reason="length"))
    assert value("vllm:prompt_tokens_total", {"model_name": "llama-3-8b"}) == 256 + 256 + 18
    assert value("vllm:request_success_total",
                 {"model_name": "llama-3-8b", "finished_reason": "length"}) == 1


def _itl(worker: WorkerService) -> tuple[float, float, dict[float, float]]:
    """The worker's ``vllm:inter_token_latency_seconds``: its count, its sum and its buckets."""
    family = next(f for f in worker.metrics.registry.collect()
                  if f.name == "vllm:inter_token_latency_seconds")
    samples = {s.name[len(family.name):]: s for s in family.samples if s.name.endswith(
        ("_count", "_sum"))}
    buckets = {float(s.labels["le"]): s.value for s in family.samples
               if s.name.endswith("_bucket")}
    assert all(s.labels.get("model_name") == "llama-3-8b" for s in family.samples)
    return samples["_count"].value, samples["_sum"].value, buckets


def _run(worker: WorkerService, clock: list[float], requests: dict[str, int], wall_s: float,
         tick_s: float) -> None:
    """Dispatch ``requests`` (id -> tokens) to ``worker`` and step it every ``tick_s`` wall
    seconds of a stepped clock for ``wall_s``."""
    for n, (rid, tokens) in enumerate(requests.items()):
        req = InferenceRequest(event_time_ms=now_ms(), created_ms=now_ms(), request_id=rid,
                               prompt_tokens=500, max_tokens=tokens)
        worker._on_dispatch(Dispatch(event_time_ms=now_ms(), request=req, worker_id=ME.worker_id,
                                     slot=ME.slot, router_id="router-0"), n)
    for _ in range(round(wall_s / tick_s)):
        clock[0] += tick_s
        worker._step()


def test_inter_token_latency_is_each_token_gap_of_the_simulated_engine(monkeypatch) -> None:
    """vLLM's dashboards plot ``vllm:inter_token_latency_seconds`` (before 6 Dec the worker
    exported no such metric, and their panels were empty): one observation for each token after
    a request's first, the time since its previous one, with vLLM's bucket bounds. Here two
    requests decode together on a simulated H100, stepped every 10 ms of a wall clock that the
    engine runs twice as fast: each gap is a decode step of two sequences, in wall seconds."""
    clock = [1_000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    perf = PerfModel.load("h100", "llama-3-8b")
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           SimEngine(perf, SimEngineConfig()), speedup=2.0)
    worker.outbox = Outbox(producer=None)
    _run(worker, clock, {"r0": 40, "r1": 40}, wall_s=2.0, tick_s=0.01)
    assert not worker._running
    count, total, buckets = _itl(worker)
    assert count == 2 * 39
    step_s = perf.decode_step_s(2, 520)
    assert total / count == pytest.approx(step_s / 2.0, rel=0.1)
    assert list(buckets) == [  # vLLM's (vllm/v1/metrics/loggers.py)
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, float("inf")]


def test_a_batch_of_tokens_read_late_counts_a_gap_for_each_token(monkeypatch) -> None:
    """A fixed-rate engine of 100 tokens a second read every 50 ms hands over five tokens at a
    time: five gaps of 10 ms, not one of 50 ms (the first token, a prefill's, is no gap)."""
    clock = [1_000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME,
                           FixedRateEngine(decode_tokens_per_s=100, prefill_tokens_per_s=1e9))
    worker.outbox = Outbox(producer=None)
    _run(worker, clock, {"r0": 21}, wall_s=1.0, tick_s=0.05)
    count, total, buckets = _itl(worker)
    assert count == 20 and total == pytest.approx(0.2)
    assert buckets[0.025] == 20  # (10 ms each, give or take the clock's rounding)


def test_the_vllm_adapters_inter_token_latency_is_between_the_streams_chunks(monkeypatch) -> None:
    """Behind the vLLM adapter the worker's histogram reads when each chunk of the stream came,
    not when the worker took it (its ``advance``, up to a poll or a busy loop later): chunks 30
    and 20 ms apart, taken 27 ms apart both times, are gaps of 30 and 20 ms."""
    clock = [1_000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])  # (the loop's clock too)
    engine = VllmHttpEngine("http://127.0.0.1:1", "llama-3-8b")
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine)
    worker.outbox = Outbox(producer=None)
    req = InferenceRequest(event_time_ms=now_ms(), created_ms=now_ms(), request_id="r0",
                           prompt_tokens=256, max_tokens=3)
    worker._running["r0"] = _Running(Dispatch(event_time_ms=now_ms(), request=req,
                                              worker_id=ME.worker_id, slot=ME.slot), 0, 0)

    async def stream_three_chunks() -> None:
        stream = engine._streams["r0"] = _Stream(EngineRequest("r0", 256, 3), 0)
        for token, (came_s, taken_s) in enumerate(((0.0, 0.004), (0.030, 0.031),
                                                   (0.050, 0.058))):
            clock[0] = 1_000.0 + came_s
            stream.receive([token], 1)
            if token == 2:
                stream.finish("length")
            clock[0] = 1_000.0 + taken_s
            worker._step()

    asyncio.run(stream_three_chunks())
    assert not worker._running
    count, total, buckets = _itl(worker)
    assert count == 2 and total == pytest.approx(0.05)
    assert buckets[0.025] == 1 and buckets[0.05] == 2
