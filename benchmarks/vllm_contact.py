"""First contact between the vLLM adapter and a server: what Governor assumes of vLLM's API, checked.

    python -m benchmarks.vllm_contact --url http://127.0.0.1:8000 [--model NAME] [--json OUT]

Drives ``workers.vllm_engine.VllmHttpEngine`` against a running server (a real ``vllm serve``,
or ``governor sim-server``) as a worker would, and prints one line a check, ``PASS``, ``WARN``
(works, but something Governor reads is missing) or ``FAIL``; it exits 1 if any check fails.
The checks: the model card and its ``max_model_len``; the ``/metrics`` names the adapter reads;
one stream to its end with exact token ids; the cached prompt tokens of a repeated prefix (vLLM
gives them only with ``--enable-prompt-tokens-details``); a prompt past the context refused as
the request's fault; an abort that the server's metrics see; and concurrent streams. A server
still loading its model is waited for up to ``--wait-s``; ``VLLM_API_KEY`` is its API key.
"""

import argparse
import asyncio
import json
import os
from dataclasses import asdict, dataclass

import aiohttp

from infra.hangup import exit_quietly_if_stdout_closes
from workers.engine import EngineRequest, TokenBatch
from workers.vllm_engine import KV_PER_MILLE_BLOCKS, VllmHttpEngine, parse_metrics, read_signals

#: Signals without which the adapter cannot place work (FAIL), and those it reads where given.
NEEDED = ("running", "waiting", "kv_usage")
WANTED = ("cache_config", "iteration_steps", "generation_tokens")


@dataclass
class Check:
    name: str
    status: str  # PASS, WARN or FAIL
    detail: str


async def _drive(engine: VllmHttpEngine, ids: set[str], deadline_s: float) -> list[TokenBatch]:
    """``advance`` as a worker calls it until every request of ``ids`` has finished."""
    loop, batches, done = asyncio.get_running_loop(), [], set()
    deadline = loop.time() + deadline_s
    while done != ids:
        if loop.time() > deadline:
            raise TimeoutError(f"{sorted(ids - done)} unfinished after {deadline_s:.0f} s")
        for batch in engine.advance(loop.time()):
            batches.append(batch)
            if batch.finished:
                done.add(batch.request_id)
        await asyncio.sleep(0.005)  # a worker's poll interval
    return batches


def _summary(batches: list[TokenBatch], rid: str) -> tuple[int, bool, TokenBatch]:
    """(tokens received, whether each came with its id, the finishing batch)."""
    mine = [b for b in batches if b.request_id == rid]
    return sum(b.count for b in mine), all(len(b.tokens) == b.count for b in mine), mine[-1]


async def _signals(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        resp.raise_for_status()
        text = await resp.text()
    return read_signals(parse_metrics(text))


async def run_checks(url: str, model: str | None = None, wait_s: float = 600.0,
                     deadline_s: float = 120.0, api_key: str | None = None) -> list[Check]:
    url = url.rstrip("/")
    checks: list[Check] = []
    engine = VllmHttpEngine(url, model, connect_timeout_s=wait_s, api_key=api_key)
    await engine.start()
    try:
        limit = engine.max_model_len
        checks.append(Check("model card", "PASS" if limit else "WARN",
                            f"{engine.model}, max_model_len {limit}"))
        now = asyncio.get_running_loop().time
        engine.add(EngineRequest("contact-one", prompt_tokens=64, max_tokens=16), now())
        count, with_ids, last = _summary(await _drive(engine, {"contact-one"}, deadline_s),
                                         "contact-one")
        ok = count == 16 and last.finish_reason == "length"
        checks.append(Check("stream", "FAIL" if not ok else "PASS" if with_ids else "WARN",
                            f"{count} of 16 tokens, finish {last.finish_reason!r}, "
                            f"ids {'with each' if with_ids else 'missing (counts only)'}"))

        signals = await _signals(url)  # (after a request: counters are there)
        missing = [s for s in NEEDED if s not in signals]
        unread = [s for s in WANTED if s not in signals]
        stats = engine.stats()
        blocks = stats.kv_blocks_used + stats.kv_blocks_free
        checks.append(Check(
            "metrics", "FAIL" if missing else "WARN" if unread else "PASS",
            f"missing {missing}; " * bool(missing) + f"not exported {unread}; " * bool(unread)
            + f"state {stats.state}, KV blocks {blocks}"
            + " (per mille: no cache config)" * (blocks == KV_PER_MILLE_BLOCKS)))

        shared = dict(prefix_hashes=(1, 2, 3, 4), hash_block_size=16)
        cached = []
        for rid in ("contact-prefix-a", "contact-prefix-b"):
            engine.add(EngineRequest(rid, prompt_tokens=80, max_tokens=4, **shared), now())
            cached.append(_summary(await _drive(engine, {rid}, deadline_s), rid)[2].cached_tokens)
        checks.append(Check("prefix cache", "PASS" if cached[1] > 0 else "WARN",
                            f"cached prompt tokens {cached} (0: no prompt_tokens_details; "
                            "vllm serve --enable-prompt-tokens-details gives them)"))

        if limit:
            engine.add(EngineRequest("contact-long", prompt_tokens=limit, max_tokens=16), now())
            last = _summary(await _drive(engine, {"contact-long"}, deadline_s), "contact-long")[2]
            kind = last.failure.kind if last.failure else None
            checks.append(Check("too long", "PASS" if kind == "invalid_request" else "FAIL",
                                f"finish {last.finish_reason!r}, {kind}: "
                                f"{last.failure.detail[:200] if last.failure else ''}"))

        long = min(2_000, (limit or 4_096) - 64)
        engine.add(EngineRequest("contact-abort", prompt_tokens=64, max_tokens=long), now())
        loop_deadline = asyncio.get_running_loop().time() + deadline_s
        while not any(b.count for b in engine.advance(now())):
            if now() > loop_deadline:
                raise TimeoutError("contact-abort: no first token")
            await asyncio.sleep(0.005)
        engine.abort("contact-abort")
        held = None
        for _ in range(100):  # up to 10 s for the server to let it go
            signals = await _signals(url)
            held = signals.get("running", 0) + signals.get("waiting", 0)
            if held == 0:
                break
            await asyncio.sleep(0.1)
        checks.append(Check("abort", "PASS" if held == 0 else "FAIL",
                            f"server holds {held} requests after the abort"))

        rids = {f"contact-many-{i}" for i in range(16)}
        for rid in sorted(rids):
            engine.add(EngineRequest(rid, prompt_tokens=128, max_tokens=32), now())
        batches = await _drive(engine, rids, deadline_s)
        counts = sorted({_summary(batches, rid)[0] for rid in rids})
        checks.append(Check("concurrent", "PASS" if counts == [32] else "FAIL",
                            f"16 streams, tokens each: {counts}"))
    finally:
        await engine.close()
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's root, e.g. http://h:8000")
    parser.add_argument("--model", help="the served model (default: the one it serves)")
    parser.add_argument("--wait-s", type=float, default=600.0,
                        help="how long to wait for a server still loading its model")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    checks = asyncio.run(run_checks(args.url, args.model, args.wait_s,
                                    api_key=os.environ.get("VLLM_API_KEY") or None))
    if args.json:  # first: a stdout whose reader has gone ends the check at the print
        with open(args.json, "w") as out:
            json.dump([asdict(c) for c in checks], out, indent=1)
    with exit_quietly_if_stdout_closes():
        for check in checks:
            print(f"{check.status} {check.name}: {check.detail}")
    raise SystemExit(1 if any(c.status == "FAIL" for c in checks) else 0)


if __name__ == "__main__":
    main()
