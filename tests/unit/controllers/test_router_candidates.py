"""Tests of controllers.router.candidates: per-request facts about each worker, predicted TTFT."""

from __future__ import annotations

import pytest

from controllers.router.candidates import (
    CHUNK_TOKENS, TYPICAL_CONTEXT_TOKENS, TYPICAL_PROMPT_TOKENS, build_candidates,
    mark_deadlines_at_risk, perf_model, prefill_stall_s,
)
from controllers.router.fleet import view_of
from controllers.router.ledger import PendingLedger
from controllers.router.prefix import PrefixIndex
from router_factories import MODEL, T0, candidate_factory, request_factory, view_factory
from schemas.events import WorkerStatus
from workers.sim.perf import PerfModel

PRICES = {"a100": 1.8, "h100": 3.0}


def _one(request=None, *, ledger=None, prefix=None, breakers=None, affinity=None, **worker):
    [c] = build_candidates(request or request_factory(), [view_factory("w0", 0, **worker)],
                           ledger or PendingLedger(), prefix or PrefixIndex(), PRICES,
                           breakers or {}, affinity)
    return c


def test_idle_worker_ttft_is_one_prefill_step() -> None:
    c = _one(request_factory(prompt_tokens=2_000), gpu_type="a100")
    perf = perf_model("a100", MODEL)
    assert c.predicted_ttft_s == pytest.approx(
        perf.step_s(2_000, 0, 0, TYPICAL_CONTEXT_TOKENS, prefill_seqs=1))
    assert (c.price_per_hour, c.overlap_blocks, c.pending, c.breaker, c.affinity) == (
        1.8, 0, 0, "closed", False)


def test_queued_work_is_prefilled_with_the_request_beside_the_running_batch() -> None:
    ledger = PendingLedger()
    ledger.dispatched("p1", "w0", 3_000)
    ledger.dispatched("p2", "w0", 500)
    prefix = PrefixIndex()
    prefix.stored("w0", [1, 2, 3])
    req = request_factory(prompt_tokens=1_000, block_size=100, prefix_hashes=[1, 2, 3, 4, 5])
    c = _one(req, ledger=ledger, prefix=prefix, running=12, waiting=2)
    uncached = 1_000 - 3 * 100
    queued = 3_500 + 2 * TYPICAL_PROMPT_TOKENS
    expected = perf_model("h100", MODEL).step_s(queued + uncached, 3 * 100, 12,
                                                TYPICAL_CONTEXT_TOKENS, prefill_seqs=1 + 2 + 2)
    assert c.predicted_ttft_s == pytest.approx(expected)
    assert (c.overlap_blocks, c.pending, c.pending_prompt_tokens, c.load) == (3, 2, 3_500, 16)


def test_a_continuation_is_predicted_to_prefill_the_tokens_it_resumes_after() -> None:
    """A continuation's prompt holds the tokens generated before it (only its prompt's prefix
    can be cached): its first token comes after all of them. Before, its prompt alone."""
    ledger, prefix = PendingLedger(), PrefixIndex()
    prefix.stored("w0", [1, 2])
    req = request_factory(prompt_tokens=1_000, block_size=100, prefix_hashes=[1, 2, 3])
    [c] = build_candidates(req, [view_factory("w0", 0)], ledger, prefix, PRICES, {}, None,
                           resumed=3_000)
    assert c.predicted_ttft_s == pytest.approx(perf_model("h100", MODEL).step_s(
        1_000 + 3_000 - 200, 200, 0, TYPICAL_CONTEXT_TOKENS, prefill_seqs=1))


def test_a_prompt_of_no_counted_tokens_is_predicted_as_an_empty_prefill() -> None:
    """A client that sends its prompt as text may count no tokens (``prompt_tokens`` 0)."""
    c = _one(request_factory(prompt_tokens=0))
    assert c.predicted_ttft_s == pytest.approx(
        perf_model("h100", MODEL).step_s(0, 0, 0, TYPICAL_CONTEXT_TOKENS, prefill_seqs=1))


