"""A request the vLLM adapter has just finished (its ``[DONE]`` read, the worker not stepped
since: ``abort`` refuses it) ends as it finished (no broker: a stand-in vLLM server, and the
worker over a partition given as a list of records)."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from aiohttp import web

from infra.bus import Outbox
from schemas.codec import decode
from schemas.topics import TopicCatalog
from tests.http_stand_ins import serving, vllm_app
from tests.unit.workers.fake_producer import AckingProducer
from tests.unit.workers.test_worker_drained import ME, _dispatch, _Partition
from workers.service import WorkerService
from workers.vllm_engine import VllmHttpEngine


async def _answer(request: web.Request) -> web.StreamResponse:
    """Two tokens, the finish reason with the last, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i, reason in ((0, None), (1, "length")):
        choice = {"index": 0, "text": f" t{i}", "token_ids": [100 + i], "finish_reason": reason}
        await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


@contextlib.asynccontextmanager
async def _just_finished(**options) -> AsyncIterator[WorkerService]:
    """A worker (``options``) on a vLLM server that has just answered its request ``r1`` (two
    tokens, from its partition's offset 0): the adapter holds the finished stream, the worker
    has not stepped since."""
    async with serving(vllm_app(_answer)) as url:
        engine = VllmHttpEngine(url, sim_extensions=False, connect_timeout_s=5)
        await engine.start()
        try:
            worker = WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine, **options)
            worker.dispatch, worker.partition = _Partition([]), 0
            worker.producer = AckingProducer()
            worker.outbox = Outbox(worker.producer)
            worker._on_dispatch(_dispatch("r1", 2), 0)
            async with asyncio.timeout(10):
                while not engine._streams["r1"].done:
                    await asyncio.sleep(0.01)
            yield worker
        finally:
            await engine.close()


def _sent(worker: WorkerService) -> list:
    c = worker.catalog
    return [decode(c.spec(topic if topic in c.topics() else c.responses), value)
            for topic, value in worker.producer.sent]


def test_a_stopping_worker_ends_a_request_its_engine_has_just_finished_not_hands_it_back():
    """A stop whose drain ended just after the request's ``[DONE]`` came handed it back (the
    adapter's refusal to abort it unheard), its last tokens unsent, to be generated again
    elsewhere; or, its tokens all sent, completed by the router. Now it ends as usual."""
    async def scenario() -> list:
        async with _just_finished(drain_timeout_s=0) as worker:  # (the drain ends at once)
            await worker._drain_then_hand_back(worker.dispatch)
            await worker._last_flushes()
        return _sent(worker)

    messages = asyncio.run(scenario())
    assert [m.type for m in messages if m.type in ("requeued", "completed")] == ["completed"]
    [end] = [m for m in messages if m.type == "chunk" and m.final]
    assert (end.token_offset + len(end.tokens), end.finish_reason) == (2, "length")


def test_a_request_superseded_as_its_engine_finished_it_sends_no_end_of_its_own():
    """The router, hearing nothing from the worker, continued the request elsewhere (or ended it
    itself) and superseded the attempt here just as its engine finished it: a second end, now
    or from the continuation, would break the invariant, as for one whose end is not sent yet
    (``_drop_end``). Before, the supersede went unheard (``abort`` refused the finished
    request) and the attempt completed: the router then cancelled its continuation, whose
    chunks a client may have read already (a reader drops the older attempt's final chunk
    after them): the stream never ended."""
    from schemas.requests import CancelRequest

    async def scenario() -> WorkerService:
        async with _just_finished() as worker:
            worker._on_dispatch(CancelRequest(
                event_time_ms=0, request_id="r1", attempt=1,
                reason="superseded: its worker went silent"), 1)
            worker._step()
            for _ in range(2):  # its chunks, then what would be its end
                await worker._flush_and_commit()
        return worker

    worker = asyncio.run(scenario())
    assert not [m for m in _sent(worker) if m.type in ("completed", "failed", "requeued")]
    assert worker._running == {} and worker.dispatch.commits[-1] == 2  # done with, both


def test_a_request_continued_here_as_its_engine_finished_it_still_ends():
    """The router continued the request on this same worker (no other could take it): the
    continuation, read while the finished attempt is still the worker's, is not started, so
    the finished attempt ends it, as an earlier attempt that completed (the router then drops
    the continuation)."""
    from schemas.requests import CancelRequest

    async def scenario() -> WorkerService:
        async with _just_finished() as worker:
            worker._on_dispatch(CancelRequest(
                event_time_ms=0, request_id="r1", attempt=1,
                reason="superseded: its worker did not answer a recall"), 1)
            worker._on_dispatch(_dispatch("r1", 2).model_copy(update={"attempt": 2}), 2)
            worker._step()
            for _ in range(2):
                await worker._flush_and_commit()
        return worker

    ends = [m for m in _sent(asyncio.run(scenario())) if m.type == "completed"]
    assert [(m.request_id, m.attempt) for m in ends] == [("r1", 1)]
