"""The ``Engine`` interface over a vLLM OpenAI-compatible server (a real vLLM, or ``governor sim-server``).

The worker calls ``add``/``advance``/``abort`` synchronously from its event loop; the HTTP work runs
as asyncio tasks on that same loop, started by ``await engine.start()`` and stopped by
``await engine.close()`` (``WorkerService.run`` calls both when an engine has them). Each request is
one streaming ``POST /v1/completions``; the tokens it streams wait in a buffer until the next
``advance`` hands them out as a ``TokenBatch``.

What the adapter sends (vLLM's request fields; vLLM ignores fields it does not know):
- ``prompt`` as token ids. ``EngineRequest`` carries no prompt text, so the ids are placeholders
  (see ``prompt_token_ids``): prompts that share prefix hashes share their leading ids, so the
  server's prefix cache sees what the trace describes; the rest is unique to the request.
- ``max_tokens`` = the tokens still to produce, ``ignore_eos`` so that exactly that many come,
  header ``X-Request-Id`` = Governor's request id (vLLM uses it as its request id);
- ``return_token_ids`` (vLLM >= 0.10.2: ``choices[].token_ids`` carries each chunk's ids) and
  ``stream_options.continuous_usage_stats`` (every chunk carries ``usage``), so tokens are counted
  exactly even by an older vLLM that sends no ids (the batch then has counts but no ids);
- ``governor_token_offset`` (a Governor extension) only to a sim-server (``GET /version`` says
  ``"governor_sim": true``): the output offset a continuation starts at, so the sim-server's
  tokens are the deterministic reference from there on.

Load comes from ``GET /metrics`` every ``scrape_interval_s``, read through ``VLLM_METRICS`` (current
and older names). Requests in flight here that the last scrape did not see count as waiting.
Its prefix-cache and preemption counts start with the adapter (``CountsSinceStart``).
A request that fails over HTTP finishes with ``finish_reason="error"`` (vLLM's own name for it) and
an ``EngineFailure``: a server that cannot be reached, breaks the stream or answers 5xx is the
engine's trouble (``retryable``: the worker hands the request back, to continue elsewhere). Three
scrapes or requests in a row that cannot reach the server make the engine ``crashed`` until a
scrape succeeds; a request that cannot reach it has the server scraped at once. A ``/metrics``
page no parser reads is no failed contact: the server answered.
"""

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import aiohttp
import numpy as np
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from schemas.errors import TerminalError
from schemas.limits import MAX_TOKEN_ID  # the largest token id a chunk may carry
from workers.engine import EngineFailure, EngineRequest, EngineStats, TokenBatch
from workers.metric_names import BY_LABEL, FRACTIONS, VLLM_METRICS
from workers.sse import SseEvents

logger = logging.getLogger(__name__)

#: Placeholder prompt ids are drawn from [BASE, BASE + SPAN): valid in the vocabularies of
#: Llama 2 and 3, Mistral and Qwen alike.
PLACEHOLDER_BASE, PLACEHOLDER_SPAN = 1_000, 30_000
#: KV usage is reported in blocks of this many when the server does not export its block count.
KV_PER_MILLE_BLOCKS = 1_000
_FAILED_CONTACTS_TO_CRASHED = 3
#: How long a starting worker waits for its server to answer: ``vllm serve`` binds its port at once
#: but listens only once its model is loaded (``create_server_socket`` in
#: ``vllm/entrypoints/openai/api_server.py``: connections are refused meanwhile), and gives its
#: engine up to ``VLLM_ENGINE_READY_TIMEOUT_S``, 600 s by default, to start. (30 s: a worker
#: started with its server stopped, refused for good, while the model loaded.)
SERVER_START_TIMEOUT_S = 600.0
_WAITING_LOGGED_EVERY_S = 30.0
_FRACTION_NAMES = frozenset(name for signal in FRACTIONS for name in VLLM_METRICS[signal])


# -- metrics ------------------------------------------------------------------------------------
def parse_metrics(text: str | Iterable[Metric]) -> dict[str, float]:
    """Prometheus text (or its parsed families) -> {sample name: value summed over label sets,
    or averaged for a fraction of one engine (``FRACTIONS``)}; buckets and ``_created`` samples
    are left out (their sums mean nothing). A family of ``BY_LABEL`` is also summed per value of
    its label, as ``name{label="value"}`` (the name without ``_total``)."""
    values: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in _families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            counts[sample.name] = counts.get(sample.name, 0) + 1
            base = sample.name.removesuffix("_total")
            if (label := BY_LABEL.get(base)) is not None and label in sample.labels:
                key = f'{base}{{{label}="{sample.labels[label]}"}}'
                values[key] = values.get(key, 0.0) + sample.value
    for name in _FRACTION_NAMES:
        if counts.get(name, 0) > 1:
            values[name] /= counts[name]
    return values


