"""In large fleets the governor policy scores a shortlist; it must still find the best workers."""

from controllers.router.core import SHORTLIST, RouterCore
from controllers.router.prefix import PrefixIndex
from schemas.events import KvBlocksStored, WorkerStatus
from schemas.requests import InferenceRequest

T = 1_800_000_000_000


def _fleet(core: RouterCore, n: int, busy: int = 40) -> None:
    for i in range(n):
        core.observe(WorkerStatus(
            event_time_ms=T, worker_id=f"w{i}", slot=i % 32, pool="h100@llama-3-8b",
            gpu_type="h100", models_loaded=["llama-3-8b"], running=busy if i != 7 else 0,
            kv_blocks_used=100, kv_blocks_free=20_000, started_ms=T), T)


def _request(hashes: list[int]) -> InferenceRequest:
    return InferenceRequest(event_time_ms=T, created_ms=T, request_id="r", prompt_tokens=512 * len(hashes),
                            prefix_hashes=hashes, block_size=512, max_tokens=16)


def test_deepest_holders_finds_the_longest_cached_prefix():
    index = PrefixIndex()
    index.stored("a", [1, 2])
    index.stored("b", [1, 2, 3])
    index.stored("c", [1])
    assert index.deepest_holders([1, 2, 3, 4]) == {"b"}
    assert index.deepest_holders([1, 9]) == {"a", "b", "c"}
    index.evicted("b", [3])
    assert index.deepest_holders([1, 2, 3]) == {"a", "b"}
    assert index.deepest_holders([5]) == set()


def test_estimated_holders_follow_routing_and_leave_with_lru():
    index = PrefixIndex(estimated_blocks_per_worker=2)
    index.routed("v", [1, 2])
    assert index.deepest_holders([1, 2]) == {"v"}
    index.routed("v", [3])  # pushes block 1 out of the estimate
    assert index.deepest_holders([1]) == set()


def test_shortlist_keeps_the_least_loaded_and_the_prefix_holder():
    core = RouterCore()
    _fleet(core, 64)
    core.observe(KvBlocksStored(event_time_ms=T, worker_id="w50", block_size=512,
                                block_hashes=[1, 2, 3, 4]), T)
    workers = core.fleet.live(T)
    short = {w.worker_id for w in core._shortlist(_request([1, 2, 3, 4]), workers)}
    assert "w7" in short and "w50" in short
    assert len(short) <= 2 * SHORTLIST
    decision = core.route(_request([1, 2, 3, 4]), T)
    assert decision.dispatch.worker_id in ("w50", "w7")
