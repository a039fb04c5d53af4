"""``governor sim-server`` over real HTTP on 127.0.0.1, and the vLLM adapter driven against it.

No Kafka: one sim-server subprocess per module (``python -m infra.cli sim-server``; another for
a test that kills it), plus one in-process server where a test needs to look inside the engine.
"""

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest
from sim_server_support import MODEL, SPEEDUP, sim_server

from workers.engine import EngineRequest, reference_token
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim_server import SimServer, token_text
from workers.vllm_engine import VllmHttpEngine, parse_metrics, stats_from_text

pytestmark = pytest.mark.integration  # (no Kafka, but a server process and real sockets)


@pytest.fixture(scope="module")
def server_url():
    with sim_server() as (url, _proc):
        yield url


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def _post(url: str, path: str, body: dict, rid: str | None = None) -> tuple[int, dict]:
    headers = {"X-Request-Id": rid} if rid else {}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}{path}", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


async def _stream(url: str, path: str, body: dict, rid: str) -> list[tuple[float, object]]:
    """(arrival time, parsed event) per server-sent event; ``[DONE]`` comes back as a string."""
    events, buffer = [], b""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}{path}", json=body | {"stream": True},
                                headers={"X-Request-Id": rid}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            async for data in resp.content.iter_any():
                buffer += data
                *done, buffer = buffer.split(b"\n\n")
                for event in done:
                    payload = event.decode().removeprefix("data: ")
                    events.append((time.monotonic(),
                                   payload if payload == "[DONE]" else json.loads(payload)))
    return events


# -- the HTTP API ---------------------------------------------------------------------------------
def test_completion_returns_max_tokens_reference_tokens(server_url):
    status, body = run(_post(server_url, "/v1/completions", {
        "model": MODEL, "prompt": "Hello there, simulated GPU", "max_tokens": 12,
        "return_token_ids": True}, rid="req-plain"))
    assert status == 200
    assert body["id"] == "cmpl-req-plain" and body["object"] == "text_completion"
    assert body["model"] == MODEL
    (choice,) = body["choices"]
    expected = [reference_token("req-plain", i) for i in range(12)]
    assert choice["token_ids"] == expected
    assert choice["text"] == "".join(token_text(t) for t in expected)
    assert choice["finish_reason"] == "length"
    # 26 characters at 4 characters a token
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_max_tokens_defaults_to_16_and_ids_only_on_request(server_url):
    status, body = run(_post(server_url, "/v1/completions", {"prompt": "x"}, rid="req-default"))
    assert status == 200 and body["usage"]["completion_tokens"] == 16
    assert "token_ids" not in body["choices"][0]


#: The answer streamed by ``test_streamed_chunks_arrive_incrementally_and_end_with_done``.
ANSWER = 512


def test_streamed_chunks_arrive_incrementally_and_end_with_done(server_url):
    # (512 tokens: a stream of about 0.2 s at the server's speedup, not one a client stalled for
    # a few tens of milliseconds on a loaded machine reads in one go)
    events = run(_stream(server_url, "/v1/completions", {
        "model": MODEL, "prompt": list(range(100, 400)), "max_tokens": ANSWER,
        "return_token_ids": True, "stream_options": {"include_usage": True}}, rid="req-stream"))
    assert events[-1][1] == "[DONE]"
    chunks = [e for _, e in events[:-1]]
    usage_chunk = chunks.pop()
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == ANSWER
    assert usage_chunk["usage"]["prompt_tokens"] == 300
    times = [t for t, _ in events]
    assert len(chunks) > 2 and times[0] < times[-2] and times == sorted(times)
    assert all(c["object"] == "text_completion" and c["id"] == "cmpl-req-stream" for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert ids == [reference_token("req-stream", i) for i in range(ANSWER)]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "".join(map(token_text, ids))
    assert chunks[0]["choices"][0]["prompt_token_ids"] == list(range(100, 400))
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])