def metric_labels(text: str | Iterable[Metric], signal: str) -> list[dict[str, str]]:
    """The label sets of a signal's samples (for info-style gauges such as the cache config)."""
    names = VLLM_METRICS.get(signal, ())
    return [dict(sample.labels) for family in _families(text)
            for sample in family.samples if family.name in names or sample.name in names]


def _families(text: str | Iterable[Metric]) -> Iterable[Metric]:
    return text_string_to_metric_families(text) if isinstance(text, str) else text


def read_signals(values: Mapping[str, float]) -> dict[str, float]:
    """Governor signal -> value, from the first of its vLLM names the server exposes
    (a counter may appear with prometheus-client's ``_total`` suffix)."""
    signals = {}
    for signal, names in VLLM_METRICS.items():
        found = next((values[s] for n in names for s in (n, f"{n}_total") if s in values), None)
        if found is not None:
            signals[signal] = found
    return signals


def engine_stats(signals: Mapping[str, float], num_gpu_blocks: int | None = None,
                 state: str = "warm") -> EngineStats:
    """EngineStats from scraped signals. Without the server's block count, KV usage is given in
    per-mille "blocks" (``KV_PER_MILLE_BLOCKS`` in all). Prompt tokens computed, prefix-cache
    hits and queries come from vLLM's prompt tokens by source where it counts them (once per
    prefill), else from its prefix-cache lookups and tokens per step."""
    total = num_gpu_blocks or KV_PER_MILLE_BLOCKS
    used = round(min(max(signals.get("kv_usage", 0.0), 0.0), 1.0) * total)
    computed = signals.get("computed_prompt_tokens")
    if computed is not None:  # counted once per prefill: hits of its own source, queries all
        hits = signals.get("cached_prompt_tokens", 0.0)
        queries = signals.get("prompt_tokens_by_source", computed + hits)
    else:  # counted per lookup
        hits = signals.get("prefix_cache_hits", 0.0)
        queries = signals.get("prefix_cache_queries", 0.0)
    work = {}
    steps, scheduled = signals.get("iteration_steps"), signals.get("iteration_tokens")
    if steps is not None and scheduled is not None:  # prompt tokens computed: hits left out
        prompt = computed if computed is not None else (
            scheduled - signals.get("generation_tokens", 0.0) - hits)
        work = {"steps": int(steps), "prefilled_tokens": max(int(prompt), 0)}
    return EngineStats(
        running=int(signals.get("running", 0)), waiting=int(signals.get("waiting", 0)),
        kv_blocks_used=used, kv_blocks_free=total - used,
        prefix_cache_queries=int(queries), prefix_cache_hits=int(hits),
        preemptions=int(signals.get("preemptions", 0)), state=state, **work,
    )


def stats_from_text(text: str, state: str = "warm") -> EngineStats:
    """A server running several engines (data parallel) exports a cache config per engine,
    each with the blocks of them all: vLLM's front end sums its engines' ``num_gpu_blocks`` as
    they start (``wait_for_engine_startup``, ``vllm/v1/engine/utils.py``) and labels every
    engine's ``vllm:cache_config_info`` with that one config. So the server's blocks are what
    they say (the largest, should they differ), not their sum; the KV fraction is the engines'
    mean, the requests their sum."""
    families = list(text_string_to_metric_families(text))  # parsed once, read twice
    blocks = [int(float(labels["num_gpu_blocks"]))
              for labels in metric_labels(families, "cache_config")
              if labels.get("num_gpu_blocks", "None") not in ("None", "")]
    return engine_stats(read_signals(parse_metrics(families)), max(blocks, default=0) or None,
                        state)


@dataclass(slots=True)
class CountsSinceStart:
    """A server's prefix-cache queries and hits and its preemptions, counted from the first
    scrape that reads them (its worker's start), as the worker's tokens generated and steps
    are: what the server counted before is its history. Counts that go back are a server that
    started again: counted from 0."""

    last: tuple[int, int, int] | None = None
    counted: tuple[int, int, int] = (0, 0, 0)

    def count(self, stats: EngineStats) -> EngineStats:
        """``stats`` with the counts since the first."""
        now = (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.preemptions)
        if self.last is not None:
            restarted = any(n < b for n, b in zip(now, self.last))
            self.counted = tuple(c + (n if restarted else n - b)
                                 for c, n, b in zip(self.counted, now, self.last))
        self.last = now
        queries, hits, preemptions = self.counted
        return replace(stats, prefix_cache_queries=queries, prefix_cache_hits=hits,
                       preemptions=preemptions)