@pytest.mark.parametrize(
    ("busier", "idler"),
    [
        (dict(running=32), dict(running=0)),
        (dict(waiting=4), dict(waiting=0)),
        (dict(state="loading"), dict(state="warm")),
        (dict(gpu_type="a100"), dict(gpu_type="h100")),
    ],
)
def test_predicted_ttft_grows_with_load_and_cold_starts(busier: dict, idler: dict) -> None:
    assert _one(**busier).predicted_ttft_s > _one(**idler).predicted_ttft_s


def test_pending_dispatches_and_cached_prefix_move_the_prediction() -> None:
    req = request_factory(prompt_tokens=4_096, block_size=512, prefix_hashes=list(range(8)))
    ledger = PendingLedger()
    ledger.dispatched("p", "w0", 4_096)
    prefix = PrefixIndex()
    prefix.stored("w0", list(range(6)))
    plain = _one(req).predicted_ttft_s
    assert _one(req, ledger=ledger).predicted_ttft_s > plain
    assert _one(req, prefix=prefix).predicted_ttft_s < plain


def test_the_rest_of_a_long_prompt_is_predicted_to_attend_to_its_computed_part() -> None:
    """A 99k-token prompt half prefilled: its remaining 46k tokens attend to the 53k computed
    (as their chunks do), which the prediction without the context left out (a request placed
    behind it was predicted its first token in 1.7 s and had it in 3.0 s)."""
    behind = dict(running=2, prefill_backlog_tokens=46_419)
    plain = _one(**behind).predicted_ttft_s
    with_context = _one(**behind, prefill_context_tokens=52_991).predicted_ttft_s
    perf = perf_model("h100", MODEL)
    assert with_context - plain == pytest.approx(
        perf.step_s(46_419 + 256, 52_991, 2, TYPICAL_CONTEXT_TOKENS)
        - perf.step_s(46_419 + 256, 0, 2, TYPICAL_CONTEXT_TOKENS))
    assert with_context > plain * 1.5


def test_a_loading_worker_adds_the_model_load_time() -> None:
    warm, cold = _one(), _one(state="loading")
    assert cold.predicted_ttft_s - warm.predicted_ttft_s == pytest.approx(
        perf_model("h100", MODEL).load_s())


def test_breaker_affinity_and_unknown_gpu() -> None:
    c = _one(breakers={"w0": "half_open"}, affinity="w0", gpu_type="tpu-v9")
    # an unpriced GPU costs the dearest price configured: never preferred for looking cheap
    assert (c.breaker, c.affinity, c.price_per_hour) == ("half_open", True, 3.0)
    assert c.perf.gpu.name == "h100"  # an unknown GPU is modelled as an H100
    assert not _one(affinity="w1").affinity


# --- what a long prefill does to the requests decoding beside it ---------------------------------

def test_a_prompt_that_fits_one_engine_step_stalls_nothing() -> None:
    c = candidate_factory()
    assert prefill_stall_s(request_factory(prompt_tokens=CHUNK_TOKENS), c) == 0.0
    mark_deadlines_at_risk(request_factory(prompt_tokens=CHUNK_TOKENS), [c],
                           lambda w: [(T0 + 1, 1)], T0)
    assert c.deadlines_at_risk == 0


def test_the_stall_is_the_prefill_of_the_uncached_part_after_the_cached_one() -> None:
    req = request_factory(prompt_tokens=40_000, block_size=100, prefix_hashes=list(range(400)))
    cached = candidate_factory("w0", overlap_blocks=100)
    perf = perf_model("h100", MODEL)
    assert prefill_stall_s(req, cached) == pytest.approx(perf.step_s(30_000, 10_000, 0, 0))
    assert prefill_stall_s(req, candidate_factory("w1")) == pytest.approx(
        perf.step_s(40_000, 0, 0, 0))


def test_a_continuations_prompt_holds_the_tokens_it_resumes_from() -> None:
    req = request_factory(prompt_tokens=6_000)
    c = candidate_factory()
    assert prefill_stall_s(req, c) == 0.0  # one engine step
    assert prefill_stall_s(req, c, resumed=4_000) == pytest.approx(
        perf_model("h100", MODEL).step_s(10_000, 0, 0, 0))


