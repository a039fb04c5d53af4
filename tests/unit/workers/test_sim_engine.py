"""The simulated engine's scheduling rules, on a simple linear performance model."""

from dataclasses import dataclass

import pytest

from workers.engine import CapacityError, EngineRequest, reference_token
from workers.sim.engine import SimEngine, SimEngineConfig


@dataclass
class LinearPerf:
    """step = base + per_prefill_token * prefill + per_seq * decode_seqs (seconds)."""

    base: float = 0.010
    per_prefill_token: float = 0.0001
    per_seq: float = 0.0001
    blocks: int = 1000
    load: float = 20.0
    max_model_len: int | None = None
    tp: int = 1  # (the GPUs it runs on)

    def step_s(self, prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs=1):
        return self.base + self.per_prefill_token * prefill_tokens + self.per_seq * decode_seqs

    def decode_step_s(self, batch, context):
        return self.step_s(0, 0, batch, context)

    def kv_capacity_blocks(self, block_size=16, gpu_memory_utilization=0.9):
        return self.blocks

    def load_s(self):
        return self.load


def run(engine, until, step=0.001):
    """Advance in small increments, as a real-time worker would; collect every batch."""
    out, t = [], 0.0
    while t <= until:
        out += engine.advance(t)
        t += step
    return out


def req(rid="r", prompt=100, out=10, **kw):
    return EngineRequest(request_id=rid, prompt_tokens=prompt, max_tokens=out, **kw)


def test_isolated_request_first_token_after_one_prefill_step_then_one_per_decode_step():
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=1000, out=5), 0.0)
    batches = engine.advance(10.0)
    assert len(batches) == 1
    b = batches[0]
    assert b.first_token_s == pytest.approx(0.010 + 0.1)  # base + 1000 tokens of prefill
    assert b.time_s == pytest.approx(0.110 + 4 * 0.0101)
    assert b.tokens == tuple(reference_token("r", i) for i in range(5))
    assert b.finished and b.finish_reason == "length"


def test_a_prompt_of_no_tokens_is_served_as_one_token_as_the_vllm_adapter_sends_it():
    """vLLM refuses an empty prompt, but a request of 0 prompt tokens (a client's text prompt it
    did not count, a trace row of 0) is valid input: the vLLM adapter sends it as one
    placeholder id, and the simulated engine prefills one token for it. Neither refuses it."""
    from workers.vllm_engine import PLACEHOLDER_BASE, prompt_token_ids

    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=0, out=2), 0.0)
    batches = engine.advance(10.0)
    assert batches[0].first_token_s == pytest.approx(0.010 + 0.0001)  # base + 1 token of prefill
    assert batches[-1].finished and batches[-1].finish_reason == "length"
    assert batches[-1].failure is None
    assert prompt_token_ids(req(prompt=0, out=2)) == [PLACEHOLDER_BASE]


def test_tokens_arrive_at_step_ends_only():
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=1000, out=3), 0.0)
    assert engine.advance(0.109) == []
    first = engine.advance(0.111)
    assert [b.count for b in first] == [1] and first[0].first
    assert engine.next_event_s() == pytest.approx(0.110 + 0.0101)


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget():
    engine = SimEngine(LinearPerf(), SimEngineConfig(max_num_batched_tokens=512))
    engine.add(req(prompt=1200, out=1), 0.0)
    (b,) = engine.advance(10.0)
    # three steps: 512 + 512 + 176 prefill tokens
    assert b.first_token_s == pytest.approx(3 * 0.010 + 1200 * 0.0001)
    assert engine.steps == 3
    assert (engine.stats().steps, engine.stats().prefilled_tokens) == (3, 1200)


def test_max_num_seqs_limits_the_batch_and_queues_the_rest_fifo():
    engine = SimEngine(LinearPerf(), SimEngineConfig(max_num_seqs=2))
    for i in range(3):
        engine.add(req(f"r{i}", prompt=16, out=50), 0.0)
    engine.advance(0.05)
    assert engine.stats().running == 2 and engine.stats().waiting == 1
    batches = run(engine, 5.0)
    done = {b.request_id: b.time_s for b in batches if b.finished}
    first = {b.request_id: b.first_token_s for b in batches if b.first}
    assert first["r2"] > max(done["r0"], done["r1"])