# -- failures -----------------------------------------------------------------------------------
def http_failure(status: int | None, body: object) -> EngineFailure:
    """What an HTTP error from the server (or an error event in its stream, with the status it
    names, if any) means for its request, with the server's message: a 5xx (and 404, 408, 429:
    the model gone, a timeout, an overload) is the server's trouble, retryable elsewhere; any
    other 4xx a refusal of the request (a prompt longer than the model's context), not the
    engine's failure (which its worker's breaker counts), unless vLLM's message says its own
    trouble (``SERVER_TROUBLE_MESSAGES``: retryable whatever the code)."""
    said = _server_message(body)[:1_000]
    if is_server_trouble(said) or (status is not None and (
            status >= 500 or status in (404, 408, 429))):
        kind = "retryable"
    else:
        kind = "invalid_request" if status is not None and 400 <= status < 500 else "engine_error"
    return EngineFailure(kind, f"{'' if status is None else f'HTTP {status} from '}"
                               f"the engine's server: {said}")


#: What vLLM says of its own trouble, not the request's, in errors it codes 400 all the same: its
#: engine core died (``EngineDeadError``, ``vllm/v1/engine/exceptions.py``, 0.8 on; inside a stream
#: vLLM 0.8 to 0.11 code every error 400), or it still holds an earlier request of the same id
#: (``OutputProcessor.add_request``, ``vllm/v1/engine/output_processor.py``, before vLLM added a
#: random suffix to the ids clients give: a request handed back and sent again to the same
#: server before its first attempt's abort had gone through).
SERVER_TROUBLE_MESSAGES = ("EngineCore encountered an issue", "already running")


def stream_error_failure(code: int | None, body: object, received: int) -> EngineFailure:
    """What an error event inside a stream (after the server answered 200) means for its
    request. vLLM 0.8 to 0.11 code every such error 400, whatever its cause
    (``create_streaming_error_response(str(e))`` in ``serving_completion.py``), its engine's death
    included; later ones map the exception (``EngineDeadError``: 500). So an error of a request
    that has tokens already is the server's trouble, retryable (a refusal of the request itself
    comes before its tokens: a prompt the model cannot hold is an HTTP 400, not an event);
    before its tokens, as ``http_failure`` (the engine's death is known by its message)."""
    failure = http_failure(code, body)
    if failure.kind != "retryable" and received > 0:
        return EngineFailure("retryable", failure.detail.replace(
            "from the engine's server", "in the engine's stream", 1))
    return failure


def is_server_trouble(message: str) -> bool:
    """Whether vLLM's message says its own trouble (``SERVER_TROUBLE_MESSAGES``)."""
    return any(said in message for said in SERVER_TROUBLE_MESSAGES)


def _worth_logging(failed_scrapes: int) -> bool:
    """Whether this many failed scrapes in a row are logged: the first few, then at each
    doubling (a server down for an hour, scraped every 0.5 s, is not 7,200 warnings)."""
    return failed_scrapes <= _FAILED_CONTACTS_TO_CRASHED or \
        failed_scrapes & (failed_scrapes - 1) == 0


def _max_model_len(card: dict) -> int | None:
    """The context a model card gives (vLLM's ``max_model_len``), if it gives a usable one."""
    limit = card.get("max_model_len")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def _server_message(body: object) -> str:
    """The message of an error in vLLM's shape (``{"object": "error", "message": ...}``, or
    under ``"error"``), else the body as it came."""
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body
    if isinstance(body, dict):
        inner = body.get("error")
        message = (inner if isinstance(inner, dict) else body).get("message")
        if isinstance(message, str):
            return message
    return body if isinstance(body, str) else json.dumps(body)


def _json_object(data: bytes) -> dict | None:
    """An event's data as the JSON object it should be, or None."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


# -- prompts ------------------------------------------------------------------------------------
def _placeholders(seeds: list[str], count: int) -> np.ndarray:
    """``count`` ids for each seed, the same for a seed in every process: position ``j`` of a
    seed's run is a 64-bit mix of the seed's hash and ``j``. In numpy, so that the ids of a
    1M-token prompt take milliseconds of the worker's event loop, not most of a second."""
    if not seeds or count <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.array([int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big")
                     for seed in seeds], dtype=np.uint64)
    mixed = _mix64(_mix64(keys)[:, None] + np.arange(count, dtype=np.uint64)[None, :])
    return (PLACEHOLDER_BASE + mixed % np.uint64(PLACEHOLDER_SPAN)).astype(np.int64).ravel()