def test_the_cached_prompt_tokens_come_on_the_final_usage_chunk_only(server_url):
    """As vLLM (``completion_stream_generator``): ``continuous_usage_stats`` puts prompt,
    completion and total tokens on every chunk, and ``prompt_tokens_details`` on none but the
    usage chunk after the last token's (the sim-server put it on every chunk, where a client
    reading it from the chunk with the finish reason passed here and missed it on vLLM)."""
    events = run(_stream(server_url, "/v1/completions", {
        "model": MODEL, "prompt": list(range(400, 500)), "max_tokens": 3,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        rid="req-usage-details"))
    *chunks, usage_chunk = [e for _, e in events[:-1]]
    assert all(c["usage"]["completion_tokens"] >= 1 for c in chunks)
    assert not any("prompt_tokens_details" in c["usage"] for c in chunks)
    assert usage_chunk["choices"] == [] and "prompt_tokens_details" in usage_chunk["usage"]


def test_chat_completions_stream_and_return_whole(server_url):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    events = run(_stream(server_url, "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "max_tokens": 20, "return_token_ids": True},
        rid="req-chat"))
    assert events[-1][1] == "[DONE]"
    chunks = [e for _, e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-req-chat"
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert ids == [reference_token("req-chat", i) for i in range(20)]
    assert content == "".join(map(token_text, ids))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    status, body = run(_post(server_url, "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "max_completion_tokens": 5}, rid="req-chat-whole"))
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"] == "".join(
        token_text(reference_token("req-chat-whole", i)) for i in range(5))


def test_usage_says_how_many_prompt_tokens_the_prefix_cache_held(server_url):
    """As vLLM with --enable-prompt-tokens-details: the second of two equal prompts finds all
    but the block it must recompute to sample from (16-token blocks)."""
    prompt = list(range(50_000, 50_100))  # 100 tokens: six full blocks (no other test's)
    cached = []
    for rid in ("req-cache-1", "req-cache-2"):
        status, body = run(_post(server_url, "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 2}, rid=rid))
        assert status == 200
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 96]


def test_token_id_prompt_is_accepted_and_counted_exactly(server_url):
    status, body = run(_post(server_url, "/v1/completions", {
        "model": MODEL, "prompt": [1, 2, 3, 4, 5], "max_tokens": 3, "return_token_ids": True},
        rid="req-ids"))
    assert status == 200
    assert body["usage"]["prompt_tokens"] == 5
    assert body["choices"][0]["prompt_token_ids"] == [1, 2, 3, 4, 5]


def test_continuation_from_offset_k_yields_tokens_k_onwards(server_url):
    k = 5
    sent = [reference_token("req-cont", i) for i in range(k)]
    status, body = run(_post(server_url, "/v1/completions", {
        "model": MODEL, "prompt": [7] * 50 + sent, "max_tokens": 7, "governor_token_offset": k,
        "return_token_ids": True}, rid="req-cont"))
    assert status == 200
    assert body["choices"][0]["token_ids"] == [reference_token("req-cont", i) for i in range(k, 12)]
    assert body["usage"]["completion_tokens"] == 7


def test_wrong_model_is_a_404_in_vllm_error_shape(server_url):
    """vLLM's ``ErrorResponse`` holds an ``ErrorInfo`` under ``error`` (its current shape, as
    OpenAI's; older vLLM, 0.8's ``serving_engine.py``, gave the fields at the top level, with
    ``"object": "error"``: the adapter reads both)."""
    status, body = run(_post(server_url, "/v1/completions", {"model": "gpt-9", "prompt": "hi"}))
    assert status == 404
    assert body == {"error": {"message": "The model `gpt-9` does not exist.",
                              "type": "NotFoundError", "param": "model", "code": 404}}


@pytest.mark.parametrize("body, field", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": [1, 2, 3], "governor_token_offset": 4}, "governor_token_offset"),
])
def test_invalid_fields_are_a_400_naming_the_field(server_url, body, field):
    status, body = run(_post(server_url, "/v1/completions", {"model": MODEL} | body))
    assert status == 400
    reply = body["error"]
    assert reply["type"] == "BadRequestError" and reply["code"] == 400
    assert reply["param"] == field and field in reply["message"]


def test_models_health_and_version(server_url):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server_url}/v1/models") as resp:
                models = await resp.json()
            async with session.get(f"{server_url}/version") as resp:
                version = await resp.json()
        return models, version

    models, version = run(scenario())
    assert [m["id"] for m in models["data"]] == [MODEL] and models["object"] == "list"
    assert version["governor_sim"] is True and version["speedup"] == SPEEDUP


def test_metrics_use_vllm_names_and_counters_increase(server_url):
    async def scrape() -> tuple[str, dict[str, float]]:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server_url}/metrics") as resp:
                text = await resp.text()
        return text, parse_metrics(text)

    text, before = run(scrape())
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total"):
        assert name in text
    shared = list(range(1000, 1064))  # four full 16-token blocks, sent twice: the second hits
    for i in range(2):
        status, _ = run(_post(server_url, "/v1/completions", {
            "prompt": shared + [i], "max_tokens": 4}, rid=f"req-metrics-{i}"))
        assert status == 200
    after_text, after = run(scrape())
    # (a histogram's series come with its model's first request: none before one, run alone)
    assert "vllm:time_to_first_token_seconds_bucket" in after_text
    for counter in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                    "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                    "vllm:time_to_first_token_seconds_count"):
        assert after[counter] > before.get(counter, 0.0), counter
    assert after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0) >= 64
    # One inter-token latency a token after a request's first, as vLLM observes (none before
    # 6 Dec: vLLM's dashboards found no ``vllm:inter_token_latency_seconds``)
    itl = "vllm:inter_token_latency_seconds_count"
    assert after[itl] - before.get(itl, 0.0) == 2 * 3
    # Tokens per step: the adapter reads the steps and the prompt tokens computed from it. The
    # first prompt is computed whole (65 tokens), the second but its last token (64 hit).
    first, then = stats_from_text(text), stats_from_text(after_text)
    assert then.steps > first.steps
    assert then.prefilled_tokens - first.prefilled_tokens == 65 + 1


