"""``governor sim-server``: one simulated engine behind vLLM's OpenAI-compatible HTTP API.

Endpoints, shaped as vLLM's (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``):
``POST /v1/completions`` and ``POST /v1/chat/completions`` (non-streaming, or ``"stream": true``:
server-sent ``data: {chunk}`` events, then ``data: [DONE]``; ``stream_options.include_usage`` adds a
final chunk with ``usage`` and no choices, ``continuous_usage_stats`` puts ``usage`` on every
chunk; ``prompt_tokens_details`` only on the final one, as vLLM puts it: the adapter must wait for
that chunk, after the one with the finish reason), ``GET /metrics`` (vLLM's metric names, via
``EngineMetrics``), ``/health``, ``/v1/models`` and ``/version`` (which says ``"governor_sim": true``).

Requests:
- ``prompt``: a string, or a list of token ids (vLLM accepts both; one prompt per request here).
  A string counts one token per ``TEXT_CHARS_PER_TOKEN`` characters (rounded up), since there is no
  tokenizer; chat ``messages`` (string contents) count the same way over ``role: content`` lines.
  Full blocks of prompt tokens (or of 4-character pieces) are hashed into a chain, so repeated
  prefixes hit the simulated prefix cache.
- ``max_tokens`` (default 16; chat also takes ``max_completion_tokens``); ``model`` must be the
  served one (404 otherwise); invalid fields are a 400 naming the field, in vLLM's current error
  shape (``{"error": {"message", "type", "param", "code"}}``).
- The request id is the ``X-Request-Id`` header, else the body's ``request_id`` (both as vLLM),
  else a new uuid; the response ``id`` is ``cmpl-<id>`` / ``chatcmpl-<id>`` as vLLM makes it.
  Output token ``i`` is ``reference_token(id, i)``; its text is ``token_text``.
- ``return_token_ids`` (vLLM >= 0.10.2): choices carry ``token_ids``; ``prompt_token_ids`` comes
  with the first chunk (completions: in the choice; chat: top level) when the prompt was ids.
- ``governor_token_offset: k`` (a Governor extension; vLLM ignores unknown fields): the request
  continues a response whose first ``k`` tokens are the last ``k`` tokens of its prompt; it
  produces offsets ``k .. k + max_tokens - 1``.

The engine runs in real time (times ``speedup``) on the event loop: one task advances it at its
``next_event_s`` and routes token batches to per-request queues; an added request wakes it. A
client that disconnects aborts its request. Latency histograms are in engine (simulated) seconds.
"""

import asyncio
import hashlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version as package_version

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from infra.hangup import terminal_output_guard
from workers.engine import CapacityError, Engine, EngineRequest, TokenBatch
from workers.metrics import EngineMetrics

logger = logging.getLogger(__name__)

TEXT_CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 16
OFFSET_FIELD = "governor_token_offset"
_MIN_WAIT_S = 0.001  # never spin: wait at least this long (real time) between engine steps
_RETRY_WAIT_S = 0.1  # after a step that raised
#: Largest request body: the longest prompt as token ids (``MAX_PROMPT_TOKENS`` of up to 7 digits
#: and their separators, 9.4 MB) fits. vLLM sets no limit; aiohttp's default, 1 MiB, refused a
#: prompt of about 150k ids with a 413, long before the KV cache would.
MAX_BODY_BYTES = 16 * 2**20


def token_text(token_id: int) -> str:
    return f" t{token_id}"


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind

    def response(self) -> web.Response:
        """vLLM's current shape (``ErrorResponse``: an ``ErrorInfo`` under ``error``)."""
        return web.json_response({"error": {"message": str(self), "type": self.kind,
                                            "param": self.param, "code": self.status}},
                                 status=self.status)


@dataclass(frozen=True)
class Ask:
    """One parsed request."""

    request_id: str
    chat: bool
    units: list  # prompt tokens: ids, or pieces of text
    prompt_ids: list[int] | None
    max_tokens: int
    offset: int
    stream: bool
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False

    def engine_request(self, block_size: int) -> EngineRequest:
        own = len(self.units) - self.offset
        return EngineRequest(request_id=self.request_id, prompt_tokens=own,
                             max_tokens=self.offset + self.max_tokens, resume_from_token=self.offset,
                             prefix_hashes=hash_chain(self.units[:own], block_size),
                             hash_block_size=block_size)


