"""Version 2: rollups kept up to date by materialized views as rows are inserted.

A materialized view sees each inserted block once; the sink's insert dedup tokens (propagated to
the views with ``deduplicate_blocks_in_dependent_materialized_views``) make a retried insert a
no-op here too, so the rollups count each record once. Read them with ``GROUP BY`` over their key
and the ``-Merge`` / plain aggregate of each column: background merges are eventual.

- ``request_minute`` (400 days): per minute, tenant, model and event type: events, tokens, TTFT and
  end-to-end latency t-digests.
- ``request_outcomes`` (90 days): one row per request (after merges; read it with ``FINAL`` or
  group by ``request_key``): what the client asked for and what became of it, with ``events`` a
  bit set of the kinds of record seen (``SENT`` ... ``CANCELLED`` below), and ``task_key`` a
  64-bit hash of its task id (0 when it has none: then the request is its own task). The reports read it
  instead of the raw events (the audit, which counts events, reads those). Keyed by a 64-bit hash
  of the request id (cheaper to merge than the id) and not partitioned: an insert writes one part
  (a part per partition would multiply the sink's insert cost), and ``FINAL`` splits its work by
  key range.
- ``response_summaries`` (90 days): per request: chunks, tokens, how far the stream got, how it
  ended. Outlives ``response_chunks`` (2 days): no table keeps individual tokens.
- ``worker_minute`` (400 days): per minute and worker: heartbeats, peak KV use, queue, cumulative
  prefix-cache counters.
- ``kv_minute`` (90 days): per minute, worker and kind: KV block events and blocks.
"""

_SETTINGS = "SETTINGS non_replicated_deduplication_window = 1000"

#: Bits of ``request_outcomes.events``: which kinds of record a request has.
SENT, QUEUED, COMPLETED, FAILED, REJECTED, CANCELLED = 1, 2, 4, 8, 16, 32
_EVENT_BITS = (f"type = 'inference_request', {SENT}, type = 'queued', {QUEUED}, "
               f"type = 'completed', {COMPLETED}, "
               f"type = 'failed', {FAILED}, type = 'rejected', {REJECTED}, "
               f"type = 'cancelled', {CANCELLED}, 0")
_TERMINAL = "('completed', 'failed', 'rejected', 'cancelled')"
_DIGEST = "quantilesTDigest(0.5, 0.9, 0.99)"
_DIGEST_STATE = "quantilesTDigestState(0.5, 0.9, 0.99)"

#: The view that keeps ``request_outcomes``; version 3 recreates it with one more column.
REQUEST_OUTCOMES_VIEW = f"""
CREATE MATERIALIZED VIEW IF NOT EXISTS request_outcomes_mv TO request_outcomes AS
SELECT cityHash64(request_events.request_id) AS request_key,
       any(request_events.request_id) AS request_id,
       anyLast(tenant) AS tenant, anyLast(model) AS model, max(task_id) AS task_id,
       maxIf(cityHash64(request_events.task_id), request_events.task_id != '') AS task_key,
       max(priority) AS priority, max(step) AS step, max(steps_total) AS steps_total,
       max(ttft_slo_s) AS ttft_slo_s, min(time) AS first_seen,
       groupBitOr(multiIf({_EVENT_BITS})) AS events,
       max(deadline) AS deadline,
       minIf(toNullable(time), type = 'started') AS started_at,
       maxIf(toNullable(time), type IN {_TERMINAL}) AS finished_at,
       maxIf(reason, type IN ('failed', 'rejected')) AS reason,
       maxIf(worker_id, type = 'completed') AS worker_id,
       max(request_events.worker_id) AS last_worker_id,
       min(ttft_s) AS ttft_s, max(e2e_s) AS e2e_s,
       max(prompt_tokens) AS prompt_tokens, max(output_tokens) AS output_tokens,
       max(cached_tokens) AS cached_tokens
FROM request_events
WHERE type != 'cancel_request'
GROUP BY request_key"""