# -- the vLLM adapter against the sim-server ------------------------------------------------------
@contextlib.asynccontextmanager
async def _adapter(url: str, *args, **options):
    """A started ``VllmHttpEngine``, closed after."""
    engine = VllmHttpEngine(url, *args, **options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def _drive(engine: VllmHttpEngine, until, deadline_s: float = 20.0) -> list:
    """Call ``advance`` as a worker would until ``until(batches)``; every batch returned."""
    loop, batches = asyncio.get_running_loop(), []
    deadline = loop.time() + deadline_s
    while not until(batches):
        assert loop.time() < deadline, "timed out driving the engine"
        batches += engine.advance(loop.time())
        await asyncio.sleep(0.002)
    return batches


def _check_stream(batches, rid: str, start: int, end: int) -> None:
    mine = [b for b in batches if b.request_id == rid]
    assert [b.first for b in mine].count(True) == 1 and mine[0].first
    offset = start
    for b in mine:
        assert b.token_offset == offset  # contiguous
        assert list(b.tokens) == [reference_token(rid, i) for i in range(offset, offset + b.count)]
        offset += b.count
    assert offset == end
    assert mine[-1].finished and mine[-1].finish_reason == "length"
    assert not any(b.finished for b in mine[:-1])


def test_adapter_streams_two_requests_to_completion_with_reference_tokens(server_url):
    async def scenario():
        async with _adapter(server_url) as engine:
            assert engine.model == MODEL and engine.sim_extensions
            now = asyncio.get_running_loop().time()
            engine.add(EngineRequest("ad-1", prompt_tokens=200, max_tokens=40), now)
            engine.add(EngineRequest("ad-2", prompt_tokens=50, max_tokens=25, prefix_hashes=(11, 12),
                                     hash_block_size=16), now)
            assert engine.next_event_s() is not None
            batches = await _drive(engine, lambda bs: sum(b.finished for b in bs) == 2)
            assert engine.next_event_s() is None
        _check_stream(batches, "ad-1", 0, 40)
        _check_stream(batches, "ad-2", 0, 25)

    run(scenario())


def test_adapter_reads_the_prompt_tokens_the_servers_cache_held(server_url):
    """From the usage's ``prompt_tokens_details`` onto the finishing batch (a Completed's
    ``cached_tokens``): none the first time, most of the prompt the second."""
    async def scenario():
        async with _adapter(server_url) as engine:
            cached = []
            for rid in ("ad-cache-1", "ad-cache-2"):
                engine.add(EngineRequest(rid, prompt_tokens=256, max_tokens=3,
                                         prefix_hashes=(71, 72, 73, 74), hash_block_size=64),
                           asyncio.get_running_loop().time())
                batches = await _drive(engine, lambda bs: any(b.finished for b in bs))
                (last,) = [b for b in batches if b.finished]
                cached.append(last.cached_tokens)
        return cached

    first, second = run(scenario())
    assert first == 0 and 200 <= second < 256

def test_adapter_continuation_from_offset_k(server_url):
    async def scenario():
        async with _adapter(server_url) as engine:
            engine.add(EngineRequest("ad-cont", prompt_tokens=100, max_tokens=30, resume_from_token=12),
                       asyncio.get_running_loop().time())
            batches = await _drive(engine, lambda bs: any(b.finished for b in bs))
        _check_stream(batches, "ad-cont", 12, 30)

    run(scenario())


def test_adapter_stats_show_running_requests_and_abort_stops_them(server_url):
    async def scenario():
        async with _adapter(server_url, scrape_interval_s=0.05) as engine:
            loop = asyncio.get_running_loop()
            for rid in ("ad-long-1", "ad-long-2"):
                engine.add(EngineRequest(rid, prompt_tokens=100, max_tokens=20_000), loop.time())
            assert engine.stats().running + engine.stats().waiting >= 2  # before any scrape
            await _drive(engine, lambda bs: engine.stats().running >= 2)
            got = await _drive(engine, lambda bs: sum(b.count for b in bs if b.request_id == "ad-long-1") > 5)
            assert engine.abort("ad-long-1") and not engine.abort("ad-long-1")
            assert not engine.abort("never-added")
            await _drive(engine, lambda bs: engine.stats().running == 1)
            later = engine.advance(loop.time())
            assert all(b.request_id != "ad-long-1" for b in later)
            assert not any(b.finished for b in got + later)
            assert engine.abort("ad-long-2")
            await _drive(engine, lambda bs: engine.stats().running == 0)

    run(scenario())


def test_models_card_says_the_model_context_and_a_request_past_it_is_a_400(server_url):
    """As vLLM: ``max_model_len`` on the card is the model's context (llama-3-8b: Llama 3.1's
    131,072 tokens); a prompt and output past it are refused, a request of exactly it served."""
    async def card() -> dict:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server_url}/v1/models") as resp:
                return (await resp.json())["data"][0]

    assert run(card())["max_model_len"] == 131_072
    status, body = run(_post(server_url, "/v1/completions", {
        "model": MODEL, "prompt": [7] * 131_070, "max_tokens": 3}, rid="past-context"))
    reply = body["error"]
    assert (status, reply["param"]) == (400, "prompt")
    assert reply["message"] == ("past-context: this model's maximum context length is 131072 "
                                "tokens; the request has 131070 prompt and 3 output tokens (131073)")


