"""The built-in workload used when no trace file is given: Azure-conversation-like requests.

It follows the published statistics of the Azure LLM inference trace 2023, conversation service:

* Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.
* Azure/AzurePublicDataset, ``data/AzureLLMInferenceTrace_conv.csv`` (CC-BY-4.0); one hour of
  2023-11-16, 19,366 requests. Figures as measured in ``shared/data/README.md``: 5.5 req/s,
  inter-arrival coefficient of variation (CV) 1.09, prompt tokens mean/p50/p99 1155/1020/4142,
  output tokens mean/p50/p99 211/129/601.

Model:

* Arrivals are a renewal process with gamma inter-arrival times of shape ``k = 1 / CV**2``
  (0.842 for CV 1.09: a little burstier than Poisson) and mean ``1 / rate_rps``.
* Prompt and output lengths are independent lognormals fitted to the *median and p99*:
  ``mu = ln(p50)``, ``sigma = ln(p99 / p50) / 2.3263`` (2.3263 is the standard normal's 99th
  percentile), then rounded and clipped to [1, 32768] (prompts) and [1, 4096] (outputs).
  Prompts: sigma 0.602, mean 1223 (published 1155, +6%). Outputs: sigma 0.661, mean 161
  (published 211, -24%). Matching the median and the tail was chosen over matching the mean
  because queueing and KV-cache pressure are driven by the tail; the real output distribution
  has a heavier body than a lognormal with that median and p99 can give. Lengths are independent
  of each other and of arrivals, and the requests carry no prefix-hash data.

The result is deterministic per ``seed``, and the workload for a shorter duration is a prefix of
the one for a longer duration with the same seed and rate (arrivals, prompts and outputs come from
three independent streams spawned from ``np.random.default_rng(seed)``, drawn in fixed chunks).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from infra.traces.model import TraceError, TraceRequest

logger = logging.getLogger(__name__)

AZURE_CONV_RATE_RPS = 5.5
AZURE_CONV_INTERARRIVAL_CV = 1.09
AZURE_CONV_PROMPT_P50, AZURE_CONV_PROMPT_P99 = 1020, 4142
AZURE_CONV_OUTPUT_P50, AZURE_CONV_OUTPUT_P99 = 129, 601
MAX_PROMPT_TOKENS, MAX_OUTPUT_TOKENS = 32_768, 4_096
_Z99 = 2.3263  # the 99th percentile of the standard normal distribution
_CHUNK = 4096  # inter-arrival gaps drawn per batch (fixed, so shorter runs are prefixes)


def lognormal_from_quantiles(p50: float, p99: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal whose median is ``p50`` and 99th percentile ``p99``."""
    if not 0 < p50 <= p99:
        raise TraceError(f"need 0 < p50 <= p99, got p50={p50!r}, p99={p99!r}")
    return math.log(p50), math.log(p99 / p50) / _Z99


def _lengths(rng: np.random.Generator, n: int, p50: float, p99: float, high: int) -> list[int]:
    mu, sigma = lognormal_from_quantiles(p50, p99)
    values = np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), 1, high)
    return [int(v) for v in values]


def azure_like_workload(*, duration_s: float, rate_rps: float = AZURE_CONV_RATE_RPS,
                        seed: int = 0) -> list[TraceRequest]:
    """Requests arriving in ``[0, duration_s)`` with Azure-conversation-like statistics.

    Args:
        duration_s: Length of the workload in seconds (0 gives an empty list).
        rate_rps: Mean arrival rate, requests per second (the inter-arrival CV stays 1.09).
        seed: Seed of the random streams; equal seeds give equal workloads.

    Returns:
        Requests sorted by ``arrival_s``, tenant ``"default"``, model ``"llama-3-8b"``.

    Raises:
        TraceError: ``duration_s`` is negative or not finite, or ``rate_rps`` is not positive.
    """
    if not (math.isfinite(duration_s) and duration_s >= 0):
        raise TraceError(f"duration_s must be a finite number >= 0, got {duration_s!r}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise TraceError(f"rate_rps must be a finite number > 0, got {rate_rps!r}")
    arrival_rng, prompt_rng, output_rng = np.random.default_rng(seed).spawn(3)
    shape = 1.0 / AZURE_CONV_INTERARRIVAL_CV**2
    scale = 1.0 / (rate_rps * shape)  # gamma mean = shape * scale = 1 / rate_rps
    arrivals: list[float] = []
    clock = 0.0
    while clock < duration_s:
        for gap in arrival_rng.gamma(shape, scale, size=_CHUNK):
            clock += float(gap)
            if clock >= duration_s:
                break
            arrivals.append(clock)
    n = len(arrivals)
    prompts = _lengths(prompt_rng, n, AZURE_CONV_PROMPT_P50, AZURE_CONV_PROMPT_P99, MAX_PROMPT_TOKENS)
    outputs = _lengths(output_rng, n, AZURE_CONV_OUTPUT_P50, AZURE_CONV_OUTPUT_P99, MAX_OUTPUT_TOKENS)
    logger.debug("azure-like workload: %d requests over %.1f s (rate %.2f rps, seed %d)",
                 n, duration_s, rate_rps, seed)
    return [TraceRequest(arrival_s=a, prompt_tokens=p, output_tokens=o)
            for a, p, o in zip(arrivals, prompts, outputs)]