def test_prefix_cache_hit_skips_prefill_of_the_cached_blocks():
    perf = LinearPerf()
    engine = SimEngine(perf, SimEngineConfig())
    hashes = (1, 2, 3, 4)  # four 512-token blocks
    engine.add(req("a", prompt=2048, out=1, prefix_hashes=hashes, hash_block_size=512), 0.0)
    (a,) = engine.advance(10.0)
    engine.add(req("b", prompt=2048, out=1, prefix_hashes=hashes, hash_block_size=512), 10.0)
    (b,) = engine.advance(20.0)
    ttft_a, ttft_b = a.first_token_s, b.first_token_s - 10.0
    assert ttft_a == pytest.approx(0.010 + 2048 * 0.0001)
    # three blocks hit (the last is recomputed so that a token can be sampled)
    assert ttft_b == pytest.approx(0.010 + 512 * 0.0001)
    stats = engine.stats()
    assert stats.prefix_cache_queries == 4096 and stats.prefix_cache_hits == 1536
    # each request's own share, on its finishing batch (a Completed's cached_tokens)
    assert (a.finished, a.cached_tokens, b.finished, b.cached_tokens) == (True, 0, True, 1536)
    assert stats.prefilled_tokens == 2048 + 512  # the hits were not computed
    stored, evicted = engine.drain_kv_events()
    assert stored == [1, 2, 3, 4] and evicted == []


def test_lru_eviction_of_unreferenced_blocks_when_space_is_needed():
    engine = SimEngine(LinearPerf(blocks=80), SimEngineConfig())  # 80 blocks of 16 tokens
    engine.add(req("a", prompt=512, out=1, prefix_hashes=(1,), hash_block_size=512), 0.0)
    engine.advance(1.0)
    engine.add(req("b", prompt=512, out=1, prefix_hashes=(2,), hash_block_size=512), 1.0)
    engine.advance(2.0)
    engine.drain_kv_events()
    # Two 512-token entries (32 blocks each) leave 16 blocks free; c needs 44, so one entry
    # goes: the least recently used, a's block 1.
    engine.add(req("c", prompt=700, out=1), 2.0)
    engine.advance(3.0)
    assert engine.drain_kv_events() == ([], [1])


def test_an_eviction_takes_the_end_of_a_released_prefix_and_leaves_its_start_to_hit():
    """vLLM frees a request's blocks in reverse, so the tail of its prefix is evicted first
    (``KVCacheManager.free``). Evicting the start first left the rest cached but unmatchable:
    a prefix is matched from its first block on."""
    engine = SimEngine(LinearPerf(blocks=72), SimEngineConfig())  # 72 blocks of 16 tokens
    prefix = (1, 2, 3, 4)  # four 256-token entries of 16 blocks each: 8 blocks left
    engine.add(req("a", prompt=1024, out=1, prefix_hashes=prefix, hash_block_size=256), 0.0)
    engine.advance(1.0)
    engine.drain_kv_events()
    engine.add(req("b", prompt=200, out=1), 1.0)  # no prefix, 13 blocks: one entry goes
    engine.advance(2.0)
    assert engine.drain_kv_events() == ([], [4])
    engine.add(req("c", prompt=1024, out=1, prefix_hashes=prefix, hash_block_size=256), 2.0)
    (c,) = engine.advance(3.0)
    assert c.cached_tokens == 768  # a's first three entries


def test_free_blocks_are_taken_in_the_order_they_were_freed_cached_or_not():
    """vLLM keeps every free block, cached or not, in one queue in the order it was freed and
    allocates from its oldest end: a cached entry freed before blocks never cached is evicted
    before they are reused. (Before 7 Dec blocks never cached were always taken first, and the
    simulated cache kept entries longer than vLLM's.)"""
    engine = SimEngine(LinearPerf(blocks=80), SimEngineConfig())  # 80 blocks of 16 tokens
    engine.add(req("a", prompt=512, out=1, prefix_hashes=(1,), hash_block_size=512), 0.0)
    engine.advance(1.0)  # entry 1 (32 blocks) freed: 48 free before it
    engine.add(req("b", prompt=640, out=1), 1.0)
    engine.advance(2.0)  # b's 40 blocks, never cached, freed after entry 1: 8 before it
    engine.drain_kv_events()
    engine.add(req("c", prompt=320, out=1), 2.0)  # 20 blocks: the 8, then entry 1
    engine.advance(3.0)
    assert engine.drain_kv_events() == ([], [1])