def _mix64(z: np.ndarray) -> np.ndarray:
    """A 64-bit finalising mix (SplitMix64's, wrapping like the uint64 arithmetic it is)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def prompt_token_ids(request: EngineRequest) -> list[int]:
    """Placeholder prompt ids: one run per prefix hash (``hash_block_size`` ids derived from the
    hash), then ids unique to the request, then one id per token already sent (a continuation)."""
    unit = max(request.hash_block_size, 1)
    blocks = request.prefix_hashes[: request.prompt_tokens // unit]
    ids = np.concatenate([
        _placeholders([f"block:{block_hash}" for block_hash in blocks], unit),
        _placeholders([f"prompt:{request.request_id}"], request.prompt_tokens - len(blocks) * unit),
        _placeholders([f"sent:{request.request_id}"], request.resume_from_token),
    ]).tolist()
    return ids or [PLACEHOLDER_BASE]


# -- streams ------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Stream:
    """One request's tokens between the HTTP task that receives them and ``advance``."""

    request: EngineRequest
    next_offset: int
    task: asyncio.Task | None = None
    ids: list[int] = field(default_factory=list)
    count: int = 0  # tokens received and not handed out; ``ids`` holds them when it is as long
    received: int = 0
    first_sent: bool = False
    done: bool = False
    finish_reason: str | None = None
    #: the finish reason its last chunk gave: it ends at ``[DONE]`` (or when the server closes),
    #: as the usage that follows the last chunk says what the prefix cache held
    ending: object = None
    failure: EngineFailure | None = None  # why it finished, unless by "stop" or "length"
    heard_s: float = 0.0  # loop time of its start or of the last tokens received
    first_heard_s: float | None = None  # loop time of the chunk that brought its first token
    cached: int = 0  # prompt tokens the server's prefix cache held (its usage says, if it does)

    def receive(self, token_ids: list[int] | None, count: int) -> None:
        if token_ids:
            self.ids += token_ids
        self.count += count
        self.received += count
        if count:
            self.heard_s = asyncio.get_running_loop().time()
            if self.received == count:
                self.first_heard_s = self.heard_s

    def finish(self, reason: object, failure: EngineFailure | None = None) -> None:
        """End the stream. A reason other than vLLM's four (``content_filter`` from another
        server) ends it as an ``error`` that names it (in a chunk it failed the worker)."""
        if self.done:
            return
        self.done = True
        self.finish_reason = reason if reason in ("stop", "length", "abort") else "error"
        if self.finish_reason == "abort" and failure is None:  # the server gave it up
            failure = EngineFailure("retryable", "the engine's server aborted the request")
        elif reason == "error" and failure is None:  # vLLM's own: its engine failed the request
            # (``FinishReason.ERROR``, a KV load that failed; vLLM's HTTP server makes it a 500)
            failure = EngineFailure("retryable", "the engine failed the request (finish reason "
                                                 "'error')")
        if self.finish_reason not in ("stop", "length"):
            self.failure = failure or EngineFailure(
                "engine_error", f"the engine finished the stream with {reason!r}"[:500])

    def done_said(self) -> None:
        """The stream's ``[DONE]``: it ends as its last chunk said. With no finish reason (vLLM
        gives one in the last token's chunk; another server or a proxy may not), it completes
        if every token asked for came (``ignore_eos``: it ends at ``max_tokens``), else it is
        the server's trouble, handed back. (Before, it failed, ``engine_error``.)"""
        self.cut(EngineFailure(
            "retryable", f"the engine's server ended the stream with no finish reason after "
                         f"{self.received} of {self.asked} tokens"))

    def cut(self, failure: EngineFailure) -> None:
        """The stream ends before its ``[DONE]``: as ``failure``, unless its last chunk came
        (then all but the usage and ``[DONE]`` came: it ends as that chunk said) or, with no
        finish reason, every token asked for did (it ends at ``max_tokens``, "length").
        (Before, a stream closed after its last token with no reason was handed back, with
        nothing left to generate: the router, holding every token, completed it with no final
        chunk, and the worker's breaker counted an engine failure.)"""
        if self.ending is not None:
            self.finish(self.ending)
        elif self.received >= self.asked:
            self.finish("length")
        self.finish("error", failure)

    @property
    def asked(self) -> int:
        """The tokens this attempt was asked for (``max_tokens`` of the continuation)."""
        return self.request.max_tokens - self.request.resume_from_token

    @property
    def has_news(self) -> bool:
        return self.count > 0 or self.done

    def take(self, now_s: float, loop_now: float) -> TokenBatch:
        """The tokens received since the last ``take``, at engine time ``now_s`` (loop time
        ``loop_now``): stamped with the engine times they arrived at (an inter-token latency
        is the gap between two of the stream's chunks, not between two ``advance`` calls)."""
        whole = len(self.ids) == self.count
        first = not self.first_sent and self.count > 0
        last_s = now_s - (loop_now - self.heard_s) if self.count else now_s
        first_s = now_s - (loop_now - self.first_heard_s) if first else None
        batch = TokenBatch(
            request_id=self.request.request_id, token_offset=self.next_offset,
            tokens=tuple(self.ids) if whole else (), first=first, finished=self.done,
            finish_reason=self.finish_reason if self.done else None, time_s=last_s,
            first_token_s=first_s, token_count=None if whole else self.count,
            failure=self.failure if self.done else None,
            cached_tokens=self.cached if self.done else 0,
        )
        self.first_sent |= first
        self.next_offset += self.count
        self.ids, self.count = [], 0
        return batch


