"""A command the worker's engine cannot carry out is refused, not fatal: dead-lettered with why
(no broker: the worker's handler of commands, on a simulated engine and on the fixed-rate
one)."""

import pytest

from schemas import commands
from schemas.topics import TopicCatalog
from workers.fixed_rate import FixedRateEngine
from workers.service import WorkerIdentity, WorkerService
from workers.sim.engine import SimEngine, SimEngineConfig
from workers.sim.perf import PerfModel

T = 1_800_000_000_000
ME = WorkerIdentity(0, "worker-0", "h100@llama-3-8b", "h100", "llama-3-8b")


def _worker(engine) -> WorkerService:
    return WorkerService("127.0.0.1:1", TopicCatalog("unit"), ME, engine)


def _load(model: str, worker_id: str = "worker-0") -> commands.LoadModel:
    return commands.LoadModel(event_time_ms=T, command_id="c", worker_id=worker_id, model=model)


def test_loading_an_unknown_model_keeps_the_worker_serving_its_own() -> None:
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    unknown = worker._on_command(_load("no-such-model"))
    too_big = worker._on_command(_load("llama-2-70b"))  # does not fit on one H100
    assert worker.models == ["llama-3-8b"]
    assert unknown.startswith("cannot load no-such-model: unknown model 'no-such-model'; known: ")
    assert too_big.startswith("cannot load llama-2-70b: ")
    assert worker._on_command(_load("no-such-model", "worker-1")) is None  # another's


def test_a_fault_the_engine_cannot_inject_is_refused() -> None:
    worker = _worker(FixedRateEngine(decode_tokens_per_s=10))
    why = worker._on_command(commands.InjectFault(event_time_ms=T, command_id="c",
                                                  worker_id="worker-0", fault="slow", factor=5.0))
    assert not hasattr(worker.engine, "slow_down")  # nothing to call, and no exception
    assert why == "cannot inject slow: its engine has no such fault"


class _Control:
    """The control topic's reader as ``_obey`` uses it: a fetch of ``records``, the dead
    letters it is asked to send kept."""

    def __init__(self, *messages) -> None:
        from types import SimpleNamespace

        from infra.bus import Decoded

        self.consumer = SimpleNamespace(assignment=lambda: set())
        self.items = [Decoded(SimpleNamespace(offset=n), m) for n, m in enumerate(messages)]
        self.letters: list = []

    async def fetch(self, timeout_ms: int) -> list:
        items, self.items = self.items, []
        return items

    async def dead_letter(self, bad) -> None:
        self.letters += [(record.offset, exc.reason, exc.detail) for record, exc in bad]

    def take_dead_lettered(self) -> list:
        return []


def test_a_model_the_worker_cannot_load_is_dead_lettered_with_why(monkeypatch) -> None:
    """Before 7 Dec the worker only logged it: `governor report actions` showed the command as
    if it had held."""
    import asyncio

    import workers.service

    async def nothing_added(consumer, heard=None) -> None:
        return None

    monkeypatch.setattr(workers.service, "take_on_added", nothing_added)
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    control = _Control(_load("no-such-model"), _load("llama-2-7b"), _load("x", "worker-1"))
    asyncio.run(worker._obey(control))
    [(offset, reason, detail)] = control.letters
    assert (offset, reason) == (0, "unprocessable")
    assert detail.startswith("worker worker-0 cannot load no-such-model: unknown model "), detail
    assert worker.models == ["llama-2-7b"]


def test_a_finished_dispatch_is_superseded_on_its_slot_even_when_it_is_the_lowest_open_one():
    """Its commit comes after the flush of its terminal event: a crash in between would have the
    next worker on the slot read it again and run it a second time, but for this."""
    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.requests import CancelRequest

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.outbox = Outbox(producer=None)
    worker._taken[7] = ("r1", 2)
    worker._offsets.taken(7)
    worker._finish(7)
    ((topic, value, _key, partition),) = worker.outbox._queue
    cancel = decode(worker.catalog.spec(topic), value)
    assert topic == worker.catalog.dispatch and partition == ME.slot
    assert isinstance(cancel, CancelRequest) and (cancel.request_id, cancel.attempt) == ("r1", 2)
    assert cancel.reason.startswith("superseded:")