def test_a_finished_requests_private_tail_is_freed_before_its_prefix():
    """vLLM frees a request's blocks in reverse: the blocks past its cached prefix go into the
    free queue before the prefix, and are reused first."""
    engine = SimEngine(LinearPerf(blocks=80), SimEngineConfig())
    engine.add(req("x", prompt=512, out=1, prefix_hashes=(9,), hash_block_size=512), 0.0)
    engine.advance(1.0)  # entry 9 freed: 48 free before it
    engine.add(req("a", prompt=600, out=1, prefix_hashes=(1,), hash_block_size=512), 1.0)
    engine.advance(2.0)  # 10 free, entry 9, then a's 6 private blocks, then its entry 1
    engine.drain_kv_events()
    engine.add(req("d", prompt=768, out=1), 2.0)  # 48 blocks: the 10, entry 9, the 6
    engine.advance(3.0)
    assert engine.drain_kv_events() == ([], [9])
    engine.add(req("e", prompt=600, out=1, prefix_hashes=(1,), hash_block_size=512), 3.0)
    (e,) = engine.advance(4.0)
    assert e.cached_tokens == 512


def test_a_request_waiting_for_room_leaves_its_cached_prefix_where_it_stands_in_the_lru():
    """vLLM touches a request's prefix hits only once its blocks are allocated: a request that
    cannot be admitted leaves them where they stand in the LRU order. Referenced and released
    again at every step, they were the most recently used, and a cache entry used since went
    first."""
    engine = SimEngine(LinearPerf(blocks=64), SimEngineConfig())  # 64 blocks of 16 tokens
    engine.add(req("p", prompt=256, out=1, prefix_hashes=(1,), hash_block_size=256), 0.0)
    engine.advance(1.0)
    engine.add(req("q", prompt=256, out=1, prefix_hashes=(2,), hash_block_size=256), 1.0)
    engine.advance(2.0)  # entries 1 and 2 cached (16 blocks each), 1 the least recently used
    engine.drain_kv_events()
    engine.add(req("big", prompt=500, out=40), 2.0)  # 32 blocks, a 33rd from its 13th token
    # w hits entry 1 but needs 32 blocks more: it waits until big is done
    engine.add(req("w", prompt=768, out=1, prefix_hashes=(1, 3, 4), hash_block_size=256), 2.0)
    engine.advance(2.35)
    assert engine.stats().waiting == 1
    assert engine.drain_kv_events() == ([], [1])  # big's 33rd block: the LRU entry


def test_preemption_by_recompute_under_kv_pressure_and_every_request_completes():
    engine = SimEngine(LinearPerf(blocks=40), SimEngineConfig())  # 640 tokens of KV
    for i in range(3):
        engine.add(req(f"r{i}", prompt=150, out=150), 0.0)
    batches = run(engine, 30.0, step=0.01)
    assert engine.preemptions > 0
    assert engine.stats().prefilled_tokens > 3 * 150  # a preempted request is prefilled again
    streams = {}
    for b in batches:
        streams.setdefault(b.request_id, []).extend(range(b.token_offset, b.token_offset + b.count))
    assert {rid: s for rid, s in streams.items()} == {f"r{i}": list(range(150)) for i in range(3)}


def test_cold_start_serves_nothing_until_weights_are_loaded():
    engine = SimEngine(LinearPerf(load=20.0), SimEngineConfig(), now_s=0.0, warm=False)
    engine.add(req(prompt=100, out=1), 1.0)
    assert engine.advance(19.9) == [] and engine.stats().state == "loading"
    (b,) = engine.advance(21.0)
    assert b.first_token_s == pytest.approx(20.0 + 0.010 + 0.01)