class StreamingEngine:
    """Buffers of streamed tokens behind the ``Engine`` interface; subclasses run ``_run``."""

    def __init__(self, *, poll_s: float = 0.005) -> None:
        self.poll_s = poll_s
        self.max_model_len: int | None = None  # the served model's context, once started
        self.gpus = 1  # the GPUs it runs on (its tensor parallelism), which its heartbeat bills
        self._streams: dict[str, _Stream] = {}
        self._last_now = 0.0

    async def _run(self, stream: _Stream) -> None:
        raise NotImplementedError

    def _ready(self) -> None:
        """Raise unless ``start()`` has run."""

    def add(self, request: EngineRequest, now_s: float) -> None:
        if request.resume_from_token >= request.max_tokens:
            raise ValueError(f"{request.request_id}: nothing left to generate")
        if request.request_id in self._streams:
            raise ValueError(f"{request.request_id} is already in flight")
        self._ready()
        self._last_now = now_s
        stream = _Stream(request, next_offset=request.resume_from_token,
                         heard_s=asyncio.get_running_loop().time())
        self._streams[request.request_id] = stream
        stream.task = asyncio.get_running_loop().create_task(
            self._guarded(stream), name=f"engine-{request.request_id}")

    async def _guarded(self, stream: _Stream) -> None:
        try:
            await self._run(stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an unexpected reply: fail this request, not the worker
            logger.exception("request %s failed", stream.request.request_id)
            # (after its last chunk, or every token asked for: it ends as a stream cut there,
            # as that chunk said; before, it failed, engine_error, with every token sent)
            stream.cut(EngineFailure("engine_error", f"the adapter failed: {exc!r}"))
        stream.finish("error", EngineFailure("engine_error", "the stream ended with no finish reason"))

    def abort(self, request_id: str) -> bool:
        """Stop a request; False when there is none, or it has just finished (its last tokens
        end it as usual at the next ``advance``)."""
        stream = self._streams.get(request_id)
        if stream is None or stream.done:
            return False
        del self._streams[request_id]
        if stream.task is not None:
            stream.task.cancel()  # closes the connection; the server aborts the request
        return True

    def decoding(self) -> int:
        """Requests here that have their first token and are not done: the sequences this
        worker's inter-token latency is measured on (the scraped ``running`` counts prefills
        too, and is up to a scrape old)."""
        return sum(1 for s in self._streams.values() if s.received and not s.done)

    def advance(self, now_s: float) -> list[TokenBatch]:
        self._last_now = now_s
        batches = []
        loop_now = None
        for rid, stream in list(self._streams.items()):
            if stream.has_news:
                if loop_now is None:
                    loop_now = asyncio.get_running_loop().time()
                batches.append(stream.take(now_s, loop_now))
                if stream.done:
                    del self._streams[rid]
        return batches

    def next_event_s(self) -> float | None:
        if not self._streams:
            return None
        if any(s.has_news for s in self._streams.values()):
            return self._last_now
        return self._last_now + self.poll_s

    async def _cancel_streams(self) -> None:
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        self._streams.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _in_flight_stats(self, scraped: EngineStats) -> EngineStats:
        """Requests sent here that the last scrape did not count yet count as waiting; the
        prefill backlog is the prompts (and resumed tokens) of those here without a first token
        (vLLM reports none: at most that, as part of a prompt may be cached or computed); the
        context is the model card's."""
        missing = len(self._streams) - scraped.running - scraped.waiting
        backlog = sum(s.request.prompt_tokens + s.request.resume_from_token
                      for s in self._streams.values() if not s.received and not s.done)
        return replace(scraped, waiting=scraped.waiting + max(missing, 0),
                       prefill_backlog_tokens=backlog, max_model_len=self.max_model_len,
                       gpus=self.gpus)


def _dead(stats: EngineStats) -> EngineStats:
    """``stats`` of an engine that died: ``crashed``, holding no request and no cached block (its
    requests and cache went with it); its counters stay as counted."""
    return replace(stats, state="crashed", running=0, waiting=0, kv_blocks_used=0,
                   kv_blocks_free=stats.kv_blocks_used + stats.kv_blocks_free)


def _default_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))


