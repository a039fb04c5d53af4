"""A worker writes every record of a request's stream, its chunks and its end, to the partition
the router pinned the stream to (``Dispatch.stream_partition``; no broker). Left to their key,
they went where it hashed among the partitions the worker's producer knew: once it learned of
a partition added to the topic, the rest of the stream went to another partition than its
start."""

import pytest

from infra.bus import Outbox, StreamPartition
from schemas.requests import CancelRequest, Dispatch, InferenceRequest
from schemas.topics import TopicCatalog
from workers.engine import TokenBatch
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService

CATALOG = TopicCatalog("unit")
ME = WorkerIdentity(0, "w0", "h100@llama-3-8b", "h100", "llama-3-8b")


@pytest.mark.parametrize("reply_to", [None, "client-7.replies"])
@pytest.mark.parametrize("pinned", [3, None])
def test_a_streams_chunks_and_end_go_to_its_pinned_partition(reply_to, pinned) -> None:
    worker = WorkerService("127.0.0.1:1", CATALOG, ME, FixedRateEngine())
    worker.outbox = Outbox(producer=None)  # nothing is flushed here: only what is queued
    request = InferenceRequest(event_time_ms=1, created_ms=1, request_id="r1", prompt_tokens=8,
                               max_tokens=64, reply_to=reply_to)
    worker._on_dispatch(Dispatch(event_time_ms=1, request=request, worker_id="w0", slot=0,
                                 attempt=2, resume_from_token=4, stream_partition=pinned), 0)
    worker._on_tokens(TokenBatch("r1", 4, (7, 8), first=True, finished=False))
    worker._on_cancel(CancelRequest(event_time_ms=2, request_id="r1", reason="user left"))
    stream = [(key, partition) for topic, _, key, partition in worker.outbox._queue
              if topic == (reply_to or CATALOG.responses)]
    assert stream == [(b"r1", pinned)] * 2  # its chunk, then its end
    # (a pin its topic lacks, written by hand, is left to the key rather than stop the worker)
    assert all(isinstance(p, StreamPartition) for _, p in stream) == (pinned is not None)
