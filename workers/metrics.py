"""Prometheus metrics of one engine under vLLM's names, so vLLM dashboards work unchanged.

Counters are exported the way prometheus-client writes them (``<name>_total``), as vLLM does.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from workers.engine import EngineStats, TokenBatch
from workers.metric_names import ITERATION_TOKENS
from workers.metric_names import current_name as name

#: vLLM's bucket bounds (``vllm/v1/metrics/loggers.py``), which its dashboards read: TTFT from 1 ms
#: to 43 minutes, a request's latency from 0.3 s to two hours, inter-token latency from 10 ms to
#: 80 s.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)


class EngineMetrics:
    def __init__(self, model: str, registry: CollectorRegistry | None = None,
                 block_size: int = 16) -> None:
        """``block_size``: tokens per KV block, the unit of the engine's block counts."""
        self.registry = registry or CollectorRegistry()
        self.model = model
        self.block_size = block_size
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge(name("running"), "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge(name("waiting"), "Requests waiting to be scheduled.", labels, registry=r)
        self.kv_usage = Gauge(name("kv_usage"), "KV cache usage, 0 to 1.", labels, registry=r)
        self.prefix_queries = Counter(name("prefix_cache_queries"),
                                      "Prompt tokens looked up in the prefix cache.", labels, registry=r)
        self.prefix_hits = Counter(name("prefix_cache_hits"),
                                   "Prompt tokens found in the prefix cache.", labels, registry=r)
        self.preemptions = Counter(name("preemptions"), "Preemptions by recompute.", labels, registry=r)
        self.prompt_tokens = Counter(name("prompt_tokens"), "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(name("generation_tokens"), "Tokens generated.", labels, registry=r)
        self.success = Counter(name("request_success"), "Requests finished.", [*labels, "finished_reason"],
                               registry=r)
        self.ttft = Histogram(name("ttft_seconds"), "Time to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(name("e2e_seconds"), "End-to-end request latency.", labels,
                             buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(name("inter_token_seconds"), "Inter-token latency.", labels,
                             buckets=ITL_BUCKETS, registry=r)
        self.iterations = _IterationTokens(model)
        r.register(self.iterations)
        self.cache_config = Gauge(name("cache_config"), "The KV cache's configuration.",
                                  ["block_size", "num_gpu_blocks"], registry=r)
        self._blocks: int | None = None
        self._last = EngineStats(running=0, waiting=0)

    def switch_model(self, model: str) -> None:
        """The engine serves ``model`` now: the gauges of the one before are removed (its
        counters and histograms stay, as the history they are)."""
        if model != self.model:
            for gauge in (self.running, self.waiting, self.kv_usage):
                try:
                    gauge.remove(self.model)
                except KeyError:
                    pass  # never set
            self.model = self.iterations.model = model  # (its totals go on under the new name)

    def observe_stats(self, stats: EngineStats) -> None:
        m = self.model
        self.iterations.add_work(stats, self._last)
        self.running.labels(m).set(stats.running)
        self.waiting.labels(m).set(stats.waiting)
        total = stats.kv_blocks_used + stats.kv_blocks_free
        self.kv_usage.labels(m).set(stats.kv_blocks_used / total if total else 0.0)
        if total and total != self._blocks:  # (a model loaded since: another cache)
            self.cache_config.clear()
            self.cache_config.labels(str(self.block_size), str(total)).set(1)
            self._blocks = total
        # Counters only move forward; the engine reports running totals.
        for counter, now, before in (
            (self.prefix_queries, stats.prefix_cache_queries, self._last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, self._last.prefix_cache_hits),
            (self.preemptions, stats.preemptions, self._last.preemptions),
        ):
            if now > before:
                counter.labels(m).inc(now - before)
        self._last = stats

    def observe_tokens(self, count: int) -> None:
        self.generation_tokens.labels(self.model).inc(count)
        self.iterations.tokens += count

    def observe_prefilled(self, prompt_tokens: int) -> None:
        """A prompt of ``prompt_tokens`` was computed (its first token came), as vLLM counts."""
        self.prompt_tokens.labels(self.model).inc(prompt_tokens)

    def observe_first_token(self, ttft_s: float) -> None:
        self.ttft.labels(self.model).observe(ttft_s)

    def observe_token_gaps(self, batch: TokenBatch, last_s: float | None,
                           speedup: float = 1.0) -> float | None:
        """The inter-token latencies of ``batch``'s tokens, one a token after the attempt's
        first (vLLM observes one an engine step that gave the request a token), from the engine
        times of its tokens (``last_s``: its request's previous token's, None before its first)
        divided by ``speedup`` (wall seconds, as its TTFT). A batch of several steps' tokens (its
        engine read late) counts the mean gap for each. Returns the next batch's ``last_s``."""
        if batch.count == 0:
            return last_s
        start, gaps = (batch.first_token_s, batch.count - 1) if batch.first else (last_s,
                                                                                   batch.count)
        if start is not None and gaps > 0:
            gap = max(batch.time_s - start, 0.0) / speedup / gaps
            child = self.itl.labels(self.model)
            for _ in range(gaps):
                child.observe(gap)
        return batch.time_s

    def observe_finished(self, e2e_s: float, reason: str = "length") -> None:
        self.e2e.labels(self.model).observe(e2e_s)
        self.success.labels(self.model, reason).inc()


class _IterationTokens(Collector):
    """vLLM's histogram of tokens per engine step, from an engine's running totals: its count is
    the steps, its sum the prompt tokens (cache hits included, as vLLM counts them) and the
    tokens generated. The engine counts steps but does not report them one by one, so the only
    bucket is ``+Inf``."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.steps = 0
        self.tokens = 0

    def add_work(self, stats: EngineStats, before: EngineStats) -> None:
        """Add what the engine did since ``before``: nothing where it does not count it, or its
        counts restarted with a new engine, or ``before`` did not count it (the first counts are
        the baseline: a long-running vLLM server's first scrape is its whole history, before
        the tokens generated that the worker counts from its start)."""
        if None in (stats.steps, stats.prefilled_tokens, before.steps, before.prefilled_tokens):
            return
        steps = stats.steps - before.steps
        prompt = (stats.prefilled_tokens - before.prefilled_tokens
                  + stats.prefix_cache_hits - before.prefix_cache_hits)
        if steps >= 0 and prompt >= 0:
            self.steps += steps
            self.tokens += prompt

    def collect(self):
        family = HistogramMetricFamily(ITERATION_TOKENS, "Tokens per engine step.",
                                       labels=["model_name"])
        family.add_metric([self.model], buckets=[("+Inf", self.steps)], sum_value=self.tokens)
        yield family