class _Producer:
    """The producer's side the outbox uses: every send acknowledged, or failed with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def send(self, topic, value, key=None, partition=None):
        import asyncio

        ack = asyncio.get_running_loop().create_future()
        if self.error is None:
            ack.set_result(None)
        else:
            ack.set_exception(self.error)
        return ack


class _Partition:
    def __init__(self) -> None:
        self.commits: list[int] = []

    async def commit(self, offsets) -> None:
        self.commits += offsets.values()


def test_a_dispatch_whose_terminal_events_were_not_delivered_is_not_committed() -> None:
    """A flush the broker refuses (the outbox does not send its messages again) leaves the
    dispatches it would have finished uncommitted, also for the commit after the next flush (the
    stopping worker's last): after a restart they run again rather than never end."""
    import asyncio

    import pytest
    from aiokafka import TopicPartition
    from aiokafka.errors import KafkaTimeoutError

    from infra.bus import Outbox, Undelivered

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch = _Partition()
    worker.outbox = Outbox(_Producer(KafkaTimeoutError("no acknowledgement")))
    worker._offsets.taken(7)
    worker._taken[7] = ("r1", 1)
    worker._finish(7)  # its supersede (and, live, its Completed) queued with the flush that fails
    with pytest.raises(Undelivered):
        asyncio.run(worker._flush_and_commit())
    worker.outbox = Outbox(_Producer())  # the broker is back for the stopping worker's status
    asyncio.run(worker._flush_and_commit())
    assert worker.dispatch.commits == [7]  # not 8: dispatch 7 is read again after a restart


def test_a_heartbeat_counts_a_reply_to_stream_as_far_as_a_flush_the_broker_took() -> None:
    """A chunk to a client's own topic and the heartbeat go to different topics: the heartbeat
    tells how far the stream went as of the last flush taken in full, not the chunks emitted
    since (a crash before they are taken would have the continuation skip them)."""
    import asyncio

    from aiokafka import TopicPartition

    from infra.bus import Outbox
    from schemas.requests import Dispatch, InferenceRequest
    from workers.engine import TokenBatch
    from workers.service import _Running

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch = _Partition()
    worker.outbox = Outbox(_Producer())
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r1", prompt_tokens=16,
                               max_tokens=100, reply_to="client-7.replies")
    worker._running["r1"] = _Running(Dispatch(event_time_ms=T, request=request,
                                              worker_id="worker-0", slot=0), 3, 0)

    def sent() -> int:
        (progress,) = worker._status().reply_progress
        return progress.tokens_sent

    worker._on_tokens(TokenBatch(request_id="r1", token_offset=0, tokens=tuple(range(10)),
                                 first=True, finished=False, time_s=1.0))
    assert sent() == 0  # emitted, not flushed
    asyncio.run(worker._flush_and_commit())
    assert sent() == 10


def test_a_recalled_request_is_handed_back_as_far_as_a_flush_the_broker_took() -> None:
    """Chunks emitted since the last flush may never reach the client (a crash before the
    broker takes them): the hand-back's offset is the flushed one, and the continuation's chunks
    replace the old attempt's from there."""
    import asyncio

    from aiokafka import TopicPartition

    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.events import Requeued
    from schemas.requests import CancelRequest, Dispatch, InferenceRequest
    from workers.engine import EngineRequest, TokenBatch
    from workers.service import _Running

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch = _Partition()
    worker.outbox = Outbox(_Producer())
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r1", prompt_tokens=16,
                               max_tokens=100)
    worker.engine.add(EngineRequest("r1", 16, 100), 0.0)
    worker._running["r1"] = _Running(Dispatch(event_time_ms=T, request=request,
                                              worker_id="worker-0", slot=0), 3, 0)
    worker._taken[3] = ("r1", 1)
    worker._offsets.taken(3)
    for offset, flush in ((0, True), (10, False)):
        worker._on_tokens(TokenBatch(request_id="r1", token_offset=offset,
                                     tokens=tuple(range(offset, offset + 10)),
                                     first=offset == 0, finished=False, time_s=1.0))
        if flush:
            asyncio.run(worker._flush_and_commit())
    worker._on_dispatch(CancelRequest(event_time_ms=T, request_id="r1", attempt=1,
                                      reason="recalled: overdue"), 4)
    (requeued,) = [m for topic, value, _, _ in worker.outbox._queue
                   if isinstance(m := decode(worker.catalog.spec(topic), value), Requeued)]
    assert requeued.tokens_done == 10  # 20 emitted, 10 taken by the broker


