"""A synthetic history as Kafka records: what the integration tests and the sink benchmark feed
the sink, with the rows each table must end up with.

Request ``i`` is ``10`` records: its InferenceRequest, a Dispatch, Queued, Started, FirstToken,
three ResponseChunks and Completed, plus a WorkerStatus heartbeat. Every 100th request adds a
KV event, a controller command, a config setting and a record no consumer can decode (which the
sink keeps as a ``dead_letters`` row).
"""

import asyncio
from collections import Counter
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from schemas import events
from schemas.codec import encode
from schemas.commands import SetLoadShedLevel
from schemas.config import ConfigSet
from schemas.requests import Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicCatalog


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes
    partition: int | None = None


def history(catalog: TopicCatalog, first: int, count: int, now_ms: int,
            prefix: str = "syn") -> tuple[list[Record], Counter]:
    """Records for requests ``first .. first+count-1``, and the rows each table should get."""
    records: list[Record] = []
    rows: Counter = Counter()

    def add(topic: str, key: str, message, table: str, partition: int | None = None) -> None:
        records.append(Record(topic, key.encode(), encode(message), partition))
        rows[table] += 1

    for i in range(first, first + count):
        rid, t = f"{prefix}-{i}", now_ms + i - first
        worker, tenant = f"worker-{i % 4}", f"tenant-{i % 3}"
        who = dict(event_time_ms=t, request_id=rid, tenant=tenant, task_id=f"task-{i // 2}",
                   created_ms=t)
        request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid,
                                   task_id=f"task-{i // 2}", step=i % 2 + 1, steps_total=2,
                                   tenant=tenant, prompt_tokens=100 + i % 50, max_tokens=3,
                                   deadline_ms=t + 60_000)
        add(catalog.requests, rid, request, "request_events")
        add(catalog.dispatch, rid, Dispatch(event_time_ms=t, request=request, worker_id=worker,
                                            slot=i % 4), "dispatches", partition=i % 4)
        add(catalog.telemetry, rid, events.Queued(**who, prompt_tokens=request.prompt_tokens,
                                                  max_tokens=3, step=request.step,
                                                  steps_total=request.steps_total,
                                                  deadline_ms=t + 60_000), "request_events")
        add(catalog.telemetry, rid, events.Started(**who, worker_id=worker), "request_events")
        add(catalog.telemetry, rid, events.FirstToken(**who, worker_id=worker, ttft_s=0.05),
            "request_events")
        for offset in range(3):
            add(catalog.responses, rid, ResponseChunk(
                event_time_ms=t, request_id=rid, worker_id=worker, token_offset=offset,
                tokens=[offset], final=offset == 2,
                finish_reason="length" if offset == 2 else None),
                "response_chunks")
        add(catalog.telemetry, rid, events.Completed(**who, worker_id=worker,
                                                     prompt_tokens=request.prompt_tokens,
                                                     output_tokens=3, e2e_s=0.2),
            "request_events")
        add(catalog.telemetry, worker, events.WorkerStatus(
            event_time_ms=t, worker_id=worker, slot=i % 4, pool="h100@llama-3-8b",
            gpu_type="h100", started_ms=now_ms - 1000, prefix_cache_queries=i,
            prefix_cache_hits=i // 2), "worker_status")
        if i % 100 == 0:
            add(catalog.kv, worker, events.KvBlocksStored(event_time_ms=t, worker_id=worker,
                                                          block_size=16, block_hashes=[i, i + 1]),
                "kv_events")
            add(catalog.control, "fleet", SetLoadShedLevel(
                event_time_ms=t, command_id=f"shed-{i}", issued_by="shedding", min_value=0.0,
                reason="pressure low"), "control_commands")
            add(catalog.config, "slo.ttft_slo_s", ConfigSet(event_time_ms=t, key="slo.ttft_slo_s",
                                                            value=1.0 + i / 1000), "config_changes")
            records.append(Record(catalog.signals, b"junk", b"\x00 not a record"))
            rows["dead_letters"] += 1
    return records, rows


async def produce(bootstrap: str, records: list[Record], window: int = 5_000) -> None:
    """Produce ``records`` in order and wait until the broker has every one."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    try:
        pending = []
        for record in records:
            pending.append(await producer.send(record.topic, record.value, key=record.key,
                                               partition=record.partition))
            if len(pending) >= window:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