def test_a_body_past_aiohttp_default_1_mib_is_read(server_url):
    """A request body over 1 MiB (long ids, or a long chat) is read, not refused with a 413 past
    aiohttp's default. The model's context keeps ids under 1 MiB, so the body is padded with
    JSON whitespace."""
    body = json.dumps({"model": MODEL, "prompt": [7] * 100, "max_tokens": 2})
    padded = body[:-1] + " " * (3 << 19) + "}"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server_url}/v1/completions", data=padded,
                                    headers={"Content-Type": "application/json"}) as resp:
                return resp.status, await resp.json()

    status, reply = run(scenario())
    assert len(padded) > 1 << 20
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


def test_adapter_fails_a_request_the_server_refuses_with_the_servers_reason(server_url):
    """A prompt just past the model's context: the server answers 400 saying so, and the
    request fails as an invalid one with that message (not as the engine's error, which its
    worker's breaker would count)."""
    async def scenario():
        async with _adapter(server_url) as engine:
            context = engine.stats().max_model_len  # what the worker's heartbeat says
            engine.add(EngineRequest("ad-huge", prompt_tokens=131_063, max_tokens=10),
                       asyncio.get_running_loop().time())
            return context, await _drive(engine, lambda bs: any(b.finished for b in bs))

    context, (batch,) = run(scenario())
    assert context == 131_072  # the model card's
    assert (batch.finished, batch.finish_reason, batch.count, batch.first) == (
        True, "error", 0, False)
    assert batch.failure.kind == "invalid_request"
    assert batch.failure.detail == (
        "HTTP 400 from the engine's server: ad-huge: this model's maximum context length is "
        "131072 tokens; the request has 131063 prompt and 10 output tokens (131073)")