def _ended(worker) -> list[tuple[str, object]]:
    """The final chunks and terminal events the worker queued: (topic, message)."""
    from schemas.codec import decode

    c = worker.catalog
    sent = [(topic, decode(c.spec(topic if topic in c.topics() else c.responses), value))
            for topic, value, _, _ in worker.outbox._queue]  # (a reply topic: as responses)
    return [(topic, m) for topic, m in sent
            if getattr(m, "final", False) or m.type in ("cancelled", "failed", "completed")]


def test_a_clients_cancel_ends_the_stream_after_the_tokens_sent() -> None:
    """Before 5 Dec a cancelled request's stream had no final chunk: a client reading only its
    stream waited for ever."""
    from aiokafka import TopicPartition

    from infra.bus import Outbox
    from schemas.requests import CancelRequest, Dispatch, InferenceRequest
    from workers.engine import EngineRequest, TokenBatch
    from workers.service import _Running

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch, worker.outbox = _Partition(), Outbox(_Producer())
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r1", prompt_tokens=16,
                               max_tokens=100, reply_to="client-7.replies")
    worker.engine.add(EngineRequest("r1", 16, 100), 0.0)
    worker._running["r1"] = _Running(Dispatch(event_time_ms=T, request=request,
                                              worker_id="worker-0", slot=0, attempt=2), 3, 0)
    worker._taken[3] = ("r1", 2)
    worker._offsets.taken(3)
    worker._on_tokens(TokenBatch(request_id="r1", token_offset=0, tokens=tuple(range(12)),
                                 first=True, finished=False, time_s=1.0))
    worker._on_dispatch(CancelRequest(event_time_ms=T, request_id="r1", reason="user left"), 4)
    (stream, end), (telemetry, cancelled) = _ended(worker)
    assert (stream, end.token_offset, end.tokens, end.finish_reason, end.attempt) == (
        "client-7.replies", 12, [], "abort", 2)
    assert (telemetry, cancelled.type) == (worker.catalog.telemetry, "cancelled")
    assert (cancelled.worker_id, cancelled.attempt) == ("worker-0", 2)  # (the attempt it ends)


def test_a_dispatch_its_engine_cannot_hold_fails_and_ends_its_stream() -> None:
    from infra.bus import Outbox
    from schemas.requests import Dispatch, InferenceRequest

    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    worker.outbox = Outbox(_Producer())
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="huge",
                               prompt_tokens=1_000_000, max_tokens=10)
    worker._on_dispatch(Dispatch(event_time_ms=T, request=request, worker_id="worker-0",
                                 slot=0, attempt=3), 5)
    (stream, end), (_, failed) = _ended(worker)
    assert (stream, end.token_offset, end.finish_reason) == (worker.catalog.responses, 0, "error")
    assert (failed.type, failed.reason, failed.attempt) == ("failed", "invalid_request", 3)
    assert "maximum context length is 131072 tokens" in failed.detail


def test_a_model_loaded_gets_a_cache_of_its_own_size_and_its_own_pool() -> None:
    """Another model's weights and per-token KV leave another number of blocks in the same
    memory: the cache kept the first model's size (28,262 blocks for Llama-2-7B on an H100,
    where 7,416 fit), so the router placed work on memory that was not there; and the worker
    went on reporting its old pool, which the autoscaler and the breakers group it by."""
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    assert worker._status().max_model_len == 131_072
    worker._on_command(commands.LoadModel(event_time_ms=T, command_id="c", worker_id="worker-0",
                                          model="llama-2-7b"))
    fresh = SimEngine(PerfModel.load("h100", "llama-2-7b"), SimEngineConfig()).stats()
    status = worker._status()
    assert worker.models == ["llama-2-7b"] and status.models_loaded == ["llama-2-7b"]
    assert status.max_model_len == 4_096  # the context of the model it serves now
    assert status.kv_blocks_used + status.kv_blocks_free == fresh.kv_blocks_free
    assert fresh.kv_blocks_free != SimEngine(PerfModel.load("h100", "llama-3-8b"),
                                             SimEngineConfig()).stats().kv_blocks_free
    assert status.pool == "h100@llama-2-7b"
    worker.metrics.observe_stats(worker.engine.stats())
    for name in ("vllm:num_requests_running", "vllm:iteration_tokens_total_count"):
        exported = {s.labels.get("model_name") for m in worker.metrics.registry.collect()
                    for s in m.samples if s.name == name}
        assert exported == {"llama-2-7b"}, name


