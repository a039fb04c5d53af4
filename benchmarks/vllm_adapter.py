"""The vLLM adapter's own work on the worker's event loop: placeholder prompt ids and a scrape.

    python -m benchmarks.vllm_adapter [--repeat 5]

Every request the adapter sends carries its prompt as placeholder token ids
(``workers.vllm_engine.prompt_token_ids``), built on the worker's event loop, where a slow build
holds up every other stream's tokens and the heartbeats. Each ``/metrics`` scrape is parsed there
too (``stats_from_text``), and each stream's server-sent events: with ``return_token_ids`` the
first echoes the prompt's token ids, megabytes for a long prompt, arriving in pieces. Prints the
best of ``--repeat`` runs of each, in milliseconds, for prompts of 8k to 1M tokens (with and
without prefix hashes), for the metrics page a sim-server serves, and for a stream whose first
event holds 1M token ids read in pieces of 16 and 64 KiB (``VllmHttpEngine._run``, its server
stood in for).
"""

import argparse
import asyncio
import json
import time

from prometheus_client import generate_latest

from benchmarks import positive_int
from workers.engine import EngineRequest, EngineStats
from workers.metrics import EngineMetrics
from workers.vllm_engine import VllmHttpEngine, _Stream, prompt_token_ids, stats_from_text

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


class _Served:
    """A stand-in for a vLLM server's answer: its bytes, in pieces (a session and a response)."""

    status = 200

    def __init__(self, pieces: list[bytes]) -> None:
        self.content, self._pieces = self, pieces

    def post(self, url, **kwargs):
        return self

    async def iter_any(self):
        for piece in self._pieces:
            yield piece

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


def long_first_event(prompt_ids: int) -> bytes:
    """A completion stream whose first event echoes ``prompt_ids`` token ids."""
    chunks = [{"object": "text_completion", "choices": [{"index": 0, "text": "",
               "finish_reason": None, "prompt_token_ids": list(range(prompt_ids))}]},
              {"object": "text_completion", "choices": [{"index": 0, "text": " t",
               "token_ids": [7], "finish_reason": "length"}]}]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def read_stream(pieces: list[bytes]) -> _Stream:
    """The stream the adapter reads from a server that sends ``pieces``."""
    async def scenario():
        engine = VllmHttpEngine("http://vllm", "m", sim_extensions=False)
        engine._session = _Served(pieces)
        stream = _Stream(EngineRequest("r", prompt_tokens=1, max_tokens=1), 0)
        await engine._run(stream)
        return stream
    return asyncio.run(scenario())


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
    data = long_first_event(1_000_000)
    for kib in (16, 64):
        size = kib * 1024
        pieces = [data[at:at + size] for at in range(0, len(data), size)]
        assert read_stream(pieces).finish_reason == "length"
        ms = best_ms(lambda: read_stream(pieces), args.repeat)
        print(f"stream: a first event of 1,000,000 token ids ({len(data) / 1e6:.1f} MB) in "
              f"{len(pieces):,} pieces of {kib} KiB read in {ms:7.1f} ms")


if __name__ == "__main__":
    main()