def test_a_request_id_the_server_still_holds_is_handed_back_as_vllm_s_is(server_url):
    """An attempt sent again to the server that still holds its first (handed back, and its
    abort not yet through): vLLM, before it suffixed the ids clients give, refuses it as
    ``Request id ... already running``, which the adapter hands back. The sim-server said
    ``already in flight``: a 400 the adapter took for the request's refusal, and failed it."""
    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server_url}/v1/completions", json={
                    "prompt": "go", "max_tokens": 100_000, "stream": True},
                    headers={"X-Request-Id": "twice"}) as first:
                assert first.status == 200
                await first.content.readuntil(b"\n\n")  # (its first chunk: the server holds it)
                async with _adapter(server_url) as engine:
                    engine.add(EngineRequest("twice", prompt_tokens=8, max_tokens=4),
                               asyncio.get_running_loop().time())
                    return await _drive(engine, lambda bs: any(b.finished for b in bs))

    (batch,) = run(scenario())
    assert batch.finish_reason == "error" and batch.failure.kind == "retryable"
    assert "Request id twice already running" in batch.failure.detail


def test_adapter_hands_back_the_requests_of_a_server_that_dies_and_says_it_crashed():
    """A server SIGKILLed mid-stream: its streams, and a request sent after, end as the
    server's trouble (retryable: the worker hands them back), not as failures of the requests;
    and the engine says "crashed" from requests that cannot reach the server, not only after
    three scrapes (none is due here within the minute)."""
    async def scenario(url, proc):
        async with _adapter(url, scrape_interval_s=60) as engine:
            loop = asyncio.get_running_loop()
            engine.add(EngineRequest("dies-1", prompt_tokens=100, max_tokens=20_000), loop.time())
            got = await _drive(engine, lambda bs: sum(b.count for b in bs) >= 20)
            proc.kill()
            proc.wait()
            got += await _drive(engine, lambda bs: any(b.finished for b in bs))
            engine.add(EngineRequest("dies-2", prompt_tokens=100, max_tokens=10), loop.time())
            late = await _drive(engine, lambda bs: any(b.finished for b in bs))
            await _drive(engine, lambda bs: engine.stats().state == "crashed", 10.0)
        return got[-1], late[-1]

    with sim_server() as (url, proc):
        cut, refused = run(scenario(url, proc))
    for batch in (cut, refused):
        assert batch.finished and batch.finish_reason == "error"
        assert batch.failure is not None and batch.failure.kind == "retryable", batch.failure
    assert "the engine's server" in refused.failure.detail


def test_adapter_refuses_a_model_the_server_does_not_serve(server_url):
    from schemas.errors import TerminalError

    async def scenario():
        engine = VllmHttpEngine(server_url, "not-served")
        try:
            with pytest.raises(TerminalError, match="does not serve"):
                await engine.start()
        finally:
            await engine.close()

    run(scenario())