def test_a_drain_hands_back_what_still_runs_at_its_deadline() -> None:
    """``DrainWorker.deadline_ms`` was never read: a long request kept a drained worker busy for
    as long as it ran."""
    from infra.bus import Outbox
    from infra.bus import now_ms as wall_ms
    from schemas.codec import decode
    from schemas.events import Requeued
    from schemas.requests import Dispatch, InferenceRequest
    from workers.engine import EngineRequest
    from workers.service import _Running

    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    worker.outbox = Outbox(producer=None)
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="long",
                               prompt_tokens=500, max_tokens=20_000)
    worker._taken[3] = ("long", 1)
    worker._offsets.taken(3)
    worker.engine.add(EngineRequest("long", 500, 20_000), worker.engine_now())
    worker._running["long"] = _Running(
        Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0), 3, 0)
    worker._on_command(commands.DrainWorker(event_time_ms=T, command_id="c", worker_id="worker-0",
                                            deadline_ms=wall_ms() + 60_000))
    worker._keep_drain_deadline()
    assert worker.mode == "draining" and list(worker._running) == ["long"]  # not yet
    worker._drain_deadline_ms = wall_ms() - 1  # the minute has passed
    worker._keep_drain_deadline()
    assert worker._running == {} and worker.mode == "draining"
    sent = [decode(worker.catalog.spec(topic), value) for topic, value, _, _ in worker.outbox._queue]
    [back] = [m for m in sent if isinstance(m, Requeued)]
    assert back.request_id == "long" and "drain deadline" in back.detail


def test_kv_events_give_the_tokens_each_hash_stands_for() -> None:
    """Mooncake's hashes stand for 512 tokens each; the events said 16 (the engine's block), so
    the analytics counted a 32nd of the tokens cached."""
    from infra.bus import Outbox
    from schemas.codec import decode
    from workers.engine import EngineRequest

    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    worker.outbox = Outbox(producer=None)
    worker.engine.add(EngineRequest("r", 1_100, 4, prefix_hashes=(11, 12), hash_block_size=512),
                      worker.engine_now())
    worker.engine.advance(worker.engine_now() + 60)
    worker._emit_kv(*worker.engine.drain_kv_events())
    [event] = [decode(worker.catalog.spec(topic), value)
               for topic, value, _, _ in worker.outbox._queue]
    assert (event.block_size, event.block_hashes) == (512, [11, 12])


class _Refusing(_Producer):
    """Sends to ``topic`` (of the message ``key`` only, if given) fail with ``error``; the rest
    are acknowledged and kept."""

    def __init__(self, topic: str, error: Exception, key: str | None = None) -> None:
        super().__init__()
        self.topic, self.refusal, self.key, self.taken = topic, error, key, []

    async def send(self, topic, value, key=None, partition=None):
        refused = topic == self.topic and self.key in (None, key.decode() if key else None)
        self.error = self.refusal if refused else None
        ack = await super().send(topic, value, key, partition)
        if self.error is None:
            self.taken.append((topic, value))
        return ack


def test_a_request_ends_on_the_broker_only_after_its_last_chunks() -> None:
    """Its last chunks, its supersede and its Completed went in one flush, to three topics: the
    broker could take the last two and not the first, and the client's stream kept a gap that no
    continuation would fill (the request was over, and its dispatch superseded)."""
    import asyncio

    import pytest
    from aiokafka.errors import KafkaTimeoutError

    from infra.bus import Undelivered

    worker = _finishing_worker(_Refusing("unit.responses", KafkaTimeoutError()))
    with pytest.raises(Undelivered):
        asyncio.run(worker._flush_and_commit())
    assert "completed" not in _types(worker) and "cancel_request" not in _types(worker)

    worker = _finishing_worker(_Refusing("no-such-topic", KafkaTimeoutError()))
    asyncio.run(worker._flush_and_commit())
    assert "chunk" in _types(worker) and "completed" not in _types(worker)
    assert worker.dispatch.commits == [3]  # not past the dispatch before its end is out
    asyncio.run(worker._flush_and_commit())
    assert _types(worker)[-2:] == ["cancel_request", "completed"]
    assert worker.dispatch.commits == [3, 4]