def test_crash_loses_everything_and_accepts_nothing():
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(), 0.0)
    engine.crash()
    assert engine.advance(10.0) == [] and engine.stats().state == "crashed"
    with pytest.raises(RuntimeError, match="crashed"):
        engine.add(req("x"), 10.0)


def test_slowdown_multiplies_step_time_and_stall_delays_the_next_step():
    slow = SimEngine(LinearPerf(), SimEngineConfig())
    slow.slow_down(3.0)
    slow.add(req(prompt=1000, out=1), 0.0)
    assert slow.advance(10.0)[0].first_token_s == pytest.approx(3 * 0.110)
    stalled = SimEngine(LinearPerf(), SimEngineConfig())
    stalled.stall(5.0)
    stalled.add(req(prompt=1000, out=1), 0.0)
    assert stalled.advance(10.0)[0].first_token_s == pytest.approx(5.110)


def test_skip_ahead_equals_step_by_step_decoding():
    def finish_times(step):
        engine = SimEngine(LinearPerf(), SimEngineConfig())
        for i, out in enumerate((40, 90, 200)):
            engine.add(req(f"r{i}", prompt=64, out=out), 0.0)
        return {b.request_id: b.time_s for b in run(engine, 10.0, step) if b.finished}, engine.steps

    fine, fine_steps = finish_times(0.0005)
    coarse, coarse_steps = finish_times(5.0)
    assert fine_steps == coarse_steps
    for rid in fine:  # decode context grows within a jump: times agree closely
        assert coarse[rid] == pytest.approx(fine[rid], rel=1e-6)


def test_continuation_resumes_at_the_token_offset_with_the_sent_tokens_as_prompt():
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=100, out=10, resume_from_token=4), 0.0)
    (b,) = engine.advance(10.0)
    assert b.token_offset == 4 and b.first and b.count == 6
    assert b.tokens == tuple(reference_token("r", i) for i in range(4, 10))
    assert b.first_token_s == pytest.approx(0.010 + 104 * 0.0001)


def test_a_request_that_can_never_fit_is_refused_with_the_numbers():
    engine = SimEngine(LinearPerf(blocks=10), SimEngineConfig())
    with pytest.raises(CapacityError, match="need 13 KV blocks; this GPU holds 10"):
        engine.add(req(prompt=200, out=1), 0.0)


def test_a_request_past_the_model_context_is_refused_as_vllm_refuses_it():
    engine = SimEngine(LinearPerf(max_model_len=1024), SimEngineConfig())
    with pytest.raises(CapacityError, match="maximum context length is 1024 tokens; the request "
                                            "has 1000 prompt and 25 output tokens"):
        engine.add(req(prompt=1000, out=25), 0.0)
    engine.add(req("fits", prompt=1000, out=24), 0.0)  # prompt and output: exactly the context
    # a continuation counts the tokens already sent as prompt: the same total
    with pytest.raises(CapacityError, match="1005 prompt and 20 output"):
        engine.add(req("cont", prompt=1000, out=25, resume_from_token=5), 0.0)


def test_a_configured_max_model_len_shortens_the_model_context_but_cannot_pass_it():
    short = SimEngine(LinearPerf(max_model_len=4096), SimEngineConfig(max_model_len=512))
    with pytest.raises(CapacityError, match="maximum context length is 512"):
        short.add(req(prompt=500, out=13), 0.0)
    assert SimEngine(LinearPerf(), SimEngineConfig(max_model_len=512)).max_model_len == 512
    assert SimEngine(LinearPerf(), SimEngineConfig()).max_model_len is None
    with pytest.raises(ValueError, match="max_model_len 8192 is greater than the model's maximum "
                                         "context length, 4096"):
        SimEngine(LinearPerf(max_model_len=4096), SimEngineConfig(max_model_len=8192))


def test_abort_of_running_and_waiting_requests():
    engine = SimEngine(LinearPerf(), SimEngineConfig(max_num_seqs=1))
    engine.add(req("a", out=100), 0.0)
    engine.add(req("b", out=100), 0.0)
    engine.advance(0.05)
    assert engine.abort("b") and engine.abort("a") and not engine.abort("zzz")
    assert engine.stats().running == 0 and engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("first_unit, then_unit", [(48, 16), (16, 48)])
