"""Version 1: the base tables, one row per Kafka record, plus the sink's journal and offsets.

A request's whole life is in ``request_events``: the client's InferenceRequest (``type =
'inference_request'``, also shown by the ``requests`` view), a cancellation, and every lifecycle
event. Every base table starts with the record's coordinates (``kafka_topic``, ``kafka_partition``,
``kafka_offset``): they are the event's identity. The engine is ReplacingMergeTree with the
coordinates at the end of the sorting key, so a record inserted twice collapses to one row and
``SELECT ... FINAL`` counts it once even if the sink's exactly-once protocol is bypassed (see
``analytics/sink.py``). Keys start with the hour, so parts written one after another barely
overlap and FINAL costs little. ``non_replicated_deduplication_window`` keeps the last inserts'
dedup tokens, which the sink uses to make a retried insert a no-op.

TTLs (history expires where keeping it has little value; change them with a new migration). TTLs
count from the event time, so a record already older than its table's TTL when it arrives (a
replayed old trace) is dropped as it is inserted:

| table            | TTL      | why                                                     |
|------------------|----------|---------------------------------------------------------|
| request_events   | 90 days  | billing and capacity questions look back a quarter      |
| dispatches       | 30 days  | placement debugging                                     |
| response_chunks  | 2 days   | per-chunk detail (no token ids); response_summaries lasts |
| worker_status    | 30 days  | heartbeats; the per-minute rollup lasts longer          |
| kv_events        | 7 days   | block churn; counts only, no block hashes               |
| signals          | 30 days  |                                                         |
| control_commands | 365 days | the audit trail of what the controllers did and why     |
| config_changes   | 365 days | settings made, and each component's applied / rejected  |
| dead_letters     | 30 days  | as long as the dead-letter topic keeps them             |
"""

_COORDINATES = """
    kafka_topic LowCardinality(String),
    kafka_partition UInt32,
    kafka_offset UInt64,
    time DateTime64(3),"""
_INGESTED = "ingested DateTime64(3) DEFAULT now64(3)"
_KEY_TAIL = "kafka_topic, kafka_partition, kafka_offset"
_SETTINGS = "SETTINGS non_replicated_deduplication_window = 1000"


def _table(name: str, columns: str, key: str, ttl_days: int,
           partition: str = "toYYYYMMDD(time)") -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {name} ({_COORDINATES}{columns}
    {_INGESTED}
) ENGINE = ReplacingMergeTree
PARTITION BY {partition}
ORDER BY (toStartOfHour(time), {key}, {_KEY_TAIL})
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
{_SETTINGS}"""


STATEMENTS = [
    _table("request_events", """
    type LowCardinality(String),
    request_id String,
    task_id String,
    tenant LowCardinality(String),
    model LowCardinality(String),
    worker_id LowCardinality(String),
    attempt UInt16,
    priority UInt8,
    step UInt32,
    steps_total UInt32,
    prompt_tokens UInt32,
    max_tokens UInt32,
    output_tokens UInt32,
    cached_tokens UInt32,
    tokens_done UInt32,
    ttft_s Nullable(Float64),
    e2e_s Nullable(Float64),
    created Nullable(DateTime64(3)),
    deadline Nullable(DateTime64(3)),
    reason LowCardinality(String),
    finish_reason LowCardinality(String),
    detail String,
    retry_after_s Nullable(Float64),
    ttft_slo_s Nullable(Float64),
    prefix_blocks UInt32,
    block_size UInt16,""", "tenant, type, request_id", 90),
    # What clients sent: their InferenceRequest records, which request_events holds as
    # ``type = 'inference_request'`` rows so that one table has a request's whole life.
    """
CREATE VIEW IF NOT EXISTS requests AS
SELECT kafka_topic, kafka_partition, kafka_offset, time, request_id, task_id, step, steps_total,
       tenant, priority, model, prompt_tokens, max_tokens, prefix_blocks, block_size, ttft_slo_s,
       deadline, created
FROM request_events
WHERE type = 'inference_request'""",
    _table("dispatches", """
    type LowCardinality(String),
    request_id String,
    task_id String,
    tenant LowCardinality(String),
    model LowCardinality(String),
    worker_id LowCardinality(String),
    slot UInt32,
    attempt UInt16,
    resume_from_token UInt32,
    router_id LowCardinality(String),""", "worker_id, request_id", 30),
    _table("response_chunks", """
    request_id String,
    worker_id LowCardinality(String),
    attempt UInt16,
    token_offset UInt32,
    tokens UInt32,
    text_chars UInt32,
    is_final UInt8,
    finish_reason LowCardinality(String),""", "request_id, token_offset", 2),
    _table("worker_status", """
    worker_id LowCardinality(String),
    slot UInt32,
    pool LowCardinality(String),
    gpu_type LowCardinality(String),
    models_loaded Array(LowCardinality(String)),
    state LowCardinality(String),
    kv_blocks_used UInt64,
    kv_blocks_free UInt64,
    running UInt32,
    waiting UInt32,
    prefix_cache_queries UInt64,
    prefix_cache_hits UInt64,
    preemptions UInt64,
    requests_completed UInt64,
    started DateTime64(3),""", "pool, worker_id, time", 30),
    _table("kv_events", """
    type LowCardinality(String),
    worker_id LowCardinality(String),
    block_size UInt16,
    blocks UInt32,""", "worker_id, type", 7),
    _table("signals", """
    scope LowCardinality(String),
    scope_key LowCardinality(String),
    window_s Float64,
    window_end DateTime64(3),
    signal_values Map(LowCardinality(String), Float64),""", "scope, scope_key", 30),
    _table("control_commands", """
    type LowCardinality(String),
    command_id String,
    issued_by LowCardinality(String),
    target LowCardinality(String),
    reason String,
    params String,""", "type", 365, partition="toYYYYMM(time)"),
    _table("config_changes", """
    type LowCardinality(String),
    setting LowCardinality(String),
    value String,
    set_by LowCardinality(String),
    component LowCardinality(String),
    config_offset Nullable(UInt64),
    reason String,""", "setting", 365, partition="toYYYYMM(time)"),
    _table("dead_letters", """
    source_topic LowCardinality(String),
    source_partition UInt32,
    source_offset UInt64,
    consumer LowCardinality(String),
    reason LowCardinality(String),
    error String,
    record_key String,
    raw_head String,
    raw_size UInt32,""", "source_topic, consumer", 30, partition="toYYYYMM(time)"),
    # The sink's journal: the Kafka ranges of the flush being written (see analytics/journal.py).
    """
CREATE TABLE IF NOT EXISTS sink_flushes (
    flush_id UInt64,
    ranges String,
    time DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree ORDER BY flush_id
TTL toDateTime(time) + INTERVAL 30 DAY""",
    # The next offset to read of every partition whose records are in the store. No TTL: a quiet
    # partition's mark must not expire, or its retained records would be read again.
    """
CREATE TABLE IF NOT EXISTS sink_offsets (
    kafka_topic LowCardinality(String),
    kafka_partition UInt32,
    next_offset UInt64,
    flush_id UInt64,
    time DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(next_offset) ORDER BY (kafka_topic, kafka_partition)""",
]
