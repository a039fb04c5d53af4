"""The vLLM adapter's reading of a completion stream, event by event, as vLLM's OpenAI server
writes it (``vllm/entrypoints/openai/serving_completion.py``, 0.8 to 0.11;
``vllm/entrypoints/openai/completion/serving.py`` after)."""

import asyncio
import json

import pytest
from aiohttp import web

from tests.http_stand_ins import finished_batches, serving, vllm_app
from workers.engine import EngineRequest
from workers.vllm_engine import VllmHttpEngine, _Stream

DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def _event(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}".encode()


def _token(i: int, reason: str | None = None) -> dict:
    return {"id": "cmpl-r", "object": "text_completion", "choices": [
        {"index": 0, "text": f" t{i}", "token_ids": [100 + i], "finish_reason": reason,
         "stop_reason": None}]}


def _error_0_11(message: str) -> dict:
    """An error inside a stream, as vLLM 0.8 to 0.11 write it: always ``BadRequestError``, 400
    (``create_streaming_error_response(str(e))``), the old ``ErrorResponse`` under ``error``."""
    return {"error": {"object": "error", "message": message, "type": "BadRequestError",
                      "param": None, "code": 400}}


def _error_current(message: str, code: int) -> dict:
    """The same in later vLLM: ``{"error": ErrorInfo}``, its code from the exception."""
    return {"error": {"message": message, "type": "InternalServerError" if code >= 500
                      else "BadRequestError", "param": None, "code": code}}


def _read(events: list[bytes], max_tokens: int = 8) -> _Stream:
    async def scenario():
        stream = _Stream(EngineRequest("r", prompt_tokens=10, max_tokens=max_tokens), 0)
        for event in events:
            if not VllmHttpEngine._on_event(stream, event):
                break
        return stream
    return asyncio.run(scenario())


@pytest.mark.parametrize("events", [
    [_event(_error_0_11(DEAD))],  # the engine died before the first token
    [_event(_token(0)), _event(_error_0_11(DEAD))],  # ... or after it
    [_event(_token(0)), _event(_token(1)), _event(_error_0_11("'NoneType' object is not ..."))],
    [_event(_error_current(DEAD, 500))],
    # (an earlier attempt of the same id, handed back, not yet aborted there: vLLM before it
    # suffixed the ids clients give, ``OutputProcessor.add_request``)
    [_event(_error_0_11("Request id cmpl-r-0 already running."))],
    [_event(_token(0)), _event(_error_current("Internal server error", 500))],
])
def test_an_error_in_a_stream_from_the_server_s_trouble_hands_the_request_back(events):
    """vLLM 0.8 to 0.11 send every error inside a stream coded 400, its engine core's death
    included: read as the request's refusal (``invalid_request``), a dying server failed the
    requests it held, and their tasks, instead of handing them back to continue elsewhere."""
    stream = _read([*events, _event("[DONE]")])
    assert stream.done and stream.finish_reason == "error"
    assert stream.failure.kind == "retryable", stream.failure