def test_a_request_whose_last_chunks_its_reply_topic_refused_fails() -> None:
    """It had ended (its Completed waiting for the flush of its last chunks), but those never
    reached the client: it fails as the running ones replying there do."""
    import asyncio

    from aiokafka.errors import MessageSizeTooLargeError

    from schemas.codec import decode

    class Exists:
        async def exist(self, topic, fresh=False):
            return True

    producer = _Refusing("client-7.replies", MessageSizeTooLargeError())
    worker = _finishing_worker(producer, reply_to="client-7.replies")
    worker.producer, worker._reply_topics = producer, Exists()
    asyncio.run(worker._flush_and_commit())
    asyncio.run(worker._flush_and_commit())
    ended = [m for m in (decode(worker.catalog.spec(t), v) for t, v in producer.taken)
             if m.type in ("completed", "failed")]
    assert [(m.type, m.reason) for m in ended] == [("failed", "invalid_request")]
    assert "refused this worker's writes" in ended[0].detail


def test_only_the_requests_whose_records_a_reply_topic_refused_fail() -> None:
    """A topic's size limit refuses some records, not all: a request whose whole stream got
    through completes, though another replying there failed (both failed before)."""
    import asyncio

    from aiokafka.errors import MessageSizeTooLargeError

    from schemas.codec import decode
    from schemas.requests import Dispatch, InferenceRequest
    from workers.engine import TokenBatch
    from workers.service import _Running

    class Exists:
        async def exist(self, topic, fresh=False):
            return True

    producer = _Refusing("client-7.replies", MessageSizeTooLargeError(), key="r2")
    worker = _finishing_worker(producer, reply_to="client-7.replies")  # r1, ending
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r2", prompt_tokens=16,
                               max_tokens=100, reply_to="client-7.replies")
    worker._taken[4] = ("r2", 1)
    worker._offsets.taken(4)
    worker._running["r2"] = _Running(Dispatch(event_time_ms=T, request=request,
                                              worker_id="worker-0", slot=0), 4, 0)
    worker._on_tokens(TokenBatch(request_id="r2", token_offset=0, tokens=tuple(range(10)),
                                 first=True, finished=False, time_s=1.0))
    worker.producer, worker._reply_topics = producer, Exists()
    asyncio.run(worker._flush_and_commit())
    asyncio.run(worker._flush_and_commit())
    ended = {m.request_id: m.type for m in (decode(worker.catalog.spec(t), v)
                                            for t, v in producer.taken if t.startswith("unit."))
             if m.type in ("completed", "failed")}
    assert ended == {"r1": "completed", "r2": "failed"}


def _finishing_worker(producer, reply_to: str | None = None) -> WorkerService:
    """A worker whose one request (r1, dispatch offset 3) has just produced its last tokens."""
    from aiokafka import TopicPartition

    from infra.bus import Outbox
    from schemas.requests import Dispatch, InferenceRequest
    from workers.engine import TokenBatch
    from workers.service import _Running

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch, worker.outbox = _Partition(), Outbox(producer)
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r1",
                               prompt_tokens=16, max_tokens=10, reply_to=reply_to)
    worker._taken[3] = ("r1", 1)
    worker._offsets.taken(3)
    worker._running["r1"] = _Running(Dispatch(event_time_ms=T, request=request,
                                              worker_id="worker-0", slot=0), 3, 0)
    worker._on_tokens(TokenBatch(request_id="r1", token_offset=0, tokens=tuple(range(10)),
                                 first=True, finished=True, time_s=1.0, finish_reason="length"))
    return worker


def _types(worker) -> list[str]:
    """The types of the messages the worker's producer had acknowledged."""
    from schemas.codec import decode

    return [decode(worker.catalog.spec(t), v).type for t, v in worker.outbox.producer.taken]


def test_a_worker_says_it_stopped_even_when_a_last_flush_fails() -> None:
    """Its ends go out before its "stopped" status; a flush of them refused (the broker down for
    a moment) used to leave the status unsent, and the router to learn of the stop by silence."""
    import asyncio

    import pytest
    from aiokafka import TopicPartition
    from aiokafka.errors import KafkaTimeoutError

    from infra.bus import Outbox, Undelivered
    from schemas.codec import decode

    class FirstRefused(_Producer):
        def __init__(self) -> None:
            super().__init__()
            self.taken = []

        async def send(self, topic, value, key=None, partition=None):
            self.error = KafkaTimeoutError() if not hasattr(self, "refused_one") else None
            self.refused_one = True
            ack = await super().send(topic, value, key, partition)
            if self.error is None:
                self.taken.append((topic, value))
            return ack

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    producer = FirstRefused()
    worker.dispatch, worker.outbox = _Partition(), Outbox(producer)
    worker._emit(worker.catalog.telemetry, worker._status(), ME.worker_id)  # refused
    with pytest.raises(Undelivered):
        asyncio.run(worker._last_flushes())
    states = [decode(worker.catalog.spec(t), v).state for t, v in producer.taken]
    assert states == ["stopped"]


