"""The inter-token latency a worker's heartbeat reports is in engine time, and only where
something decoded (no broker: the worker's stepping on a simulated engine, on a stepped clock)."""

import pytest

import workers.service as service
from infra.bus import Outbox
from schemas.requests import Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from workers.engine import EngineRequest
from workers.service import WorkerIdentity, WorkerService, _Running
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.perf import PerfModel

ME = WorkerIdentity(0, "w0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _reported_itl_ms(monkeypatch, speedup: float, max_tokens: int) -> float | None:
    """Eight requests of a 500-token prompt run for one wall second in 10 ms steps."""
    clock = [1_000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    engine = SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig())
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine, speedup=speedup)
    worker.outbox = Outbox(producer=None)
    for i in range(8):
        request = InferenceRequest(event_time_ms=1, created_ms=1, request_id=f"r{i}",
                                   prompt_tokens=500, max_tokens=max_tokens)
        worker._taken[i] = (f"r{i}", 1)
        worker._offsets.taken(i)
        engine.add(EngineRequest(f"r{i}", 500, max_tokens), worker.engine_now())
        worker._running[f"r{i}"] = _Running(
            Dispatch(event_time_ms=1, request=request, worker_id="w0", slot=0), i, 0)
    worker._step()
    worker._take_interval(engine.stats())
    for _ in range(100):
        clock[0] += 0.01
        worker._step()
    return worker._take_interval(engine.stats())["itl_ms"]


def test_a_sped_up_worker_reports_the_engines_latency_not_the_wall_clocks(monkeypatch):
    """The breakers judge it against the performance model's step time: at 4x the wall clock's
    latency was a quarter of it, and a GPU slowed less than 4x was never found slow."""
    expected = PerfModel.load("h100", "llama-3-8b").decode_step_s(8, 600) * 1000
    for speedup in (1.0, 4.0):
        assert _reported_itl_ms(monkeypatch, speedup, 5_000) == pytest.approx(expected, rel=0.1)


def test_one_token_answers_report_no_latency(monkeypatch):
    """A first token comes from prefill: with nothing decoding, the interval says nothing about
    decode speed (it reported 0.0, a perfectly fast GPU, whatever its speed)."""
    assert _reported_itl_ms(monkeypatch, 1.0, 1) is None


def _stalled_interval(monkeypatch, speedup: float, sequences: int) -> tuple[WorkerService, float]:
    """``sequences`` decoding requests, then a stall, and one whole heartbeat interval in it
    (0.5 wall seconds in 10 ms steps): the worker, and the interval's length in engine seconds."""
    clock = [1_000.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    engine = SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig())
    worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine, speedup=speedup)
    worker.outbox = Outbox(producer=None)
    for i in range(sequences):
        request = InferenceRequest(event_time_ms=1, created_ms=1, request_id=f"r{i}",
                                   prompt_tokens=100, max_tokens=100_000)
        worker._taken[i] = (f"r{i}", 1)
        worker._offsets.taken(i)
        engine.add(EngineRequest(f"r{i}", 100, 100_000), worker.engine_now())
        worker._running[f"r{i}"] = _Running(
            Dispatch(event_time_ms=1, request=request, worker_id="w0", slot=0), i, 0)
    for _ in range(50):  # all of them past their prefill, decoding
        clock[0] += 0.01
        worker._step()
    assert engine.decoding() == sequences
    engine.stall(worker.engine_now() + 3_600 * speedup)  # an InjectFault stall
    for _ in range(50):  # (the step under way when it came still ends)
        clock[0] += 0.01
        worker._step()
    worker._take_interval(engine.stats())
    assert engine.next_event_s() > worker.engine_now() + 1  # no token until well after the next
    start = worker.engine_now()
    for _ in range(50):
        clock[0] += 0.01
        worker._step()
    assert worker._tokens == 0
    return worker, worker.engine_now() - start


@pytest.mark.parametrize("speedup, sequences", [(1.0, 1), (1.0, 64), (30.0, 256)])
def test_an_interval_without_tokens_reports_its_length_not_times_its_sequences(
        monkeypatch, speedup, sequences):
    """Each decoding sequence waited the interval once: 64 stalled sequences over 0.5 s read
    32,000 ms (a slow GPU to the breakers), and 256 at 30x 3,840,000 ms, past the schema's
    limit: the worker's heartbeat raised and the worker stopped."""
    worker, interval_s = _stalled_interval(monkeypatch, speedup, sequences)
    status = worker._status()  # (a WorkerStatus, validated)
    assert status.itl_ms == pytest.approx(interval_s * 1000)


@pytest.mark.parametrize("seq_seconds, tokens, decode_seconds", [
    (7_200.0, 0, 7_200.0),  # one sequence stalled for two hours of engine time
    (7_200.0, 1, 7_200.0),  # one token in those two hours
])
def test_the_latency_reported_is_held_to_the_schemas_limit(seq_seconds, tokens, decode_seconds):
    from schemas.limits import MAX_ITL_MS
    from workers.engine import EngineStats, interval_report

    report = interval_report(seq_seconds, tokens, (None, None), EngineStats(running=1, waiting=0),
                             decode_seconds=decode_seconds)
    assert report["itl_ms"] == MAX_ITL_MS
