"""The vLLM adapter's own work on the worker's event loop: placeholder prompt ids and a scrape.

    python -m benchmarks.vllm_adapter [--repeat 5]

Every request the adapter sends carries its prompt as placeholder token ids
(``workers.vllm_engine.prompt_token_ids``), built on the worker's event loop, where a slow build
holds up every other stream's tokens and the heartbeats. Each ``/metrics`` scrape is parsed there
too (``stats_from_text``). Prints the best of ``--repeat`` runs of each, in milliseconds, for
prompts of 8k to 1M tokens (with and without prefix hashes) and for the metrics page a
sim-server serves.
"""

import argparse
import time

from prometheus_client import generate_latest

from benchmarks import positive_int
from workers.engine import EngineRequest, EngineStats
from workers.metrics import EngineMetrics
from workers.vllm_engine import prompt_token_ids, stats_from_text

PROMPTS = (  # (prompt tokens, prefix blocks, tokens per block)
    (8_192, 0, 16), (131_072, 0, 16), (131_072, 256, 512), (1_000_000, 0, 16),
    (1_000_000, 62_500, 16),
)


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=positive_int, default=5)
    args = parser.parse_args()
    for tokens, blocks, unit in PROMPTS:
        request = EngineRequest("r", prompt_tokens=tokens, max_tokens=1,
                                prefix_hashes=tuple(range(blocks)), hash_block_size=unit)
        ms = best_ms(lambda: prompt_token_ids(request), args.repeat)
        print(f"placeholder ids: {tokens:>9,} tokens, {blocks:>6,} prefix blocks of {unit:>3}: "
              f"{ms:7.1f} ms")
    metrics = EngineMetrics("llama-3-8b")
    metrics.observe_stats(EngineStats(running=64, waiting=3, kv_blocks_used=20_000,
                                      kv_blocks_free=10_000))
    page = generate_latest(metrics.registry).decode()
    ms = best_ms(lambda: stats_from_text(page), args.repeat)
    print(f"scrape: a {len(page):,}-byte metrics page parsed in {ms:.2f} ms")


if __name__ == "__main__":
    main()