@pytest.mark.parametrize("reply_to", ["dispatch", "other.control", "__consumer_offsets"])
def test_a_dispatch_replying_to_an_internal_topic_fails_unstarted(reply_to: str) -> None:
    """The router refuses such a request; a dispatch that names one was put on the slot by
    something else, and its chunks would have gone among the internal records: of this
    namespace's dispatch topic, and until 6 Dec of another namespace's control topic or of a
    Kafka's ``__`` topic too."""
    import asyncio

    from aiokafka import TopicPartition

    from infra.bus import Outbox
    from schemas.codec import decode
    from schemas.requests import Dispatch, InferenceRequest

    class _Taking(_Producer):
        taken: list = []

        async def send(self, topic, value, key=None, partition=None):
            self.taken.append((topic, value))
            return await super().send(topic, value, key, partition)

    worker = _worker(FixedRateEngine(decode_tokens_per_s=100))
    worker.partition = TopicPartition(worker.catalog.dispatch, ME.slot)
    worker.dispatch = _Partition()
    worker.outbox = Outbox(_Taking())
    request = InferenceRequest(event_time_ms=T, created_ms=T, request_id="r1", prompt_tokens=16,
                               max_tokens=4, reply_to=worker.catalog.name(reply_to) if reply_to == "dispatch"
                               else reply_to)
    worker._on_dispatch(Dispatch(event_time_ms=T, request=request, worker_id="worker-0", slot=0),
                        5)
    asyncio.run(worker._flush_and_commit())
    assert "r1" not in worker._running
    sent = [decode(worker.catalog.spec(t), v) for t, v in worker.outbox.producer.taken]
    (failed,) = [m for m in sent if m.type in ("started", "failed")]
    assert (failed.type, failed.reason) == ("failed", "invalid_request")
    assert failed.detail.startswith(f"reply_to {request.reply_to!r} is an internal topic")
    assert not [m for m in sent if m.type == "chunk"]  # (its slot gets the worker's supersede)


_DECLARED = {"mine-13b": {"params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40,
                          "head_dim": 128, "hidden_size": 5120, "intermediate_size": 13824,
                          "vocab_size": 32000}}


@pytest.fixture
def declared_models(monkeypatch):
    """The configuration in force, as the worker reads it (``current_config``), declaring
    ``mine-13b``: how often it was read is kept; the models declared are forgotten after."""
    import workers.service
    from schemas.config import GovernorConfig
    from workers.sim import models

    async def nothing_added(consumer, heard=None) -> None:
        return None

    reads: list[str] = []

    async def current_config(bootstrap, catalog, refuse=True):
        reads.append(catalog.namespace)
        return GovernorConfig.model_validate({"models": _DECLARED})

    monkeypatch.setattr(workers.service, "take_on_added", nothing_added)
    monkeypatch.setattr(workers.service, "current_config", current_config,
                        raising=False)  # (a worker of before 7 Dec read no configuration)
    yield reads
    models.configure_models({})


def test_a_worker_of_a_built_in_model_loads_a_model_the_configuration_declares(declared_models):
    """Started with a built-in model it never read the setting ``models``: a ``load_model`` of
    a declared model, which ``governor command`` lets pass, was dead-lettered as unknown (until
    7 Dec). It reads the configuration again first, once for a fetch of such commands."""
    import asyncio

    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    control = _Control(_load("mine-13b"), _load("llama-3-8b"), _load("mine-13b"))
    asyncio.run(worker._obey(control))
    assert control.letters == []
    assert worker.models == ["mine-13b"] and worker.engine.perf.model.name == "mine-13b"
    assert declared_models == ["unit"]


