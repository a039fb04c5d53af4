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


def test_a_finished_dispatch_is_superseded_on_its_slot_even_when_it_is_the_lowest_open_one():
    """Its commit comes after the flush of its terminal event: a crash in between would have the
    next worker on the slot read it again and run it a second time, but for this."""
    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.requests import CancelRequest

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.outbox = Outbox(producer=None)
    worker._taken[7] = ("r1", 2)
    worker._offsets.taken(7)
    worker._finish(7)
    ((topic, value, _key, partition),) = worker.outbox._queue
    cancel = decode(worker.catalog.spec(topic), value)
    assert topic == worker.catalog.dispatch and partition == ME.slot
    assert isinstance(cancel, CancelRequest) and (cancel.request_id, cancel.attempt) == ("r1", 2)
    assert cancel.reason.startswith("superseded:")