# -- in-process: a client that goes away --------------------------------------------------------
class _LinearPerf:
    max_model_len = None
    tp = 1  # (the GPUs it runs on)

    def step_s(self, prefill_tokens, prefill_context, decode_seqs, decode_context, prefill_seqs=1):
        return 0.01 + 0.0001 * prefill_tokens + 0.0001 * decode_seqs

    def decode_step_s(self, batch, context):
        return self.step_s(0, 0, batch, context)

    def kv_capacity_blocks(self, block_size=16, gpu_memory_utilization=0.9):
        return 1000

    def load_s(self):
        return 1.0


def test_client_disconnect_aborts_the_request_in_the_engine():
    async def scenario():
        engine = SimEngine(_LinearPerf(), SimEngineConfig())
        server = SimServer(engine, MODEL, speedup=SPEEDUP)
        port = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"prompt": "go", "max_tokens": 10_000, "stream": True},
                                        headers={"X-Request-Id": "gone"}) as resp:
                    assert resp.status == 200
                    await resp.content.readuntil(b"\n\n")  # the first chunk: it runs
                    assert engine.stats().running == 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while engine.stats().running or engine.stats().waiting:
                assert loop.time() < deadline, "the engine still holds the request"
                await asyncio.sleep(0.01)
            assert engine.abort("gone") is False  # already gone
        finally:
            await server.close()

    run(scenario())


def test_adapter_reports_its_own_prefill_backlog_and_decoding_streams(server_url):
    """vLLM exports no prefill backlog: the adapter reports the prompts of its requests that
    have no first token yet (0 would read as "nothing queued"), and counts as decoding only
    its requests that have one (the scraped running count holds prefills too)."""
    async def scenario():
        async with _adapter(server_url, scrape_interval_s=0.05) as engine:
            loop = asyncio.get_running_loop()
            engine.add(EngineRequest("bk-long", prompt_tokens=60_000, max_tokens=4), loop.time())
            engine.add(EngineRequest("bk-more", prompt_tokens=60_000, max_tokens=4,
                                     resume_from_token=2), loop.time())
            assert engine.stats().prefill_backlog_tokens == 120_002
            assert engine.decoding() == 0
            batches = await _drive(engine, lambda bs: any(b.first for b in bs))
            assert engine.stats().prefill_backlog_tokens < 120_002
            # (one may have finished already, in the batches of its first token)
            await _drive(engine, lambda bs: sum(b.finished for b in batches + bs) == 2)
            assert engine.stats().prefill_backlog_tokens == 0 and engine.decoding() == 0
            assert batches

    run(scenario())


def test_adapter_abort_of_a_stream_already_finished_says_so_and_hands_out_its_end(server_url):
    async def scenario():
        async with _adapter(server_url) as engine:
            loop = asyncio.get_running_loop()
            engine.add(EngineRequest("ab-done", prompt_tokens=20, max_tokens=3), loop.time())
            while not engine._streams["ab-done"].done:  # finished, not yet handed out
                await asyncio.sleep(0.01)
            assert not engine.abort("ab-done")
            batches = engine.advance(loop.time())
            assert [b.finished for b in batches if b.request_id == "ab-done"] == [True]

    run(scenario())


def test_adapter_continues_a_prompt_of_no_tokens_of_its_own(server_url):
    async def scenario():
        async with _adapter(server_url) as engine:
            engine.add(EngineRequest("zero-cont", prompt_tokens=0, max_tokens=8,
                                     resume_from_token=3), asyncio.get_running_loop().time())
            batches = await _drive(engine, lambda bs: any(b.finished for b in bs))
        _check_stream(batches, "zero-cont", 3, 8)

    run(scenario())


def test_the_sim_server_exports_its_cache_config_and_the_adapter_reads_real_blocks(server_url):
    async def scrape() -> str:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server_url}/metrics") as resp:
                return await resp.text()

    text = run(scrape())
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="' in text
    stats = stats_from_text(text)
    assert stats.kv_blocks_used + stats.kv_blocks_free > 1_000  # an H100's cache, not per mille


