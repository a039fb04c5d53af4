"""Reading a vLLM server's /metrics through the one name mapping, current and older names alike."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from tests.http_stand_ins import IDLE_METRICS, serving, vllm_app
from workers.engine import EngineRequest, EngineStats
from workers.metrics import EngineMetrics
from workers.vllm_engine import (
    KV_PER_MILLE_BLOCKS, PLACEHOLDER_BASE, PLACEHOLDER_SPAN, VllmHttpEngine, engine_stats,
    parse_metrics, prompt_token_ids, read_signals, stats_from_text,
)

#: A server's counts as it starts: the baseline of the work a worker exports.
FRESH = EngineStats(running=0, waiting=0, steps=0, prefilled_tokens=0)

# What a vLLM 0.6-era server exported: gpu_* names, a counter without a TYPE line.
OLD_VLLM = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Meta-Llama-3-8B"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Meta-Llama-3-8B"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Meta-Llama-3-8B"} 0.25
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="meta-llama/Meta-Llama-3-8B"} 1000.0
vllm:gpu_prefix_cache_hits_total{model_name="meta-llama/Meta-Llama-3-8B"} 400.0
vllm:num_preemptions_total{model_name="meta-llama/Meta-Llama-3-8B"} 7.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.7
"""

CURRENT_VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
"""


def test_parse_metrics_sums_label_sets_and_skips_buckets_and_created():
    values = parse_metrics(CURRENT_VLLM)
    assert values["vllm:num_requests_running"] == 3.0
    assert values["vllm:prefix_cache_queries_total"] == 64.0
    assert not any(name.endswith(("_created", "_bucket")) for name in parse_metrics(OLD_VLLM))
    assert parse_metrics(OLD_VLLM)["vllm:time_to_first_token_seconds_count"] == 5.0


@pytest.mark.parametrize("text, expected", [
    (OLD_VLLM, {"running": 3, "waiting": 2, "kv_usage": 0.25, "prefix_cache_queries": 1000,
                "prefix_cache_hits": 400, "preemptions": 7}),
    (CURRENT_VLLM, {"running": 3, "waiting": 0, "kv_usage": 0.5, "prefix_cache_queries": 64,
                    "prefix_cache_hits": 32, "preemptions": 1}),
], ids=["old-names", "current-names"])
def test_signals_read_from_current_or_old_names(text, expected):
    signals = read_signals(parse_metrics(text))
    assert {k: signals[k] for k in expected} == pytest.approx(expected)


def test_old_gpu_cache_usage_maps_to_kv_usage_in_per_mille_blocks_without_a_block_count():
    stats = stats_from_text(OLD_VLLM)
    assert stats == EngineStats(running=3, waiting=2, kv_blocks_used=250,
                                kv_blocks_free=KV_PER_MILLE_BLOCKS - 250, prefix_cache_queries=1000,
                                prefix_cache_hits=400, preemptions=7, state="warm")


def test_cache_config_info_gives_real_block_counts():
    text = CURRENT_VLLM + ('# TYPE vllm:cache_config_info gauge\n'
                           'vllm:cache_config_info{block_size="16",num_gpu_blocks="2000"} 1.0\n')
    stats = stats_from_text(text)
    assert (stats.kv_blocks_used, stats.kv_blocks_free) == (1000, 1000)


def test_what_engine_metrics_exports_reads_back_as_the_same_stats():
    registry = CollectorRegistry()
    metrics = EngineMetrics("llama-3-8b", registry)
    sent = EngineStats(running=4, waiting=1, kv_blocks_used=3_000, kv_blocks_free=25_262,
                       prefix_cache_queries=500, prefix_cache_hits=200, preemptions=2,
                       steps=40, prefilled_tokens=900)
    metrics.observe_stats(FRESH)  # (an engine's first counts are the baseline)
    metrics.observe_tokens(120)
    metrics.observe_stats(sent)
    back = stats_from_text(generate_latest(registry).decode())
    assert back == sent


def test_steps_and_prompt_tokens_computed_come_from_the_tokens_per_step_histogram():
    """vLLM's ``iteration_tokens_total``: steps are its count; its sum less the tokens generated
    and the prefix-cache hits is the prompt tokens computed. A server without it counts none."""
    text = CURRENT_VLLM + """\
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 120.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 120.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 2532.0
"""
    stats = stats_from_text(text)
    assert (stats.steps, stats.prefilled_tokens) == (120, 2532 - 500 - 32)
    assert (stats_from_text(CURRENT_VLLM).steps, stats_from_text(OLD_VLLM).prefilled_tokens) == (
        None, None)


def test_the_exported_work_moves_forward_only():
    registry = CollectorRegistry()
    metrics = EngineMetrics("m", registry)
    metrics.observe_stats(FRESH)
    metrics.observe_stats(EngineStats(running=1, waiting=0, steps=50, prefilled_tokens=400))
    metrics.observe_stats(EngineStats(running=1, waiting=0, steps=3, prefilled_tokens=10))  # a new engine
    metrics.observe_stats(EngineStats(running=1, waiting=0, steps=8, prefilled_tokens=30))
    back = stats_from_text(generate_latest(registry).decode())
    assert (back.steps, back.prefilled_tokens) == (55, 420)


def test_a_long_running_server_s_first_scrape_is_the_baseline_of_the_work_exported():
    """A worker started beside a vLLM server that has run for days: its first scrape gives the
    server's whole history, no work of this worker's. Before, it was added at once: a million
    steps and their prompt tokens, beside only the tokens generated since the worker started
    (so a worker's restart reset the histogram's sum and not its count)."""
    registry = CollectorRegistry()
    metrics = EngineMetrics("m", registry)
    history = EngineStats(running=1, waiting=0, prefix_cache_hits=9_000_000,
                          steps=1_000_000, prefilled_tokens=40_000_000)
    metrics.observe_stats(history)
    metrics.observe_tokens(10)
    metrics.observe_stats(replace(history, prefix_cache_hits=9_000_032, steps=1_000_010,
                                  prefilled_tokens=40_000_300))
    values = parse_metrics(generate_latest(registry).decode())
    assert values["vllm:iteration_tokens_total_count"] == 10
    assert values["vllm:iteration_tokens_total_sum"] == 300 + 32 + 10


def test_engine_stats_clamps_usage():
    assert engine_stats({"kv_usage": 1.7}).kv_blocks_free == 0
    assert engine_stats({}).kv_blocks_used == 0


def test_placeholder_prompts_share_ids_exactly_where_prefix_hashes_match():
    a = EngineRequest("a", prompt_tokens=40, max_tokens=4, prefix_hashes=(1, 2), hash_block_size=16)
    b = EngineRequest("b", prompt_tokens=40, max_tokens=4, prefix_hashes=(1, 3), hash_block_size=16)
    ids_a, ids_b = prompt_token_ids(a), prompt_token_ids(b)
    assert len(ids_a) == len(ids_b) == 40
    assert ids_a[:16] == ids_b[:16] and ids_a[16:32] != ids_b[16:32] and ids_a[32:] != ids_b[32:]
    assert all(PLACEHOLDER_BASE <= t < PLACEHOLDER_BASE + PLACEHOLDER_SPAN for t in ids_a)
    assert prompt_token_ids(a) == ids_a  # deterministic


def test_a_continuation_prompt_carries_one_id_per_token_already_sent():
    first = EngineRequest("r", prompt_tokens=10, max_tokens=8)
    resumed = EngineRequest("r", prompt_tokens=10, max_tokens=8, resume_from_token=3)
    assert prompt_token_ids(resumed)[:10] == prompt_token_ids(first)
    assert len(prompt_token_ids(resumed)) == 13
    assert prompt_token_ids(EngineRequest("e", prompt_tokens=0, max_tokens=1)) == [PLACEHOLDER_BASE]


def test_kv_use_of_several_engines_behind_one_server_is_their_mean():
    """A data-parallel server exports a fraction per engine: summed, two engines at 60% read
    as a full cache."""
    text = ('# TYPE vllm:kv_cache_usage_perc gauge\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.6\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4\n'
            '# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n')
    stats = stats_from_text(text)
    assert (stats.kv_blocks_used, stats.running) == (500, 5)  # a mean; a count summed
    # Two engines of 2,000 blocks each: vLLM's front end sums them as they start, and labels
    # each engine's cache config with that sum (read as their sum, 8,000: the router saw twice
    # the free blocks there are, and four times on four engines).
    text += ('# TYPE vllm:cache_config_info gauge\n'
             'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4000"} 1.0\n'
             'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="4000"} 1.0\n')
    stats = stats_from_text(text)  # the server's blocks: both engines'
    assert (stats.kv_blocks_used, stats.kv_blocks_free) == (2_000, 2_000)


def test_a_server_down_for_long_is_logged_at_each_doubling_of_its_failed_contacts():
    """A scrape every 0.5 s logged a warning each (7,200 an hour): now the first three (the
    third makes the worker crashed), then 4, 8, 16 ..."""
    from workers.vllm_engine import _worth_logging

    assert [n for n in range(1, 200) if _worth_logging(n)] == [1, 2, 3, 4, 8, 16, 32, 64, 128]


class _Unreachable:
    """A session whose server cannot be reached (each GET fails to connect)."""

    def get(self, url, **kwargs):
        import aiohttp

        raise aiohttp.ClientConnectionError(f"cannot connect to {url}")


def test_a_failed_scrape_after_failed_requests_is_logged_as_one_of_the_first_three(caplog):
    """Requests cut short when a busy server dies count as failed contacts too (they make the
    worker crashed sooner), but the log is throttled by failed scrapes: the first three of them
    are logged however many requests failed before (README), then one at each doubling."""
    import asyncio
    import logging

    from workers.vllm_engine import VllmHttpEngine

    async def scrapes(lost_requests: int, count: int) -> list[str]:
        engine = VllmHttpEngine("http://vllm.invalid:8000")
        engine._session = _Unreachable()
        for _ in range(lost_requests):  # (a busy worker's streams, cut when the server died)
            engine._lost_contact()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="workers.vllm_engine"):
            for _ in range(count):
                await engine._scrape()
        assert engine._scraped.state == "crashed"
        return [r.getMessage() for r in caplog.records if "scraping" in r.getMessage()]

    logged = asyncio.run(scrapes(lost_requests=20, count=3))
    assert [m.split("(")[1].split(" ")[0] for m in logged] == ["21", "22", "23"]
    assert len(asyncio.run(scrapes(lost_requests=0, count=16))) == 6  # 1, 2, 3, 4, 8, 16


# A vLLM server since its labelled prompt-token counter (vllm-project/vllm PR #33290, February
# 2026: ``vllm:prompt_tokens_by_source`` in ``vllm/v1/metrics/loggers.py``, counted once per
# request as its prefill is computed) under KV pressure: requests that waited for KV blocks had
# their prefix-cache lookups counted again at each step they waited (vllm-project/vllm issue
# #43736), so ``prefix_cache_*`` say 20,000 hits of 30,000 queries where 2,000 of the 5,000
# prompt tokens prefilled were hits.
BY_SOURCE_VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 40.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 30000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 20000.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 3000.0
vllm:prompt_tokens_by_source_created{engine="0",model_name="m",source="local_compute"} 1.7e9
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 2000.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 700.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 90.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 90.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 5700.0
"""