def test_requests_in_flight_that_the_stall_would_make_late_are_counted() -> None:
    req = request_factory(prompt_tokens=40_000)
    c = candidate_factory("w0", running=3)
    stall = prefill_stall_s(req, c)
    per_token = c.perf.decode_step_s(3 + 1, TYPICAL_CONTEXT_TOKENS)
    just_in_time = T0 + int((100 * per_token + stall / 2) * 1000)  # 100 tokens left: at risk
    in_flight = {"w0": [
        (just_in_time, 100),
        (T0 + int((100 * per_token + 2 * stall) * 1000), 100),  # time to spare
        (T0 + int(50 * per_token * 1000), 100),  # late whatever is placed: not counted
    ], "w1": []}
    cands = [c, candidate_factory("w1", 1)]
    mark_deadlines_at_risk(req, cands, in_flight.__getitem__, T0)
    assert [x.deadlines_at_risk for x in cands] == [1, 0]


def test_a_worker_of_a_model_that_needs_several_gpus_is_priced_at_all_of_them() -> None:
    """Llama-2-70B holds on two H100s (the tensor parallelism its speed is predicted at): the
    price scorer weighs that speed against two H100s' price, not one's."""
    request = request_factory(model="llama-2-70b")
    c = _one(request, gpu_type="h100", models=("llama-2-70b",))
    assert c.perf.tp == 2 and c.price_per_hour == pytest.approx(2 * PRICES["h100"])


def test_a_worker_is_priced_at_the_gpus_it_reports() -> None:
    """A live ``--tp 8`` worker of Llama-2-70B runs on eight H100s and says so
    (``WorkerStatus.gpus``): the price scorer weighs eight H100s' price (before 6 Dec, the two
    its model is predicted on, whatever the worker said), against its speed on eight."""
    status = WorkerStatus(event_time_ms=T0, worker_id="w0", slot=0, pool="h100@llama-2-70b",
                          gpu_type="h100", gpus=8, models_loaded=["llama-2-70b"], started_ms=T0)
    [c] = build_candidates(request_factory(model="llama-2-70b"), [view_of(status)],
                           PendingLedger(), PrefixIndex(), PRICES, {}, None)
    assert c.perf.tp == 8 and c.price_per_hour == pytest.approx(8 * PRICES["h100"])


@pytest.mark.parametrize(("reported", "predicted_at"), [
    (4, 4), (8, 8), (2, 2),
    (1, 2),  # fewer than hold it (before 6 Dec, or vLLM without --tp): the least that does
    (3, 2),  # not a divisor of its 64 attention heads: no engine runs it so
    (16, 2),  # past eight: not modelled
])
def test_a_worker_is_predicted_at_the_gpus_it_reports(reported: int, predicted_at: int) -> None:
    """A live ``--tp 4`` worker of Llama-2-70B on H100s is predicted on the TP-4 performance
    model: its prefill is faster and its KV cache larger than at TP 2, the least that holds
    the model (before 6 Dec every worker of it was predicted at TP 2, whatever it reported)."""
    request = request_factory(model="llama-2-70b", prompt_tokens=2_000)
    c = _one(request, models=("llama-2-70b",), gpus=reported)
    perf = PerfModel.load("h100", "llama-2-70b", predicted_at)
    assert c.perf.tp == predicted_at
    assert c.predicted_ttft_s == pytest.approx(
        perf.step_s(2_000, 0, 0, TYPICAL_CONTEXT_TOKENS, prefill_seqs=1))
    assert c.perf is perf_model("h100", "llama-2-70b", reported)  # (cached: the hot path)


def test_tp4_predicts_a_faster_prefill_and_more_kv_than_tp2() -> None:
    """What the prediction at the reported degree changes for a Llama-2-70B worker on H100s."""
    tp2, tp4 = perf_model("h100", "llama-2-70b", 2), perf_model("h100", "llama-2-70b", 4)
    assert tp4.prefill_s(2_000) < 0.8 * tp2.prefill_s(2_000)
    assert tp4.kv_capacity_tokens() > 10 * tp2.kv_capacity_tokens()
