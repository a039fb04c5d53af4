"""Every request that ends ends its response stream: a client reading only its reply topic
learns that its request was answered ("stop"/"length"), cancelled ("abort") or refused
("error"), each by a final chunk. Before 5 Dec only an answer (or an engine's error) ended
a stream: a client reading its stream waited for ever on a refusal or a cancel. A real router
and worker processes (``Stack``), the test the client."""

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from infra.bus import Outbox, create_topic, delete_topics, make_producer, now_ms
from infra.config_cli import set_setting
from infra.stack import PoolSpec, Stack
from schemas.codec import decode
from schemas.requests import CancelRequest, InferenceRequest, ResponseChunk

pytestmark = pytest.mark.integration


def _request(request_id: str, reply_to: str, max_tokens: int,
             model: str = "llama-3-8b") -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=request_id, model=model,
                            prompt_tokens=64, max_tokens=max_tokens, reply_to=reply_to)


async def _client(bootstrap: str, catalog, reply_to: str) -> dict[str, list[ResponseChunk]]:
    """Send three requests replying to ``reply_to``, cancel the long one once its first tokens
    came, and read the reply topic alone until every stream has its final chunk."""
    producer = make_producer(bootstrap)
    await producer.start()
    replies = AIOKafkaConsumer(reply_to, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await replies.start()
    outbox = Outbox(producer)
    streams: dict[str, list[ResponseChunk]] = {"answered": [], "cancelled": [], "refused": []}
    try:
        for request in (_request("answered", reply_to, 8),
                        _request("cancelled", reply_to, 100_000),
                        _request("refused", reply_to, 8, model="no-such-model")):
            outbox.emit(catalog.requests, request, request.request_id)
        await outbox.flush()
        cancelled = False
        async with asyncio.timeout(120):
            while not all(chunks and chunks[-1].final for chunks in streams.values()):
                for records in (await replies.getmany(timeout_ms=200)).values():
                    for record in records:
                        chunk = decode(catalog.spec(catalog.responses), record.value)
                        streams[chunk.request_id].append(chunk)
                if streams["cancelled"] and not cancelled:  # its first tokens came: cancel it
                    outbox.emit(catalog.requests, CancelRequest(
                        event_time_ms=now_ms(), request_id="cancelled", reason="user left"),
                        "cancelled")
                    await outbox.flush()
                    cancelled = True
    finally:
        await replies.stop()
        await producer.stop()
    return streams


def _with_stack(bootstrap: str, catalog, log_dir, workers: int, client):
    """What ``client(stack)`` returns, run beside a router and ``workers`` workers (speedup 20)."""
    stack = Stack(bootstrap, catalog.namespace, [PoolSpec("h100", workers)], log_dir, speedup=20)
    stack.start()
    try:
        return asyncio.run(client(stack))
    finally:
        stack.stop()


def test_every_request_that_ends_ends_its_stream(kafka_bootstrap, catalog, tmp_path):
    reply_to = f"{catalog.namespace}-client-{uuid.uuid4().hex[:6]}"
    asyncio.run(create_topic(kafka_bootstrap, reply_to))
    try:
        streams = _with_stack(kafka_bootstrap, catalog, tmp_path, 1,
                              lambda _: _client(kafka_bootstrap, catalog, reply_to))
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, [reply_to]))
    for name, chunks in streams.items():  # each ends once, its offsets with no gap
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True], name
        assert all(a.token_offset + len(a.tokens) == b.token_offset
                   for a, b in zip(chunks, chunks[1:])), name
    answered, cancelled, refused = (streams[n][-1] for n in ("answered", "cancelled", "refused"))
    assert answered.finish_reason in ("stop", "length") and answered.worker_id == "worker-0"
    assert (cancelled.finish_reason, cancelled.tokens, cancelled.worker_id) == (
        "abort", [], "worker-0")  # ended by the worker that ran it, after the tokens it sent
    assert 0 < cancelled.token_offset < 100_000
    assert (refused.finish_reason, refused.tokens, refused.token_offset) == ("error", [], 0)
    assert refused.worker_id.startswith("router") and len(streams["refused"]) == 1


async def _lost(bootstrap: str, catalog, stack: Stack) -> list[ResponseChunk]:
    """Send a long request, kill its worker once its first tokens came, and read its stream
    until its final chunk."""
    producer = make_producer(bootstrap)
    await producer.start()
    replies = AIOKafkaConsumer(catalog.responses, bootstrap_servers=bootstrap,
                               auto_offset_reset="earliest")
    await replies.start()
    chunks: list[ResponseChunk] = []
    try:
        outbox = Outbox(producer)
        t = now_ms()
        outbox.emit(catalog.requests, InferenceRequest(
            event_time_ms=t, created_ms=t, request_id="lost", prompt_tokens=64,
            max_tokens=100_000), "lost")
        await outbox.flush()
        async with asyncio.timeout(120):
            while not (chunks and chunks[-1].final):
                for records in (await replies.getmany(timeout_ms=200)).values():
                    chunks += [decode(catalog.spec(catalog.responses), r.value) for r in records]
                if chunks and stack.running(chunks[0].worker_id):  # ("worker-N", as named)
                    stack.kill(chunks[0].worker_id)
    finally:
        await replies.stop()
        await producer.stop()
    return chunks


def test_a_request_lost_with_its_worker_and_not_continued_ends_its_stream(kafka_bootstrap,
                                                                          catalog, tmp_path):
    """No retry left (a budget of 0): the router fails the request once its worker is silent
    rather than continue it on the other one, and ends its stream after the tokens it had
    read."""
    for key in ("retry_budget_ratio", "retry_budget_min_per_s"):
        asyncio.run(set_setting(kafka_bootstrap, catalog, key, 0.0))
    chunks = _with_stack(kafka_bootstrap, catalog, tmp_path, 2,
                         lambda stack: _lost(kafka_bootstrap, catalog, stack))
    *tokens, end = chunks
    assert tokens and not any(c.final for c in tokens)
    assert (end.finish_reason, end.tokens, end.worker_id) == ("error", [], "router-0")
    assert 0 < end.token_offset <= tokens[-1].token_offset + len(tokens[-1].tokens)