def test_a_refusal_inside_a_stream_before_any_token_is_still_the_request_s():
    """vLLM 0.8 to 0.10 check a prompt's ids in the engine, after the stream began: a 400
    there, before any token, refuses the request itself."""
    stream = _read([_event(_error_0_11("Token id 200000 is out of vocabulary")),
                    _event("[DONE]")])
    assert stream.failure.kind == "invalid_request"
    assert "out of vocabulary" in stream.failure.detail


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict:
    """The usage chunk vLLM sends after the last token's (``include_usage``): no choices; the
    prompt tokens its prefix cache held only here (``--enable-prompt-tokens-details``)."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "cmpl-r", "object": "text_completion", "choices": [], "usage": usage}


def test_the_cached_prompt_tokens_of_the_usage_after_the_last_chunk_reach_the_finishing_batch():
    """vLLM puts ``prompt_tokens_details`` on the usage chunk after the one with the finish
    reason, not on that one (nor on a ``continuous_usage_stats`` chunk): an ``advance`` between
    the two handed the request out finished, with no cached tokens (a Completed's
    ``cached_tokens`` 0 whenever the usage came in a read of its own)."""
    async def scenario():
        stream = _Stream(EngineRequest("r", prompt_tokens=100, max_tokens=2), 0)
        batches = []
        for event in (_token(0), _token(1, "length"), _usage(100, 2, cached=96), "[DONE]"):
            more = VllmHttpEngine._on_event(stream, _event(event))
            if stream.has_news:  # (the worker's ``advance``, between two reads)
                batches.append(stream.take(0.0, 0.0))
            if not more:
                break
        return batches

    batches = asyncio.run(scenario())
    assert sum(b.count for b in batches) == 2 and [b.finished for b in batches][-1]
    assert not any(b.finished for b in batches[:-1])
    assert (batches[-1].finish_reason, batches[-1].cached_tokens) == ("length", 96)


def test_a_stream_cut_after_its_last_chunk_ends_as_that_chunk_said():
    """The finish reason came; the usage and ``[DONE]`` did not (the connection closed): the
    request has every token, and completes."""
    stream = _read([_event(_token(0)), _event(_token(1, "length"))], max_tokens=2)
    assert not stream.done
    stream.cut(None)
    assert (stream.finish_reason, stream.failure) == ("length", None)


def test_an_error_after_the_last_chunk_ends_the_stream_as_that_chunk_said():
    """The finish reason came with the last token; an error came instead of the usage (its
    engine died as it sent it): the request has every token and completes, as when the
    connection closes there (``cut``). Handed back, it was continued from its last token,
    with nothing left to generate."""
    stream = _read([_event(_token(0)), _event(_token(1, "length")),
                    _event(_error_0_11(DEAD)), _event("[DONE]")], max_tokens=2)
    assert stream.done and (stream.finish_reason, stream.failure) == ("length", None)


@pytest.mark.parametrize("garbled", [
    b'data: {"id": "cmpl-r", "choices": [{"index": 0, "te',  # cut short in the middle
    b"data: {not json}",
    b"data: 42",  # JSON, but no chunk
    b'data: ["choices"]',
])
@pytest.mark.parametrize("tokens_before", [0, 2])
def test_an_unreadable_event_is_the_server_s_trouble_and_hands_the_request_back(
        garbled, tokens_before):
    """An event that is no JSON object (a proxy that mangled or cut it, a server in trouble)
    says nothing of the request. Before, it raised in the adapter, which failed the request
    (``engine_error``, ``the adapter failed: JSONDecodeError(...)``, with a traceback): its
    task failed, where a stream cut short there is handed back to continue from its tokens."""
    events = [_event(_token(i)) for i in range(tokens_before)] + [garbled, _event("[DONE]")]
    stream = _read(events)
    assert stream.done and stream.finish_reason == "error"
    assert stream.failure.kind == "retryable" and "no JSON object" in stream.failure.detail
    assert stream.received == tokens_before


def test_an_unreadable_event_after_the_last_chunk_ends_the_stream_as_that_chunk_said():
    stream = _read([_event(_token(0)), _event(_token(1, "length")), b"data: {not json}"],
                   max_tokens=2)
    assert stream.done and (stream.finish_reason, stream.failure) == ("length", None)


async def _streamed(chunks: list[dict], max_tokens: int, done: bool = True) -> list:
    """The batches of one request to a stand-in server that streams ``chunks``, then
    ``[DONE]`` (``done``; else it closes the stream there)."""
    async def completions(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(_event(chunk) + b"\n\n")
        if done:
            await response.write(b"data: [DONE]\n\n")
        return response

    async with serving(vllm_app(completions)) as url:
        engine = VllmHttpEngine(url, sim_extensions=False, connect_timeout_s=5)
        await engine.start()
        try:
            return await finished_batches(
                engine, EngineRequest("r", prompt_tokens=8, max_tokens=max_tokens))
        finally:
            await engine.close()

def test_done_with_no_finish_reason_after_every_token_completes_the_request():
    """vLLM gives the finish reason in the last token's chunk; a server (or proxy) that leaves
    it out and sends ``[DONE]`` has still sent every token asked for (``ignore_eos``: the
    request ends at ``max_tokens``). Before, the request failed (``engine_error``, the stream
    ended with no finish reason), and its task with it."""
    batches = asyncio.run(_streamed([_token(0), _token(1), _usage(8, 2)], max_tokens=2))
    assert sum(b.count for b in batches) == 2
    assert (batches[-1].finish_reason, batches[-1].failure) == ("length", None)


def test_done_with_no_finish_reason_before_every_token_hands_the_request_back():
    """Fewer tokens than asked for, and no reason: the server's trouble, not the request's;
    handed back to continue from its tokens elsewhere (before, it failed, ``engine_error``)."""
    batches = asyncio.run(_streamed([_token(0), _token(1)], max_tokens=5))
    assert sum(b.count for b in batches) == 2
    assert batches[-1].finish_reason == "error"
    assert batches[-1].failure.kind == "retryable"
    assert "no finish reason after 2 of 5 tokens" in batches[-1].failure.detail


@pytest.mark.parametrize("chunks", [[_token(0), _token(1)], [_token(0), _token(1), _usage(8, 2)]])
def test_a_stream_closed_with_no_finish_reason_after_every_token_completes_the_request(chunks):
    """The server closes the stream with neither a finish reason nor ``[DONE]``, every token
    asked for sent: the request has them all (``ignore_eos``), and completes. Before, it was
    handed back to continue elsewhere with nothing left to generate (the router, holding every
    token, completed it with no final chunk for its client; the worker's breaker counted an
    engine failure)."""
    batches = asyncio.run(_streamed(chunks, max_tokens=2, done=False))
    assert sum(b.count for b in batches) == 2
    assert (batches[-1].finish_reason, batches[-1].failure) == ("length", None)


def test_a_stream_closed_with_no_finish_reason_before_every_token_hands_the_request_back():
    batches = asyncio.run(_streamed([_token(0)], max_tokens=2, done=False))
    assert sum(b.count for b in batches) == 1
    assert batches[-1].finish_reason == "error" and batches[-1].failure.kind == "retryable"
    assert "closed the stream" in batches[-1].failure.detail


class _RaisesAfter(VllmHttpEngine):
    """An adapter that receives ``tokens`` (the last with ``reason``, if any), then raises."""

    def __init__(self, tokens: int, reason: str | None) -> None:
        super().__init__("http://unused")
        self.tokens, self.reason = tokens, reason

    def _ready(self) -> None:
        pass

    async def _run(self, stream: _Stream) -> None:
        for i in range(self.tokens):
            stream.receive([100 + i], 1)
        if self.reason is not None:
            stream.ending = self.reason
        raise RuntimeError("an unexpected reply")


@pytest.mark.parametrize("reason", ["stop", None])
def test_an_adapter_that_fails_after_every_token_completes_the_request(reason):
    """The adapter raises after the stream's last token came (its last chunk's finish reason,
    or every token asked for): the request has its whole answer and ends as a stream cut there
    does. Before, it failed (``engine_error``, "the adapter failed"), every token sent."""
    async def scenario():
        return await finished_batches(_RaisesAfter(2, reason),
                                      EngineRequest("r", prompt_tokens=8, max_tokens=2))
    batches = asyncio.run(scenario())
    assert sum(b.count for b in batches) == 2
    assert (batches[-1].finish_reason, batches[-1].failure) == (reason or "length", None)


def test_an_adapter_that_fails_before_the_last_token_fails_the_request():
    async def scenario():
        return await finished_batches(_RaisesAfter(1, None),
                                      EngineRequest("r", prompt_tokens=8, max_tokens=2))
    batches = asyncio.run(scenario())
    assert batches[-1].finish_reason == "error"
    assert batches[-1].failure.kind == "engine_error"
    assert "the adapter failed" in batches[-1].failure.detail