def test_prompt_tokens_by_source_give_the_prefill_work_and_hits_where_lookups_were_recounted():
    """Where vLLM counts prompt tokens by source, the prompt tokens computed are its
    ``local_compute`` ones and the hits its ``local_cache_hit`` ones (queries: all of them), not
    what lookups repeated while requests waited for KV blocks say (before: 5,700 - 700 - 20,000
    computed, clamped to 0, and a 67% hit rate)."""
    stats = stats_from_text(BY_SOURCE_VLLM)
    assert (stats.steps, stats.prefilled_tokens) == (90, 3000)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (5000, 2000)
    assert (stats.running, stats.waiting) == (8, 40)


def test_what_a_worker_exports_from_by_source_counts_adds_up_to_vllm_s_tokens_per_step():
    """The worker's own ``iteration_tokens_total`` (prompt tokens computed plus hits, and the
    tokens generated) reads back as the server's."""
    registry = CollectorRegistry()
    metrics = EngineMetrics("m", registry)
    metrics.observe_stats(FRESH)
    metrics.observe_stats(stats_from_text(BY_SOURCE_VLLM))
    values = parse_metrics(generate_latest(registry).decode())
    assert values["vllm:iteration_tokens_total_sum"] == 5000


@contextlib.asynccontextmanager
async def _scraping(page: list[str], scrape_interval_s: float) -> AsyncIterator[VllmHttpEngine]:
    """An adapter started on a stand-in server whose ``/metrics`` serve ``page[0]`` (changed
    as the test goes), and that refuses every request."""
    async def completions(request):
        return web.json_response({"error": {"message": "not here", "code": 400}}, status=400)

    async with serving(vllm_app(completions, lambda: page[0])) as url:
        engine = VllmHttpEngine(url, sim_extensions=False, connect_timeout_s=5,
                                scrape_interval_s=scrape_interval_s)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.close()