def test_one_hash_id_sent_with_two_block_sizes_is_two_prefixes_not_a_hang(first_unit, then_unit):
    """The same prefix ids with another ``hash_block_size`` stand for other tokens: a request
    neither matches nor shares the entries cached at the other size, and it still runs."""
    engine = SimEngine(LinearPerf(blocks=10), SimEngineConfig(block_size=16))
    ids = (1, 2, 3, 4, 5, 6)
    engine.add(req("a", prompt=96, out=1, prefix_hashes=ids[:96 // first_unit],
                   hash_block_size=first_unit), 0.0)
    assert [b.finished for b in run(engine, 1.0)] == [True]
    engine.add(req("b", prompt=100, out=60, prefix_hashes=ids[:100 // then_unit],
                   hash_block_size=then_unit), 1.0)
    done = [b for b in engine.advance(100.0) if b.finished]
    assert [b.request_id for b in done] == ["b"] and engine.next_event_s() is None
    assert engine.stats().kv_blocks_used == 0  # nothing left referenced


def test_the_prefix_hit_rate_counts_each_request_once_not_its_readmissions():
    """A preempted request admitted again finds its own prompt blocks still cached: vLLM leaves
    those lookups out of its hit rate, and so does the engine (they made a thrashing engine look
    good at caching)."""
    engine = SimEngine(LinearPerf(blocks=40), SimEngineConfig())
    for i in range(3):
        engine.add(req(f"r{i}", prompt=150, out=150), 0.0)
    run(engine, 30.0, step=0.01)
    assert engine.preemptions > 0
    assert engine.stats().prefix_cache_queries == 3 * 150  # each request's first admission


def test_kv_events_say_what_the_cache_holds_after_an_eviction_and_a_store_again():
    """Evicted and stored again between two drains: stored (as two lists, stored read before
    evicted, the block read as gone); stored and evicted again: evicted."""
    from workers.sim.kv_cache import KvCache

    kv = KvCache(num_blocks=4)
    for h in (7, 8):
        assert kv.allocate(2) and kv.promote(h, 2)
    kv.drain_events()
    kv.release((7, 8))
    assert kv.allocate(4)  # evicts 7 and 8
    kv.free(4)
    assert kv.allocate(2) and kv.promote(7, 2)  # stored again
    assert kv.drain_events() == ([7], [8])
    assert kv.allocate(2) and kv.promote(9, 2)
    kv.release((7, 9))
    assert kv.allocate(4)  # evicts 9 and 7, the tail first (9 stored since the last drain)
    assert kv.drain_events() == ([], [9, 7])


def test_a_decode_skip_takes_its_blocks_before_a_request_finishing_in_it_frees_its_own():
    """Step by step, every running request's blocks for a step are taken before the step ends
    and frees a finishing request's: a skip over many steps evicts the same cached entries."""

    def evicted(skip: bool) -> list[int]:
        engine = SimEngine(LinearPerf(blocks=6), SimEngineConfig())
        if not skip:
            engine._skip_decode = lambda now_s: False
        engine.add(req("c", prompt=32, out=1, prefix_hashes=(1, 2), hash_block_size=16), 0.0)
        engine.advance(1.0)
        engine.add(req("a", prompt=20, out=5), 1.0)
        engine.add(req("b", prompt=29, out=20), 1.0)
        engine.advance(1.2)  # a finishes within this stretch
        return engine.drain_kv_events()[1]

    assert evicted(skip=True) == evicted(skip=False) == [2]  # (c's tail, as vLLM frees)


def test_stats_report_the_prefill_backlog_and_the_context_its_sequences_have_computed():
    engine = SimEngine(LinearPerf(), SimEngineConfig(max_num_batched_tokens=1_000))
    engine.add(req("long", prompt=3_500, out=2), 0.0)
    engine.advance(0.0)  # the first chunk of 1,000 tokens is under way
    engine.advance(engine.next_event_s())
    stats = engine.stats()
    assert (stats.prefill_backlog_tokens, stats.prefill_context_tokens) == (2_500, 1_000)


def test_an_answer_shorter_than_max_tokens_stops_there_and_says_stop():
    """max_tokens is the client's cap: the simulated model ends its answer at its own length
    (its end of sequence), in the time that length takes, and only the answer needs KV."""
    capped, exact = (SimEngine(LinearPerf(blocks=10), SimEngineConfig()) for _ in range(2))
    capped.add(req(prompt=100, out=2000, answer_tokens=5), 0.0)  # 2,100 tokens: 132 blocks
    exact.add(req(prompt=100, out=5), 0.0)
    ((a,), (b,)) = capped.advance(10.0), exact.advance(10.0)
    assert a.count == b.count == 5 and a.time_s == b.time_s and a.tokens == b.tokens
    assert (a.finish_reason, b.finish_reason) == ("stop", "length")


def test_an_answer_as_long_as_its_cap_is_cut_by_it():
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=100, out=5, answer_tokens=9), 0.0)
    (b,) = engine.advance(10.0)
    assert b.count == 5 and b.finish_reason == "length"


