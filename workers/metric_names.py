"""The one mapping between vLLM's Prometheus metric names and Governor's signal names.

vLLM has renamed metrics between releases (``vllm:gpu_cache_usage_perc`` became
``vllm:kv_cache_usage_perc``; ``vllm:gpu_prefix_cache_*`` became ``vllm:prefix_cache_*``), and
deployments lag behind. The simulated worker exports the current names; the vLLM adapter reads
whichever of the names a server exposes. Nothing else in Governor spells a vLLM metric name.
"""

#: Governor signal -> vLLM metric names, current name first, older names after it.
VLLM_METRICS: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "request_success": ("vllm:request_success",),
    "ttft_seconds": ("vllm:time_to_first_token_seconds",),
    "e2e_seconds": ("vllm:e2e_request_latency_seconds",),
    "inter_token_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    # The histogram of tokens per engine step (``ITERATION_TOKENS``): its count is the steps, its
    # sum the prompt tokens of the prefills that finished (cache hits included) and the tokens
    # generated.
    "iteration_steps": ("vllm:iteration_tokens_total_count",),
    "iteration_tokens": ("vllm:iteration_tokens_total_sum",),
    # An info gauge (value 1) whose labels carry the cache's ``block_size`` and
    # ``num_gpu_blocks``: KV use in the engine's own blocks, not per mille.
    "cache_config": ("vllm:cache_config_info",),
    # Prompt tokens by where their KV came from (label ``source``: ``local_compute``,
    # ``local_cache_hit``, ``external_kv_transfer``), counted once per request as its prefill is
    # computed: vLLM since PR #33290 (February 2026). Unlike ``prefix_cache_*``, which count each
    # lookup, repeated at every step a request waits for KV blocks (vLLM issue #43736). One
    # label's samples are read as ``name{label="value"}`` (``BY_LABEL``); the name alone sums all.
    "prompt_tokens_by_source": ("vllm:prompt_tokens_by_source",),
    "computed_prompt_tokens": ('vllm:prompt_tokens_by_source{source="local_compute"}',),
    "cached_prompt_tokens": ('vllm:prompt_tokens_by_source{source="local_cache_hit"}',),
}
#: Families whose samples are also read one label value at a time: name -> the label.
BY_LABEL = {"vllm:prompt_tokens_by_source": "source"}
#: Signals that are fractions of one engine: a server running several (data parallel, one label
#: set each) gives their mean, not their sum.
FRACTIONS = ("kv_usage",)
ITERATION_TOKENS = "vllm:iteration_tokens_total"


def current_name(signal: str) -> str:
    return VLLM_METRICS[signal][0]
