"""A worker's heartbeat says how many GPUs its engine runs on, which every cost figure bills
(no broker: the heartbeat a worker builds from its engine)."""

from schemas.codec import decode, encode
from schemas.topics import TopicCatalog
from workers.factory import build_engine
from workers.service import WorkerIdentity, WorkerService


def _heartbeat(model: str, tp: int):
    me = WorkerIdentity(0, "w0", f"h100@{model}", "h100", model)
    engine = build_engine("sim", gpu="h100", model=model, tp=tp)
    return WorkerService("127.0.0.1:1", TopicCatalog("unit"), me, engine)._status()


def test_a_tensor_parallel_worker_reports_its_gpus():
    status = _heartbeat("llama-2-70b", 4)
    assert status.gpus == 4
    catalog = TopicCatalog("unit")
    assert decode(catalog.spec(catalog.telemetry), encode(status)).gpus == 4  # (as read)


def test_a_one_gpu_worker_writes_no_gpus_field_as_before():
    """So a reader older than the field reads a one-GPU worker's heartbeat as before."""
    status = _heartbeat("llama-3-8b", 1)
    assert status.gpus == 1 and b'"gpus"' not in encode(status)


def test_a_vllm_worker_reports_the_gpus_its_tp_says_its_server_runs_on():
    """A worker cannot see its vLLM server's GPUs: ``--tp`` says them (``vllm serve
    --tensor-parallel-size``), and its heartbeats bill them; without it, one."""
    assert build_engine("vllm", vllm_url="http://127.0.0.1:8000", tp=4).stats().gpus == 4
    assert build_engine("vllm", vllm_url="http://127.0.0.1:8000").stats().gpus == 1


def test_a_fixed_rate_worker_bills_the_gpus_its_tp_says():
    """``demo --engine fixed-rate --fleet h100:4@llama-2-70b``: two workers, each started
    ``--tp 2``, each heart-beating two GPUs, as the router prices them and the fleet counts
    them (before 6 Dec the engine refused ``--tp``: each worker billed one, the fleet two of
    its four GPUs). Its speed stays its fixed rates."""
    me = WorkerIdentity(0, "w0", "h100@llama-2-70b", "h100", "llama-2-70b")
    engine = build_engine("fixed-rate", model="llama-2-70b", tp=2, decode_tokens_per_s=50.0)
    assert engine.decode_tokens_per_s == 50.0
    assert WorkerService("127.0.0.1:1", TopicCatalog("unit"), me, engine)._status().gpus == 2
    assert build_engine("fixed-rate").stats().gpus == 1