def test_a_continuation_past_its_answers_end_samples_one_token_and_stops():
    """Should a router resume an answer that had ended (one that missed its final chunk: its
    worker lost after the last token and before it said so), the model samples its end of
    sequence at once: one token, finish reason stop."""
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req(prompt=100, out=2000, answer_tokens=5, resume_from_token=5), 0.0)
    (b,) = engine.advance(10.0)
    assert (b.token_offset, b.count, b.finished, b.finish_reason) == (5, 1, True, "stop")


def test_the_context_check_counts_max_tokens_not_the_answer_it_will_run_to():
    """vLLM refuses ``prompt + max_tokens`` past ``max_model_len`` whatever the model would
    have sampled; the simulated engine counted the (offline simulator's) ``answer_tokens``, so
    in ``governor sim`` (``--max-tokens longest``, the default) the baselines' engines served
    what governor's router refused as too long for the context."""
    engine = SimEngine(LinearPerf(max_model_len=1024), SimEngineConfig())
    with pytest.raises(CapacityError, match="1000 prompt and 25 output tokens"):
        engine.add(req(prompt=1000, out=25, answer_tokens=5), 0.0)
    with pytest.raises(CapacityError, match="1005 prompt and 20 output tokens"):
        engine.add(req("cont", prompt=1000, out=25, answer_tokens=5, resume_from_token=5), 0.0)
    engine.add(req("fits", prompt=1000, out=24, answer_tokens=5), 0.0)


def test_a_decoding_request_caches_the_blocks_its_answer_fills_as_each_fills():
    """vLLM's prefix cache hashes the blocks a sequence's generated tokens fill too, each once
    its KV is computed: a conversation's next turn, which re-sends the answer, hits them on the
    worker that generated it. Only full blocks: the one the answer ends in partway is not."""
    engine = SimEngine(LinearPerf(), SimEngineConfig())  # 16-token blocks
    # 40 prompt tokens (two full blocks), 50 answer tokens: tokens 32-47 fill block 3, 48-63
    # block 4, 64-79 block 5; 80-89 half of block 6
    engine.add(req("a", prompt=40, out=50, prefix_hashes=(1, 2), hash_block_size=16,
                   answer_hashes=(3, 4, 5, 6)), 0.0)
    first = engine.advance(0.0141)[0].first_token_s  # its prefill: 40 tokens
    assert engine.drain_kv_events() == ([1, 2], [])
    decode = 0.0101
    engine.advance(first + 7 * decode)  # token 47's KV not yet computed
    assert engine.drain_kv_events() == ([], [])
    engine.advance(first + 8 * decode)
    assert engine.drain_kv_events() == ([3], [])
    done = [b for b in engine.advance(10.0) if b.finished]
    assert [b.request_id for b in done] == ["a"]
    assert engine.drain_kv_events() == ([4, 5], [])  # block 6 never filled
    assert engine.stats().kv_blocks_used == 0  # its answer's blocks released with the rest
    # the next turn: prompt and answer re-sent, and more
    engine.add(req("b", prompt=120, out=1, prefix_hashes=(1, 2, 3, 4, 5, 6, 7),
                   hash_block_size=16), 10.0)
    (b,) = engine.advance(20.0)
    assert b.cached_tokens == 80  # blocks 1-5