def test_a_first_scrape_no_parser_expects_does_not_fail_the_start():
    """``+Inf`` requests running (an ``OverflowError`` as a count): the scrapes after the first
    log it and scrape on; the first, in ``start()``, raised it, and the worker did not start.
    Now it starts, ``starting`` until a scrape reads."""
    page = ["vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n"]

    async def scenario():
        async with _scraping(page, scrape_interval_s=0.05) as engine:
            first = engine.stats().state
            page[0] = IDLE_METRICS
            async with asyncio.timeout(10):
                while engine.stats().state != "warm":
                    await asyncio.sleep(0.01)
            return first

    assert asyncio.run(scenario()) == "starting"


@pytest.mark.parametrize("bad_page", [
    "vllm:num_requests_running{engine=\n",  # (no parser reads it: a ValueError)
    "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n",  # (a ValueError as a count)
    "vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n",  # (an OverflowError)
], ids=["unparsable", "nan", "inf"])
def test_a_server_that_answers_a_page_no_parser_reads_is_not_crashed(bad_page, caplog):
    """The server answered: its worker serves on, the load as its last scrape read it, and the
    problem is logged once per kind (a worker ``crashed`` by failed contacts is served again).
    Before, a ``ValueError`` counted as a failed contact, and three such pages in a row made the
    worker ``crashed`` (sent no request more)."""
    page = [IDLE_METRICS.replace(" 0\n", " 2\n", 1)]

    async def scenario():
        async with _scraping(page, scrape_interval_s=60) as engine:
            page[0] = bad_page
            for _ in range(3):  # (requests cut short: the server was down a moment)
                engine._lost_contact()
            assert engine.stats().state == "crashed"
            for _ in range(5):
                await engine._scrape_logged()
            return engine.stats()

    with caplog.at_level(logging.WARNING, logger="workers.vllm_engine"):
        stats = asyncio.run(scenario())
    assert (stats.state, stats.running) == ("warm", 2)
    assert len([r for r in caplog.records if "metrics" in r.getMessage()]) == 1