STATEMENTS = [
    f"""
CREATE TABLE IF NOT EXISTS request_minute (
    minute DateTime,
    tenant LowCardinality(String),
    model LowCardinality(String),
    type LowCardinality(String),
    events SimpleAggregateFunction(sum, UInt64),
    prompt_tokens SimpleAggregateFunction(sum, UInt64),
    output_tokens SimpleAggregateFunction(sum, UInt64),
    cached_tokens SimpleAggregateFunction(sum, UInt64),
    ttft_digest AggregateFunction({_DIGEST}, Nullable(Float64)),
    e2e_digest AggregateFunction({_DIGEST}, Nullable(Float64))
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, tenant, model, type)
TTL minute + INTERVAL 400 DAY
{_SETTINGS}""",
    f"""
CREATE MATERIALIZED VIEW IF NOT EXISTS request_minute_mv TO request_minute AS
SELECT toStartOfMinute(time) AS minute, tenant, model, type,
       count() AS events,
       sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens,
       sum(cached_tokens) AS cached_tokens,
       {_DIGEST_STATE}(ttft_s) AS ttft_digest,
       {_DIGEST_STATE}(e2e_s) AS e2e_digest
FROM request_events
GROUP BY minute, tenant, model, type""",
    f"""
CREATE TABLE IF NOT EXISTS request_outcomes (
    request_key UInt64,
    request_id SimpleAggregateFunction(any, String),
    tenant SimpleAggregateFunction(anyLast, LowCardinality(String)),
    model SimpleAggregateFunction(anyLast, LowCardinality(String)),
    task_id SimpleAggregateFunction(max, String),
    task_key SimpleAggregateFunction(max, UInt64),
    priority SimpleAggregateFunction(max, UInt8),
    step SimpleAggregateFunction(max, UInt32),
    steps_total SimpleAggregateFunction(max, UInt32),
    ttft_slo_s SimpleAggregateFunction(max, Nullable(Float64)),
    first_seen SimpleAggregateFunction(min, DateTime64(3)),
    events SimpleAggregateFunction(groupBitOr, UInt8),
    deadline SimpleAggregateFunction(max, Nullable(DateTime64(3))),
    started_at SimpleAggregateFunction(min, Nullable(DateTime64(3))),
    finished_at SimpleAggregateFunction(max, Nullable(DateTime64(3))),
    reason SimpleAggregateFunction(max, LowCardinality(String)),
    worker_id SimpleAggregateFunction(max, LowCardinality(String)),
    last_worker_id SimpleAggregateFunction(max, LowCardinality(String)),
    ttft_s SimpleAggregateFunction(min, Nullable(Float64)),
    e2e_s SimpleAggregateFunction(max, Nullable(Float64)),
    prompt_tokens SimpleAggregateFunction(max, UInt32),
    output_tokens SimpleAggregateFunction(max, UInt32),
    cached_tokens SimpleAggregateFunction(max, UInt32)
) ENGINE = AggregatingMergeTree
ORDER BY request_key
TTL toDateTime(first_seen) + INTERVAL 90 DAY
{_SETTINGS}""",
    REQUEST_OUTCOMES_VIEW,
    f"""
CREATE TABLE IF NOT EXISTS response_summaries (
    request_id String,
    chunks SimpleAggregateFunction(sum, UInt64),
    tokens_sent SimpleAggregateFunction(sum, UInt64),
    tokens_end SimpleAggregateFunction(max, UInt32),
    attempts SimpleAggregateFunction(max, UInt16),
    first_chunk SimpleAggregateFunction(min, DateTime64(3)),
    last_chunk SimpleAggregateFunction(max, DateTime64(3)),
    final SimpleAggregateFunction(max, UInt8),
    finish_reason SimpleAggregateFunction(max, LowCardinality(String))
) ENGINE = AggregatingMergeTree
ORDER BY request_id
TTL toDateTime(first_chunk) + INTERVAL 90 DAY
{_SETTINGS}""",
    """
CREATE MATERIALIZED VIEW IF NOT EXISTS response_summaries_mv TO response_summaries AS
SELECT request_id, count() AS chunks, sum(tokens) AS tokens_sent,
       max(token_offset + tokens) AS tokens_end, max(attempt) AS attempts,
       min(time) AS first_chunk, max(time) AS last_chunk, max(is_final) AS final,
       maxIf(finish_reason, is_final = 1) AS finish_reason
FROM response_chunks
GROUP BY request_id""",
    f"""
CREATE TABLE IF NOT EXISTS worker_minute (
    minute DateTime,
    pool LowCardinality(String),
    gpu_type LowCardinality(String),
    worker_id LowCardinality(String),
    heartbeats SimpleAggregateFunction(sum, UInt64),
    busy_heartbeats SimpleAggregateFunction(sum, UInt64),
    first_seen SimpleAggregateFunction(min, DateTime64(3)),
    last_seen SimpleAggregateFunction(max, DateTime64(3)),
    kv_blocks_used_max SimpleAggregateFunction(max, UInt64),
    kv_blocks_total_max SimpleAggregateFunction(max, UInt64),
    running_max SimpleAggregateFunction(max, UInt32),
    waiting_max SimpleAggregateFunction(max, UInt32),
    prefix_cache_queries SimpleAggregateFunction(max, UInt64),
    prefix_cache_hits SimpleAggregateFunction(max, UInt64),
    requests_completed SimpleAggregateFunction(max, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, pool, gpu_type, worker_id)
TTL minute + INTERVAL 400 DAY
{_SETTINGS}""",
    """
CREATE MATERIALIZED VIEW IF NOT EXISTS worker_minute_mv TO worker_minute AS
SELECT toStartOfMinute(time) AS minute, pool, gpu_type, worker_id,
       count() AS heartbeats, countIf(running > 0) AS busy_heartbeats,
       min(time) AS first_seen, max(time) AS last_seen,
       max(kv_blocks_used) AS kv_blocks_used_max,
       max(kv_blocks_used + kv_blocks_free) AS kv_blocks_total_max,
       max(running) AS running_max, max(waiting) AS waiting_max,
       max(prefix_cache_queries) AS prefix_cache_queries,
       max(prefix_cache_hits) AS prefix_cache_hits,
       max(requests_completed) AS requests_completed
FROM worker_status
GROUP BY minute, pool, gpu_type, worker_id""",
    f"""
CREATE TABLE IF NOT EXISTS kv_minute (
    minute DateTime,
    worker_id LowCardinality(String),
    type LowCardinality(String),
    events SimpleAggregateFunction(sum, UInt64),
    blocks SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, worker_id, type)
TTL minute + INTERVAL 90 DAY
{_SETTINGS}""",
    """
CREATE MATERIALIZED VIEW IF NOT EXISTS kv_minute_mv TO kv_minute AS
SELECT toStartOfMinute(time) AS minute, worker_id, type, count() AS events, sum(blocks) AS blocks
FROM kv_events
GROUP BY minute, worker_id, type""",
]