def test_a_new_request_matches_its_prompts_blocks_never_those_its_answer_will_fill():
    """At admission a request holds its prompt's tokens alone: cached blocks of its answer are
    hit only once it has generated them (a resumed attempt's prompt holds those already sent)."""
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req("c", prompt=64, out=1, prefix_hashes=(1, 2, 3, 4), hash_block_size=16), 0.0)
    engine.advance(1.0)
    engine.add(req("a", prompt=40, out=30, prefix_hashes=(1, 2), hash_block_size=16,
                   answer_hashes=(3, 4)), 1.0)
    (a,) = [b for b in engine.advance(2.0) if b.finished]
    assert a.cached_tokens == 32  # its prompt's two full blocks, not blocks 3 and 4
    # resumed after 30 tokens were sent: 70 tokens of prompt, blocks 1-4 its own
    engine.add(req("a2", prompt=40, out=40, resume_from_token=30, prefix_hashes=(1, 2),
                   hash_block_size=16, answer_hashes=(3, 4)), 2.0)
    (a2,) = [b for b in engine.advance(3.0) if b.finished]
    assert a2.cached_tokens == 64
    assert engine.stats().kv_blocks_used == 0


def test_answer_blocks_follow_the_prompts_full_blocks_only_when_each_has_an_id():
    """A prompt whose ids stop short of its full blocks: its answer's blocks would stand at
    other offsets, so none is cached."""
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req("a", prompt=40, out=50, prefix_hashes=(1,), hash_block_size=16,
                   answer_hashes=(3, 4)), 0.0)
    engine.advance(10.0)
    assert engine.drain_kv_events() == ([1], [])


def test_a_prompt_under_one_block_still_caches_its_answer_in_units_of_its_hash_block_size():
    """A short first turn has no prompt ids, yet its answer fills blocks of the next turn's
    64-token ids."""
    engine = SimEngine(LinearPerf(), SimEngineConfig())
    engine.add(req("a", prompt=30, out=120, hash_block_size=64, answer_hashes=(1, 2, 3)), 0.0)
    engine.advance(10.0)
    assert engine.drain_kv_events() == ([1, 2], [])  # 149 tokens computed: two 64-token blocks
    assert engine.stats().kv_blocks_used == 0


def test_answer_blocks_under_preemption_and_abort_are_released_whole():
    """Preempted or aborted, a request drops its answer's blocks with the rest (cached, no
    longer referenced); every answer block filled is cached. Stepped one decode at a
    time or skipped over, the same blocks are cached in the same order."""

    def served(skip: bool) -> tuple[list[int], int]:
        engine = SimEngine(LinearPerf(blocks=40), SimEngineConfig())  # 640 tokens of KV
        if not skip:
            engine._skip_decode = lambda now_s: False
        for i in range(3):  # 300 tokens each, 19 blocks: not all three fit
            base = i * 100
            engine.add(req(f"r{i}", prompt=150, out=150, prefix_hashes=tuple(range(base, base + 9)),
                           hash_block_size=16, answer_hashes=tuple(range(base + 9, base + 20))),
                       0.0)
        engine.add(req("x", prompt=96, out=400, prefix_hashes=tuple(range(500, 506)),
                       hash_block_size=16, answer_hashes=tuple(range(506, 530))), 0.0)
        run(engine, 0.5, step=0.01)
        assert engine.abort("x")
        batches = run(engine, 30.0, step=0.01)
        assert sorted(b.request_id for b in batches if b.finished) == ["r0", "r1", "r2"]
        assert engine.stats().kv_blocks_used == 0
        return engine.kv.stored, engine.preemptions

    stored, preemptions = served(skip=True)
    assert preemptions > 0
    assert (stored, preemptions) == served(skip=False)
    for i in range(3):  # 299 tokens computed: 18 full blocks, 9 of prompt and 9 of answer
        assert set(range(i * 100, i * 100 + 18)) <= set(stored)
        assert i * 100 + 18 not in stored
    assert 506 in stored and 529 not in stored  # x's answer until it was aborted