def test_a_worker_reads_the_configuration_for_an_unknown_model_at_most_every_few_seconds(
        declared_models, monkeypatch) -> None:
    """A stream of ``load_model`` commands naming models nobody declared does not hold up its
    serving loop with a read of the configuration each: one every ``REREAD_MODELS_S``."""
    import asyncio

    import workers.service

    clock = [1_000.0]
    monkeypatch.setattr(workers.service.time, "monotonic", lambda: clock[0])
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    for _ in range(3):
        asyncio.run(worker._obey(_Control(_load("no-such-model"))))
    clock[0] += getattr(workers.service, "REREAD_MODELS_S", 10.0)
    control = _Control(_load("no-such-model"))
    asyncio.run(worker._obey(control))
    assert declared_models == ["unit", "unit"]
    assert [reason for _, reason, _ in control.letters] == ["unprocessable"]


def test_a_configuration_that_does_not_answer_in_time_leaves_the_model_unknown(
        declared_models, monkeypatch) -> None:
    """The serving loop waits for the read at most ``READ_MODELS_S``: then the command is
    refused as it would be without it."""
    import asyncio

    import workers.service

    async def never(bootstrap, catalog, refuse=True):
        await asyncio.Event().wait()

    monkeypatch.setattr(workers.service, "current_config", never)
    monkeypatch.setattr(workers.service, "READ_MODELS_S", 0.05, raising=False)
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    control = _Control(_load("mine-13b"))
    asyncio.run(asyncio.wait_for(worker._obey(control), 5))
    [(_, reason, detail)] = control.letters
    assert reason == "unprocessable" and "unknown model 'mine-13b'" in detail, detail
    assert worker.models == ["llama-3-8b"]


def test_a_built_in_model_named_in_another_letter_case_is_refused() -> None:
    """Loaded as ``Llama-2-7B`` (models are looked up in any case), the worker reported a model
    no request names: requests are matched to a worker by their model's exact name."""
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    why = worker._on_command(_load("Llama-2-7B"))
    assert why == ("cannot load Llama-2-7B: model 'Llama-2-7B' is named 'llama-2-7b': a pool "
                   "serves the requests that name its model exactly")
    assert worker.models == ["llama-3-8b"] and worker.me.pool == "h100@llama-3-8b"


def test_a_model_declared_just_after_a_read_for_another_is_read_for_at_once(
        declared_models, monkeypatch) -> None:
    """An operator's ``load_model`` of a misspelt model (the worker reads the configuration for
    it, in vain), then the model declared and ``load_model`` of it within ``REREAD_MODELS_S``:
    the second, which ``governor command`` let pass, was refused as unknown, dead-lettered. Only
    a model the last read did not find waits for the next; its reads stay bounded."""
    import asyncio

    import workers.service
    from schemas.config import GovernorConfig

    declared: dict = {}

    async def current_config(bootstrap, catalog, refuse=True):
        declared_models.append(catalog.namespace)
        return GovernorConfig.model_validate({"models": declared})

    monkeypatch.setattr(workers.service, "current_config", current_config)
    monkeypatch.setattr(workers.service.time, "monotonic", lambda: 1_000.0)  # (time stands still)
    worker = _worker(SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig()))
    typo = _Control(_load("mine-31b"))
    asyncio.run(worker._obey(typo))
    declared.update(_DECLARED)
    control = _Control(_load("mine-31b"), _load("mine-13b"))
    asyncio.run(worker._obey(control))
    assert [detail.split(":")[0] for _, _, detail in typo.letters + control.letters] == [
        "worker worker-0 cannot load mine-31b"] * 2
    assert worker.models == ["mine-13b"] and declared_models == ["unit", "unit"]
    asyncio.run(worker._obey(_Control(_load("mine-31b"))))  # (the typo again: no read)
    assert declared_models == ["unit", "unit"]


@pytest.mark.parametrize("command, said", [
    (commands.DrainWorker(event_time_ms=T, command_id="c", worker_id="worker-0"), "draining"),
    (commands.SleepWorker(event_time_ms=T, command_id="c", worker_id="worker-0", level=1),
     "sleeping"),
])
def test_a_worker_told_to_drain_or_sleep_while_its_engine_loads_says_so(command, said) -> None:
    """Before, its heartbeats said ``loading`` until its engine was warm: the autoscaler, which
    counts every worker alive and not ``draining`` as serving its pool, counted it."""
    engine = SimEngine(PerfModel.load("h100", "llama-3-8b"), SimEngineConfig(), warm=False)
    worker = _worker(engine)
    assert worker._status().state == "loading"
    assert worker._on_command(command) is None
    assert engine.stats().state == "loading"
    assert worker._status().state == said
    engine.crashed = True  # (a crash is still told: the router resumes its requests elsewhere)
    assert worker._status().state == "crashed"