def hash_chain(units: list, block_size: int) -> tuple[int, ...]:
    hashes, last = [], 0
    for start in range(0, len(units) - block_size + 1, block_size):
        digest = hashlib.blake2b(repr((last, units[start:start + block_size])).encode(), digest_size=8)
        last = int.from_bytes(digest.digest(), "little") >> 1
        hashes.append(last)
    return tuple(hashes)


def _text_units(text: str) -> list[str]:
    return [text[i:i + TEXT_CHARS_PER_TOKEN] for i in range(0, len(text), TEXT_CHARS_PER_TOKEN)]


def _prompt(body: dict, chat: bool) -> tuple[list, list[int] | None]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise ApiError("messages must be a non-empty list of {role, content} with string "
                           "contents", "messages")
        return _text_units("".join(f"{m['role']}: {m['content']}\n" for m in messages)), None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return _text_units(prompt), None
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt), list(prompt)
    raise ApiError("prompt must be a non-empty string or list of token ids (one prompt per "
                   "request)", "prompt")


def _int(body: dict, name: str, default: int, minimum: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(f"{name} must be an integer of at least {minimum}, got {value!r}", name)
    return value


def parse_ask(body: object, headers, *, chat: bool, served_model: str) -> Ask:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
    units, ids = _prompt(body, chat)
    tokens_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = _int(body, tokens_key, DEFAULT_MAX_TOKENS, 1)
    offset = _int(body, OFFSET_FIELD, 0, 0)
    if offset > len(units):  # (equal: a prompt of no tokens of its own, resumed)
        raise ApiError(f"{OFFSET_FIELD} ({offset}) must be at most the prompt's {len(units)} "
                       "tokens", OFFSET_FIELD)
    if body.get("n", 1) not in (1, None):
        raise ApiError("n must be 1: the sim-server produces one choice per request", "n")
    stream = body.get("stream") or False
    options = body.get("stream_options")
    if not isinstance(stream, bool):
        raise ApiError("stream must be a boolean", "stream")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError("stream_options can only be defined when `stream=True`.", "stream_options")
    options = options or {}
    request_id = headers.get("X-Request-Id") or body.get("request_id") or uuid.uuid4().hex
    return Ask(request_id=str(request_id), chat=chat, units=units, prompt_ids=ids,
               max_tokens=max_tokens, offset=offset, stream=stream,
               include_usage=bool(options.get("include_usage")),
               continuous_usage=bool(options.get("continuous_usage_stats")),
               return_token_ids=bool(body.get("return_token_ids")))


@dataclass
class _Live:
    ask: Ask
    arrival_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False
    last_token_s: float | None = None  # engine time of its last token (its inter-token latency)


class _Reply:
    """Shapes one request's response bodies and stream chunks as vLLM does."""

    def __init__(self, ask: Ask, model: str) -> None:
        self.ask, self.model = ask, model
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if ask.chat else 'cmpl'}-{ask.request_id}"
        self.produced = 0
        self.cached = 0  # prompt tokens the prefix cache held (known on the finishing batch)
        self.started = False

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, details: bool = True) -> dict:
        """``details``: with the prompt tokens the prefix cache held, as vLLM gives them (with
        ``--enable-prompt-tokens-details``) in a whole response's usage and a stream's final
        usage chunk only, not in a ``continuous_usage_stats`` chunk."""
        prompt = len(self.ask.units)
        usage = {"prompt_tokens": prompt, "completion_tokens": self.produced,
                 "total_tokens": prompt + self.produced}
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return usage

    def _choice(self, text: str, ids: list[int], reason: str | None, first: bool) -> dict:
        ask = self.ask
        choice = {"index": 0, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        if ask.return_token_ids:
            choice["token_ids"] = ids
            if first and not ask.chat:
                choice["prompt_token_ids"] = ask.prompt_ids
        return choice | ({"text": text} if not ask.chat else {})

    def chunks(self, batch: TokenBatch) -> list[dict]:
        """The stream chunks for one batch (chat's first also opens the assistant message)."""
        ids = list(batch.tokens)
        self.produced += batch.count
        self.cached = max(self.cached, batch.cached_tokens)
        first, self.started = not self.started, True
        out = []
        if first and self.ask.chat:
            out.append(self._chunk(self._choice("", [], None, False) | {
                "delta": {"role": "assistant", "content": ""}}, first=True))
        text = "".join(map(token_text, ids))
        choice = self._choice(text, ids, batch.finish_reason, first)
        if self.ask.chat:
            choice["delta"] = {"content": text}
        out.append(self._chunk(choice, first=first and not self.ask.chat))
        return out

    def _chunk(self, choice: dict, first: bool) -> dict:
        chunk = self._head("chat.completion.chunk" if self.ask.chat else "text_completion")
        chunk["choices"] = [choice]
        if first and self.ask.chat and self.ask.return_token_ids:
            chunk["prompt_token_ids"] = self.ask.prompt_ids
        if self.ask.continuous_usage:
            chunk["usage"] = self.usage(details=False)
        return chunk

    def usage_chunk(self) -> dict:
        return self._head("chat.completion.chunk" if self.ask.chat else "text_completion") | {
            "choices": [], "usage": self.usage()}

    def whole(self, ids: list[int], reason: str | None) -> dict:
        self.produced = len(ids)
        text = "".join(map(token_text, ids))
        choice = self._choice(text, ids, reason, True)
        body = self._head("chat.completion" if self.ask.chat else "text_completion")
        if self.ask.chat:
            choice["message"] = {"role": "assistant", "content": text}
            if self.ask.return_token_ids:
                body["prompt_token_ids"] = self.ask.prompt_ids
        return body | {"choices": [choice], "usage": self.usage()}


def _sse(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class SimServer:
    """The HTTP front of one engine; ``app`` serves it, ``start``/``close`` run it in-process."""

    def __init__(self, engine: Engine, model: str, *, speedup: float = 1.0, gpu: str = "",
                 metrics: EngineMetrics | None = None) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        self.engine, self.model, self.speedup, self.gpu = engine, model, speedup, gpu
        self.metrics = metrics or EngineMetrics(model)
        self.metrics.observe_stats(engine.stats())  # the baseline of its work
        config = getattr(engine, "config", None)
        self.block_size = getattr(config, "block_size", 16)
        self._live: dict[str, _Live] = {}
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._runner: web.AppRunner | None = None
        self.app = web.Application(client_max_size=MAX_BODY_BYTES)
        self.app.add_routes([
            web.post("/v1/completions", self._completions),
            web.post("/v1/chat/completions", self._chat),
            web.get("/metrics", self._metrics), web.get("/health", self._health),
            web.get("/v1/models", self._models), web.get("/version", self._version),
        ])
        self.app.cleanup_ctx.append(self._driver)

    def now(self) -> float:
        """Engine time: seconds since the server started, times ``speedup``."""
        return (time.monotonic() - self._t0) * self.speedup

    # -- running the engine ---------------------------------------------------------------------
    async def _driver(self, app: web.Application):
        task = asyncio.create_task(self._drive(), name="sim-engine")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _drive(self) -> None:
        while True:
            least = _MIN_WAIT_S
            try:
                for batch in self.engine.advance(self.now()):
                    self._route(batch)
                self.metrics.observe_stats(self.engine.stats())
            except Exception:  # keep serving; log the failed step and try again a little later
                logger.exception("engine step failed")
                least = _RETRY_WAIT_S
            due = self.engine.next_event_s()
            wait = None if due is None else max((due - self.now()) / self.speedup, least)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def _route(self, batch: TokenBatch) -> None:
        live = self._live.get(batch.request_id)
        if live is None:
            return
        m = self.metrics
        m.observe_tokens(batch.count)
        live.last_token_s = m.observe_token_gaps(batch, live.last_token_s)
        if batch.first and batch.first_token_s is not None:
            m.observe_prefilled(len(live.ask.units))
            m.observe_first_token(batch.first_token_s - live.arrival_s)
        if batch.finished:
            live.finished = True
            m.observe_finished(batch.time_s - live.arrival_s, batch.finish_reason or "length")
        live.queue.put_nowait(batch)

    def _submit(self, ask: Ask) -> _Live:
        if ask.request_id in self._live:  # (in vLLM's words, before it suffixed the ids
            # clients give: its adapter hands such a request back, its first attempt not over)
            raise ApiError(f"Request id {ask.request_id} already running.", "X-Request-Id")
        now = self.now()
        try:
            self.engine.add(ask.engine_request(self.block_size), now)
        except (CapacityError, ValueError) as exc:
            raise ApiError(str(exc), "prompt") from None
        live = self._live[ask.request_id] = _Live(ask, now)
        self._wake.set()
        return live

    # -- handlers -------------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return ApiError("the request body is not valid JSON").response()
        try:
            ask = parse_ask(body, request.headers, chat=chat, served_model=self.model)
            live = self._submit(ask)
        except ApiError as exc:
            return exc.response()
        reply = _Reply(ask, self.model)
        try:
            if ask.stream:
                return await self._stream(request, live, reply)
            ids, reason = [], None
            while not live.finished or not live.queue.empty():
                batch = await live.queue.get()
                ids += batch.tokens
                reason = batch.finish_reason or reason
                reply.cached = max(reply.cached, batch.cached_tokens)
            return web.json_response(reply.whole(ids, reason), headers={"X-Request-Id": ask.request_id})
        finally:
            self._live.pop(ask.request_id, None)
            if not live.finished:  # the client went away (or the server stops)
                self.engine.abort(ask.request_id)
                self._wake.set()

    async def _stream(self, request: web.Request, live: _Live, reply: _Reply) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache",
                                               "X-Request-Id": live.ask.request_id})
        await response.prepare(request)
        while True:
            batch = await live.queue.get()
            await response.write(b"".join(_sse(c) for c in reply.chunks(batch)))
            if batch.finished:
                break
        if live.ask.include_usage:
            await response.write(_sse(reply.usage_chunk()))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.observe_stats(self.engine.stats())
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model, "parent": None, "permission": [],
                "max_model_len": self._max_model_len()}
        return web.json_response({"object": "list", "data": [card]})

    def _max_model_len(self) -> int | None:
        """The engine's context, or (a model declared without one) what its KV cache holds."""
        limit = getattr(self.engine, "max_model_len", None)
        kv = getattr(self.engine, "kv", None)
        return limit if limit is not None or kv is None else kv.num_blocks * kv.block_size

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": package_version("governor"), "governor_sim": True,
                                  "gpu": self.gpu, "model": self.model, "speedup": self.speedup})

    # -- in-process lifecycle -------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve on ``host:port`` (0: a free port); returns the port."""
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def serve(host: str, port: int, *, gpu: str, model: str, tp: int = 1, speedup: float = 1.0,
          max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
          max_model_len: int | None = None, listening: Callable[[str], None] = print) -> None:
    """Build the calibrated simulated engine and serve it until SIGINT, SIGTERM or SIGHUP (its
    terminal closed: its output to /dev/null first, ``infra.hangup``). ``port`` 0: a free one;
    ``listening`` is told the URL served once the server listens."""
    from workers.factory import build_engine

    engine = build_engine("sim", gpu=gpu, model=model, tp=tp, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len)
    server = SimServer(engine, model, speedup=speedup, gpu=gpu)

    off_a_hung_up_terminal = terminal_output_guard()

    async def run() -> None:
        stop = asyncio.Event()

        def hung_up() -> None:
            off_a_hung_up_terminal()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, hung_up)
        bound = await server.start(host, port)
        url = f"http://{f'[{host}]' if ':' in host else host}:{bound}"  # (an IPv6 host bracketed)
        logger.info("sim-server: %s on %s at %s (speedup %g)", model, gpu, url, speedup)
        listening(url)
        try:
            await stop.wait()
        finally:
            await server.close()

    asyncio.run(run())