def test_prefix_cache_and_preemption_counts_start_with_the_worker():
    """A worker started beside a long-running server counts its prefix-cache queries and hits
    and its preemptions from its start, as its tokens and steps: the server's counts at the
    first scrape are its history. Before, its heartbeats and ``vllm:prefix_cache_*_total``
    carried the server's whole history (the cache report counted it all on the worker's first
    day). A server restarted (its counts back to near 0) counts from 0."""
    history = CURRENT_VLLM.replace(" 64.0", " 64000.0").replace(" 32.0", " 32000.0")
    page = [history.replace("preemptions_total{engine=\"0\",model_name=\"m\"} 1.0",
                            "preemptions_total{engine=\"0\",model_name=\"m\"} 700.0")]

    async def scenario():
        async with _scraping(page, scrape_interval_s=60) as engine:
            metrics = EngineMetrics("m")
            metrics.observe_stats(engine.stats())  # (the worker's baseline)
            page[0] = page[0].replace("64000.0", "64100.0").replace("32000.0", "32040.0")
            page[0] = page[0].replace("700.0", "702.0")
            await engine._scrape()
            metrics.observe_stats(moved := engine.stats())
            page[0] = CURRENT_VLLM  # (the server restarted: 64 queries, 32 hits, 1 preemption)
            await engine._scrape()
            metrics.observe_stats(restarted := engine.stats())
            return moved, restarted, parse_metrics(generate_latest(metrics.registry).decode())

    moved, restarted, exported = asyncio.run(scenario())
    counts = lambda s: (s.prefix_cache_queries, s.prefix_cache_hits, s.preemptions)  # noqa: E731
    assert counts(moved) == (100, 40, 2)
    assert counts(restarted) == (164, 72, 3)
    assert (exported["vllm:prefix_cache_queries_total"], exported["vllm:prefix_cache_hits_total"],
            exported["vllm:num_preemptions_total"]) == (164, 72, 3)


def test_a_crashed_server_is_reported_holding_no_request_and_no_kv_block():
    """A server that cannot be reached holds nothing its worker can count on (a dead vLLM's
    requests and cache went with it; the worker's own requests in flight there count as
    waiting, until they are handed back), as a simulated engine that crashed reports. Before,
    every heartbeat carried the load of the last scrape that read it, for as long as the server
    stayed down: 3 requests running and half the KV cache used, on a worker holding none (the
    streams' cost split and utilisation counted it busy). Answering again, it reports what it
    is read to hold."""
    page = [CURRENT_VLLM]

    async def scenario():
        async with _scraping(page, scrape_interval_s=60) as engine:
            read = engine.stats()
            for _ in range(3):  # (its requests cut short: the server died)
                engine._lost_contact()
            crashed = engine.stats()
            await engine._scrape()
            return read, crashed, engine.stats()

    read, crashed, again = asyncio.run(scenario())
    assert (read.running, read.kv_blocks_used) == (3, KV_PER_MILLE_BLOCKS // 2)
    assert crashed.state == "crashed"
    assert (crashed.running, crashed.waiting, crashed.kv_blocks_used, crashed.kv_blocks_free) == (
        0, 0, 0, KV_PER_MILLE_BLOCKS)
    assert (crashed.prefix_cache_queries, crashed.preemptions) == (
        read.prefix_cache_queries, read.preemptions)  # (counters: as counted)
    assert (again.state, again.running, again.kv_blocks_used) == (
        "warm", 3, KV_PER_MILLE_BLOCKS // 2)