class VllmHttpEngine(StreamingEngine):
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        session_factory: Callable[[], aiohttp.ClientSession] = _default_session,
        sim_extensions: bool | None = None,
        scrape_interval_s: float = 0.5,
        connect_timeout_s: float = SERVER_START_TIMEOUT_S,
        poll_s: float = 0.005,
        stalled_after_s: float = 30.0,
        gpus: int = 1,
        api_key: str | None = None,
        worker_model: str | None = None,
    ) -> None:
        """``model``: the served model name; None takes ``worker_model`` (the model its worker
        serves requests of, its ``--model``) where the server lists it, else the one model the
        server lists (a fleet's ``llama-3-8b`` served as ``meta-llama/Meta-Llama-3-8B``).
        ``sim_extensions``: send Governor's extension fields; None asks ``GET /version``.
        ``gpus``: the GPUs the server runs on (its tensor parallelism), as its operator says:
        vLLM does not tell them; its heartbeats bill them.
        ``api_key``: the server's (``vllm serve --api-key``), sent as ``Authorization: Bearer``
        with every request; vLLM answers 401 on its ``/v1`` routes without it."""
        super().__init__(poll_s=poll_s)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sim_extensions = sim_extensions
        self.scrape_interval_s = scrape_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.stalled_after_s = stalled_after_s
        self.gpus = gpus
        self.api_key = api_key
        self.worker_model = worker_model
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self._scrape_task: asyncio.Task | None = None
        self._scraped = EngineStats(running=0, waiting=0, state="starting")
        self._failed_contacts = 0  # scrapes and requests in a row that could not reach the server
        #: of them, the scrapes (what the log is throttled by: a busy worker's requests cut short
        #: when its server died would otherwise leave its first failed scrapes unlogged)
        self._failed_scrapes = 0
        self._scrape_now = asyncio.Event()
        self._read = False  # whether a scrape has read the server's load
        self._counts = CountsSinceStart()
        self._unreadable_logged: set[type] = set()  # kinds of unreadable pages logged

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = self._session_factory()
        try:
            cards = await self._served_models()
            served = list(cards)
            if self.model is None:
                self.model = self._model_among(served)
            elif self.model not in served:
                raise TerminalError(f"{self.base_url} does not serve {self.model!r}; it serves {served}")
            self.max_model_len = _max_model_len(cards[self.model])
            if self.sim_extensions is None:
                self.sim_extensions = await self._is_sim_server()
        except BaseException:
            await self.close()
            raise
        await self._scrape_logged()  # (one no parser expects failed the start)
        self._scrape_task = asyncio.create_task(self._scrape_forever(), name="vllm-scrape")
        logger.info("vLLM engine %s at %s (sim extensions: %s)", self.model, self.base_url,
                    self.sim_extensions)

    async def close(self) -> None:
        if self._scrape_task is not None:
            self._scrape_task.cancel()
            await asyncio.gather(self._scrape_task, return_exceptions=True)
        await self._cancel_streams()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ready(self) -> None:
        if self._session is None:
            raise RuntimeError("await engine.start() before adding requests")

    async def _served_models(self) -> dict[str, dict]:
        """The server's model cards by model id, once it answers (within ``connect_timeout_s``;
        the wait logged every ``_WAITING_LOGGED_EVERY_S``)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        logged = start - _WAITING_LOGGED_EVERY_S
        while True:
            try:
                async with self._session.get(f"{self.base_url}/v1/models",
                                             headers=self._auth) as resp:
                    if resp.status in (401, 403):  # (up, and refusing us: not loading)
                        raise TerminalError(self._refusal(resp.status, await resp.text()))
                    resp.raise_for_status()
                    return {m["id"]: m for m in (await resp.json())["data"]}
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                now = loop.time()
                if now - start > self.connect_timeout_s:
                    raise TerminalError(f"no vLLM server answers at {self.base_url}: {exc}") from None
                if now - logged >= _WAITING_LOGGED_EVERY_S:
                    logged = now
                    logger.warning("waiting for the vLLM server at %s (%.0f s of %.0f; a vLLM "
                                   "server refuses connections until its model is loaded): %s",
                                   self.base_url, now - start, self.connect_timeout_s, exc)
                await asyncio.sleep(0.2)

    def _model_among(self, served: list[str]) -> str:
        """The model to serve of those the server lists (several: ``--served-model-name`` of
        more than one name, LoRA adapters beside their base model): its worker's, else its
        only one. (Before, a server of several could not be served: the worker's ``--model``
        was not asked.)"""
        if self.worker_model in served:
            return self.worker_model
        if len(served) != 1:
            said = f", not {self.worker_model}" if self.worker_model else ""
            raise TerminalError(f"{self.base_url} serves {served}{said}: start the worker with "
                                "--model naming the one to serve")
        return served[0]

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _refusal(self, status: int, body: str) -> str:
        """Why a server refuses to list its models (401, 403): it wants its API key."""
        given = "; the one given was refused" if self.api_key else ""
        return (f"{self.base_url}/v1/models answered HTTP {status} (vllm serve --api-key: give "
                f"the worker the key in VLLM_API_KEY{given}): {_server_message(body)[:500]}")

    async def _is_sim_server(self) -> bool:
        try:
            async with self._session.get(f"{self.base_url}/version") as resp:
                version = await resp.json(content_type=None) if resp.status == 200 else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False
        return bool(isinstance(version, dict) and version.get("governor_sim"))

    # -- the Engine interface -------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The load the last scrape read; ``crashed``, none: a server that cannot be reached
        holds nothing its worker can count on (a dead vLLM's requests and cache went with it,
        as a simulated engine's that crashed), and the worker's own requests in flight there
        count as waiting until they are handed back. Its counters stay as counted. (Before,
        every heartbeat of a dead server carried the last load read, for as long as it stayed
        down: the streams counted its GPU busy.)"""
        scraped = self._scraped
        return self._in_flight_stats(_dead(scraped) if scraped.state == "crashed" else scraped)

    async def _run(self, stream: _Stream) -> None:
        req = stream.request
        body = {
            "model": self.model, "prompt": prompt_token_ids(req), "stream": True,
            "max_tokens": req.max_tokens - req.resume_from_token, "ignore_eos": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.sim_extensions:
            body["governor_token_offset"] = req.resume_from_token
        url = f"{self.base_url}/v1/completions"
        try:
            async with self._session.post(url, json=body, headers={
                    "X-Request-Id": req.request_id, **self._auth}) as resp:
                if resp.status != 200:
                    failure = http_failure(resp.status, await resp.text())
                    logger.warning("%s: %s (%s)", req.request_id, failure.detail, url)
                    stream.finish("error", failure)
                    return
                events = SseEvents()
                async for data in resp.content.iter_any():
                    for event in events.feed(data):
                        if not self._on_event(stream, event):
                            return
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            logger.warning("%s: %s", req.request_id, why)
            stream.cut(EngineFailure("retryable", f"the engine's server: {why}"))
            if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
                self._lost_contact()  # (a stream cut short: a payload error)
            return
        # (no [DONE]: the server closed the stream midway)
        stream.cut(EngineFailure("retryable", "the engine's server closed the stream"))

    @staticmethod
    def _on_event(stream: _Stream, event: bytes) -> bool:
        """Apply one server-sent event; False once the stream is over."""
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data:
            return True
        if data == b"[DONE]":
            stream.done_said()
            return False
        chunk = _json_object(data)
        if chunk is None:  # (mangled or cut by a proxy, a server in trouble: as a stream cut)
            stream.cut(EngineFailure("retryable", f"the engine's server sent an event that is "
                                                  f"no JSON object: {data[:200]!r}"))
            return False
        if "error" in chunk or chunk.get("object") == "error":
            error = chunk.get("error", chunk)
            code = error.get("code") if isinstance(error, dict) else None
            failure = stream_error_failure(code if type(code) is int else None, chunk,
                                           stream.received)
            logger.warning("%s: %s", stream.request.request_id, failure.detail)
            stream.cut(failure)  # (after its last chunk: every token came, it ends as it said)
            return False
        choices = chunk.get("choices") or []
        usage = chunk.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if type(cached) is int and cached >= 0:  # (vLLM: --enable-prompt-tokens-details)
            stream.cached = max(stream.cached, cached)
        ids = [t for c in choices for t in (c.get("token_ids") or [])]
        bad = [t for t in ids if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID]
        if bad:  # (in a chunk they failed the worker)
            stream.finish("error", EngineFailure(
                "engine_error", f"the engine's server sent invalid token ids: {bad[:5]!r}"[:500]))
            return False
        if ids:
            count = len(ids)
        elif type(usage.get("completion_tokens")) is int:
            count = max(usage["completion_tokens"] - stream.received, 0)
        else:
            count = sum(1 for c in choices if c.get("text"))  # one token a chunk, as vLLM streams
        # (no more than were asked for: past ``max_tokens`` no event of the request is valid)
        count = min(count, stream.asked - stream.received)
        ids = ids[:count]
        stream.receive(ids if len(ids) == count else None, count)
        reason = next((c["finish_reason"] for c in choices if c.get("finish_reason")), None)
        if reason is not None:
            # (not finished yet: vLLM sends the usage, with the prompt tokens its prefix cache
            # held, in a chunk of its own after this one, then [DONE])
            stream.ending = reason
        return True

    def _end_stalled(self) -> None:
        """A stream silent for ``stalled_after_s`` while the server holds no request at all is
        one the server dropped without closing its connection: it ends as an ``error`` (else it
        would hold the worker's commits for good), to continue elsewhere. A server holding any
        request is not judged: vLLM sends nothing before a long queue and prefill end."""
        if self._scraped.running or self._scraped.waiting:
            return
        now = asyncio.get_running_loop().time()
        for stream in self._streams.values():
            if not stream.done and now - stream.heard_s >= self.stalled_after_s:
                logger.warning("%s: nothing for %.0f s and the server holds no request: ended",
                               stream.request.request_id, now - stream.heard_s)
                if stream.task is not None:
                    stream.task.cancel()
                stream.cut(EngineFailure(
                    "retryable", f"the engine's server dropped the stream: nothing for "
                                 f"{now - stream.heard_s:.0f} s and it holds no request"))

    # -- load -----------------------------------------------------------------------------------
    async def _scrape_forever(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._scrape_now.wait(), self.scrape_interval_s)
            self._scrape_now.clear()
            await self._scrape_logged()

    async def _scrape_logged(self) -> None:
        """Scrape; an error no case below expects is logged, and the load is as the last scrape
        read it. (In the loop, it ended the loop unseen, and the heartbeats kept its last load
        for good.)"""
        try:
            await self._scrape()
        except Exception:
            logger.exception("scraping %s/metrics failed", self.base_url)

    def _lost_contact(self) -> None:
        """A request could not reach the server: as much a sign of a dead server as a failed
        scrape, and a scrape now tells one from a broken connection. (A dead server, reported
        only after three scrapes, was sent the worker's dispatches for 1.5 s.)"""
        self._failed_contacts += 1
        if self._failed_contacts >= _FAILED_CONTACTS_TO_CRASHED:
            self._scraped = replace(self._scraped, state="crashed")
        self._scrape_now.set()

    async def _scrape(self) -> None:
        try:
            async with self._session.get(f"{self.base_url}/metrics",
                                         timeout=aiohttp.ClientTimeout(total=5)) as resp:
                resp.raise_for_status()
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._failed_scrape(exc)
            return
        if self._failed_contacts >= _FAILED_CONTACTS_TO_CRASHED:
            logger.warning("%s answers again, after %d failed contacts in a row",
                           self.base_url, self._failed_contacts)
        self._failed_contacts = self._failed_scrapes = 0
        try:
            self._scraped = self._counts.count(stats_from_text(text))
        except (ValueError, OverflowError) as exc:
            self._unreadable(exc)
            return
        self._read = True
        self._end_stalled()

    def _failed_scrape(self, exc: BaseException) -> None:
        """A scrape that did not reach the server (or that it answered with an HTTP error)."""
        self._failed_contacts += 1
        self._failed_scrapes += 1
        if _worth_logging(self._failed_scrapes):
            logger.warning("scraping %s/metrics failed (%d contacts in a row, %d scrapes; "
                           "logged at the first %d scrapes, then at each doubling): %s",
                           self.base_url, self._failed_contacts, self._failed_scrapes,
                           _FAILED_CONTACTS_TO_CRASHED, exc)
        if self._failed_contacts >= _FAILED_CONTACTS_TO_CRASHED:
            self._scraped = replace(self._scraped, state="crashed")

    def _unreadable(self, exc: ValueError | OverflowError) -> None:
        """The server answered a ``/metrics`` page no parser reads (``+Inf`` or ``NaN``
        requests running, a line cut short): it is up, so its worker serves on with the load
        its last scrape read (``starting`` until one reads), the problem logged once for each
        kind of error. (A ``ValueError`` counted as a failed contact: three made it
        ``crashed``.)"""
        if self._scraped.state == "crashed":
            self._scraped = replace(self._scraped, state="warm" if self._read else "starting")
        if type(exc) not in self._unreadable_logged:
            self._unreadable_logged.add(type(exc))
            logger.warning("%s/metrics answered a page no parser reads (the load stays as the "
                           "last scrape read it; logged once for each kind, %s): %s",
                           self.base_url, type(exc).__name__, exc)