def test_adapter_ends_a_stream_the_server_dropped_without_closing_it():
    """A server that sends one chunk, then nothing, while its /metrics say it holds no request:
    the stream ends as an error once silent long enough (it held the worker's commits)."""
    from aiohttp import web

    metrics = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n'
               '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n')

    async def models(request):
        return web.json_response({"data": [{"id": MODEL}]})

    released = asyncio.Event()

    async def completions(request):
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = {"choices": [{"text": "x", "token_ids": [7], "finish_reason": None}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await released.wait()  # and then nothing, the connection left open
        return response

    async def scrape(request):
        return web.Response(text=metrics)

    async def scenario():
        app = web.Application()
        app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions),
                        web.get("/metrics", scrape)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            async with _adapter(f"http://127.0.0.1:{port}", scrape_interval_s=0.05,
                                stalled_after_s=0.5, sim_extensions=False) as engine:
                engine.add(EngineRequest("stalled", prompt_tokens=10, max_tokens=20),
                           asyncio.get_running_loop().time())
                batches = await _drive(engine, lambda bs: any(b.finished for b in bs), 10.0)
        finally:
            released.set()
            await runner.cleanup()
        return [(b.count, b.finished, b.finish_reason) for b in batches]

    got = run(scenario())
    assert got[0][:2] == (1, False) and got[-1][1:] == (True, "error")
    assert sum(count for count, _, _ in got) == 1


def test_adapter_scrapes_on_past_a_reply_it_cannot_read():
    """A scrape whose reply raises what no parser expects (+Inf requests running: an
    OverflowError) is logged, and the next one is read (the scrape loop ended unseen, and the
    worker's heartbeats kept the last load it read, for good)."""
    from aiohttp import web

    def metrics(running: str) -> str:
        return (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n'
                '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n')

    replies = iter([metrics("0.0"), metrics("+Inf")])  # at start, then once; then 3 running

    async def models(request):
        return web.json_response({"data": [{"id": MODEL}]})

    async def scrape(request):
        return web.Response(text=next(replies, metrics("3.0")))

    async def scenario():
        app = web.Application()
        app.add_routes([web.get("/v1/models", models), web.get("/metrics", scrape)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            async with _adapter(f"http://127.0.0.1:{port}", scrape_interval_s=0.02,
                                sim_extensions=False) as engine:
                await _drive(engine, lambda bs: engine.stats().running == 3, 10.0)
                return engine._scrape_task.done()
        finally:
            await runner.cleanup()

    assert run(scenario()) is False


def test_adapter_waits_for_a_server_that_binds_its_port_and_serves_once_its_model_is_loaded(
        caplog):
    """``vllm serve`` binds its port first and listens only once its engine is up (refusing
    connections meanwhile), and gives the engine up to ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s by
    default) to start: the adapter waits as long, and says it waits (it gave up after 30 s, and
    a worker started with its server was refused for good, ``no vLLM server answers``)."""
    import socket

    from workers.vllm_engine import SERVER_START_TIMEOUT_S

    assert VllmHttpEngine("http://h:8000").connect_timeout_s >= 600 == SERVER_START_TIMEOUT_S

    async def scenario():
        loading = socket.socket()  # as vLLM's create_server_socket: bound, not listening
        loading.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        loading.bind(("127.0.0.1", 0))
        port = loading.getsockname()[1]

        async def load_then_serve():
            await asyncio.sleep(1.0)
            loading.close()
            server = SimServer(SimEngine(_LinearPerf(), SimEngineConfig()), MODEL, speedup=SPEEDUP)
            await server.start(port=port)
            return server

        serving = asyncio.create_task(load_then_serve())
        engine = VllmHttpEngine(f"http://127.0.0.1:{port}")
        try:
            await engine.start()
            assert engine.model == MODEL
        finally:
            await engine.close()
            await (await serving).close()

    with caplog.at_level("INFO", logger="workers.vllm_engine"):
        run(scenario())
    assert "waiting for the vLLM server" in caplog.text
