"""A command the worker's engine cannot carry out is logged, not fatal (no broker: the worker's
handler of commands, on a simulated engine and on the fixed-rate one)."""

from schemas import commands
from schemas.topics import TopicCatalog
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.perf import PerfModel

T = 1_800_000_000_000
ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _worker(engine) -> WorkerService:
    return WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine)


def test_loading_an_unknown_model_keeps_the_worker_serving_its_own() -> None:
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    worker._on_command(commands.LoadModel(event_time_ms=T, command_id="c", worker_id="worker-0",
                                          model="no-such-model"))
    worker._on_command(commands.LoadModel(event_time_ms=T, command_id="c", worker_id="worker-0",
                                          model="llama-2-70b"))  # does not fit on one H100
    assert worker.models == ["llama-3-8b"]


def test_a_fault_the_engine_cannot_inject_is_ignored() -> None:
    worker = _worker(FixedRateEngine(decode_tokens_per_s=10))
    worker._on_command(commands.InjectFault(event_time_ms=T, command_id="c", worker_id="worker-0",
                                            fault="slow", factor=5.0))
    assert not hasattr(worker.engine, "slow_down")  # nothing to call, and no exception
