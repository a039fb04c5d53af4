"""Cost per successful task by tenant, model, pool and day.

The method (all of it in the SQL below, so anyone can check it against the tables):

1. **GPU time provisioned.** Each worker's heartbeats (``worker_status``, about every 0.5 s) are
   sorted per worker incarnation (``worker_id``, ``started``); each heartbeat in a state other
   than ``stopped`` counts the time until the next one of its incarnation, capped at the
   heartbeat timeout (3 s): a silence costs at most 3 s, a worker's last heartbeat before it
   crashed nothing (its restart is another incarnation), as the streams' spend counts it
   (``streams/signals/workers.py``; ``tests/unit/analytics/test_silence_cost.py``), and a
   silence across midnight counts in each day for its part of it. Only the part of each such
   interval inside the window counts, so that adjacent windows add up to the window of both
   (``test_adjacent_windows_cost.py``): the heartbeats of the 3 s before the window are read
   for the stretch from its start to a worker's first heartbeat in it, and a worker's last
   heartbeat before the window's end counts up to the end if the worker was heard after it
   (before 7 Dec both stretches cost nothing). Each second counts once per
   GPU of the worker (``gpus``: four for a worker serving with tensor parallelism over four;
   one for a heartbeat that says none, as before schema version 13). Summed per day and pool:
   GPU-seconds. Idle, warming, draining, sleeping and crashed GPUs (a worker up whose engine
   stopped answering holds its GPU) cost the same as busy ones, as in the streams' spend; before
   6 Dec ``crashed`` heartbeats cost nothing here.
2. **Price.** GPU-seconds × the pool's GPU price per hour / 3600. Prices are
   ``schemas.config.DEFAULT_GPU_PRICES_USD_PER_HOUR`` overlaid with the latest
   ``gpu_prices_usd_per_hour`` settings on ``governor.config`` (``config_settings``: each
   setting's latest value, kept however long ago it was made, as the compacted topic keeps it);
   the latest price applies to the whole window. A GPU type without a price costs 0 (its hours
   still show).
3. **Attribution.** A pool-day's cost is shared among the requests that ran on it that day, in
   proportion to their GPU time that day, attempt by attempt: an attempt (a ``Started``: its
   attempt and worker) runs from its start to its own end, its ``Requeued`` or ``Completed``,
   or a ``Failed`` or ``Cancelled`` that names it (schema version 15; a router's names no
   worker, and ends the attempt on whichever worker ran it); where it has none, to the
   request's first terminal event that names no attempt (from a writer older than 7 Dec); and
   where there is none either, it runs on, as an attempt in flight does (below). So a replaced
   attempt's late failure ends no other attempt: before version 15 the request's first failure
   or cancellation ended the attempt running, and cut a continuation short at a replaced
   attempt's failure (rows written before it still end so). An attempt is cut at the
   start of a later attempt (a replaced attempt that completes late stretches nothing), in the
   pool its worker was in when it started (a worker id used again for another pool, as the
   local supervisor's slot names are, counts in each pool for its own time), and in each day
   it spans for its time in it. The time a request waits between attempts is nobody's. A
   request sent up to ``TASK_LOOKBACK_DAYS`` before the window pays for its time in the window
   and counts nowhere (before 6 Dec the pool's other requests paid for it). A request with no
   terminal event yet (a replaced attempt's failure is none: ``analytics/outcomes.py``) is
   charged the same way, its running attempt up to its worker's last
   heartbeat, and counts nowhere: its time shows in the pool-day's row of tenant
   ``(in flight)`` (before 6 Dec requests without an end were left out, and the requests that
   finished on the pool that day paid for their time). Rows
   written before schema version 10 have no attempts: their time runs from their first
   ``Started`` to their last terminal event, where they ended. A request counts where it
   ended: on the worker that completed it (of its newest completing attempt if two did), or
   else the worker of its latest attempt, in the pool that worker was in when the request
   ended. Failed, late and retried work is paid for, like idle time; a pool-day that served
   no request shows as tenant ``(unattributed)``. A pool-day whose requests took no GPU time
   there (attempts handed back as they started) is shared by the requests counted there, and
   where none is, equally among its rows (before 6 Dec: 0 / 0, a NaN cost).
4. **Successful tasks.** A task succeeds when each of its steps has a request that completed by
   its deadline (a task id is its tenant's own). A task is in the window when its latest
   request is, and its steps sent up to ``TASK_LOOKBACK_DAYS`` (1) before the window count too
   (``analytics/outcomes.py``). Each successful task counts once, in the row of
   its final step's successful request (that request's tenant, model, pool and the day it
   started, the day a request is counted on; the first of them by request key if the final
   step was sent twice), so the column sums to the number of successful tasks.

``cost_per_successful_task_usd`` = cost / successful tasks of the row (empty where none).
"""

from typing import Any

from analytics.migrations.m015_named_attempt_ends import NEVER_MS
from analytics.outcomes import (FINAL_SETTINGS, NO_WORKER_KEY, TASK_IN_WINDOW, TASK_STEPS_CTE,
                                WORKER_INCARNATIONS_CTE, WINDOW_START, config_in_force,
                                settings_sql)
from analytics.window import UNTIL, in_window
from schemas.config import GovernorConfig

HEARTBEAT_GAP_CAP_MS = int(GovernorConfig().worker_heartbeat_timeout_s * 1000)
#: The tenant of the row of a pool-day that charges the time of the requests still running.
IN_FLIGHT = "(in flight)"

PRICE_SETTINGS_SQL = settings_sql("gpu_prices_usd_per_hour")
#: Heartbeats are read from the heartbeat timeout before the window: the silence after the last
#: of them, up to the next heartbeat or the cap, may reach into the window.
LEAD_IN_START = f"{WINDOW_START} - toIntervalMillisecond({{gap_cap_ms:UInt64}})"

COST_SQL = f"""
WITH {TASK_STEPS_CTE.strip()},
{WORKER_INCARNATIONS_CTE.strip()},
pool_cost AS (
    SELECT day, pool, sum(gpu_s) AS pool_gpu_s,
           sum(gpu_s * mapFromArrays({{price_gpus:Array(String)}},
                                     {{price_usd:Array(Float64)}})[gpu_type]) / 3600
               AS pool_cost_usd
    FROM (
        -- An incarnation-day's own gaps, and the silence from its last heartbeat to the first
        -- of its next day (capped, if that heartbeat was live), clipped to the window and
        -- split at midnight: its part after midnight is the next day's (before 6 Dec a silence
        -- across midnight cost nothing here, while the streams counted it). The heartbeats of
        -- the cap before the window (lead_in) count their silence's part in it only; the last
        -- before the window's end counts up to the end if its incarnation was heard after it
        -- (heard_later): a worker's last heartbeat ever costs nothing (before 7 Dec both
        -- stretches cost nothing, so two adjacent windows cost less than the window of both).
        SELECT pool, gpu_type, part.1 AS day, part.2 * gpus AS gpu_s
        FROM (
            SELECT pool, gpu_type, gpus, beat_day, lead_in,
                   if(lead_in, 0, in_day_s) AS in_window_s,
                   greatest(last_ms, toUnixTimestamp64Milli({WINDOW_START})) AS from_ms,
                   if(last_live, multiIf(next_first_ms > 0, least(next_first_ms - last_ms,
                                                                  {{gap_cap_ms:UInt64}}),
                                         heard_later, {{gap_cap_ms:UInt64}}, 0), 0)
                       AS silence_ms,
                   greatest(0, least(last_ms + silence_ms, toUnixTimestamp64Milli({UNTIL}))
                               - from_ms) AS in_window_silence_ms,
                   addDays(toDate('1970-01-01'), intDiv(from_ms, 86400000)) AS from_day,
                   least(in_window_silence_ms, (intDiv(from_ms, 86400000) + 1) * 86400000
                                               - from_ms) AS before_midnight_ms
            FROM (
                SELECT *, leadInFrame(first_ms, 1, toInt64(0)) OVER (
                              PARTITION BY worker_id, started ORDER BY first_ms
                              ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_first_ms
                FROM (
                    SELECT worker_id, started, toDate(time) AS beat_day,
                           time < {WINDOW_START} AS lead_in, any(pool) AS pool,
                           any(gpu_type) AS gpu_type, max(gpus) AS gpus,
                           -- each heartbeat as one number, time * 2 + live: sorting plain
                           -- numbers is fast
                           arraySort(groupArray(toUnixTimestamp64Milli(time) * 2
                                                + (state != 'stopped'))) AS beats,
                           arraySum((gap, live) -> if(live, least(gap, {{gap_cap_ms:UInt64}}), 0),
                                    arrayPopFront(arrayDifference(arrayMap(b -> intDiv(b, 2),
                                                                           beats))),
                                    arrayPopBack(arrayMap(b -> b % 2 = 1, beats))) / 1000
                               AS in_day_s,
                           intDiv(beats[1], 2) AS first_ms, intDiv(beats[-1], 2) AS last_ms,
                           beats[-1] % 2 = 1 AS last_live,
                           (worker_id, started) IN (SELECT worker_id, started FROM worker_status
                                                    WHERE time >= {UNTIL}) AS heard_later
                    -- no FINAL needed: a heartbeat stored twice adds a gap of 0
                    FROM worker_status
                    WHERE {in_window("time", LEAD_IN_START)}
                    GROUP BY worker_id, started, beat_day, lead_in)))
        ARRAY JOIN [(from_day, in_window_s + before_midnight_ms / 1000),
                    (addDays(from_day, 1), (in_window_silence_ms - before_midnight_ms) / 1000)]
                   AS part
        WHERE part.2 > 0 OR (part.1 = beat_day AND NOT lead_in))
    GROUP BY day, pool),
succeeded_tasks AS (
    -- each with the one request it is counted on (its final step may have been sent twice)
    SELECT task_key, minIf(request_key, outcome = 'ok' AND step = steps_total) AS counted_on
    FROM task_steps GROUP BY task_key
    HAVING {TASK_IN_WINDOW} AND max(steps_total) > 0
       AND length(groupUniqArrayIf(step, outcome = 'ok')) = max(steps_total)),
ran AS (
    -- Each request that ran as entries: a worker, when its incarnation is looked up (its pool)
    -- and a time from start_ms to end_ms. The first counts the request and its task where it
    -- ended (ran_on_key, looked up at its end, as RAN_ON_POOL); the others are its attempts
    -- (attempt_starts), each on its worker, looked up at its start, from its start to its own
    -- end (a requeued, completed, failed or cancelled of that attempt and worker, or of that
    -- attempt naming no worker: a router's; or else the request's first terminal event that
    -- names no attempt, first_unnamed_end_ms, where there is one; rows written before schema
    -- version 15 have 0 there: their first terminal event), cut at the start of a later
    -- attempt: a replaced attempt that completes late stretches nothing. A request whose one
    -- attempt ran where it ended is one entry (looked up at its end, as before), which counts
    -- it and has the attempt's time; one written before schema version 10 has no attempts:
    -- one entry, its time from its first start to its last terminal event, as before. (Times
    -- in ms; {NEVER_MS}: none.) Requests sent up to a day before the window are read too
    -- (task_steps), and counted nowhere: their time in the window is theirs, not the pool's
    -- other requests' (before 6 Dec a request running across the window's start left all
    -- of its time there to them). A request with no terminal event yet (finished = 0) is its
    -- attempts alone, counted nowhere: the one running ends at NEVER_MS here, at its worker's
    -- last heartbeat in by_pool, and its time is the row of tenant IN_FLIGHT's.
    SELECT tenant, model, finished, finished AND n = 1 AS counted, in_window, counts_task,
           alone OR NOT finished OR (n > 1 AND NOT empty(starts)) AS timed,
           if(counted, ran_on_key, bitAnd(s.1, 0xFFFFFFFFFFFF)) AS worker_key,
           if(counted, assumeNotNull(finished_at),
              toDateTime64(fromUnixTimestamp64Milli(s.2), 3)) AS at,
           if(timed, s.2, toUnixTimestamp64Milli(assumeNotNull(started_at))) AS start_ms,
           multiIf(timed, least(
                       arrayMin(arrayPushBack(arrayMap(x -> x.2, arrayFilter(
                           x -> bitShiftRight(x.1, 48) > bitShiftRight(s.1, 48)
                                OR (bitShiftRight(x.1, 48) = bitShiftRight(s.1, 48)
                                    AND x.2 > s.2), starts)), {NEVER_MS})),
                       if(own_end_ms < {NEVER_MS}, own_end_ms, first_end_ms)),
                   empty(starts), toUnixTimestamp64Milli(assumeNotNull(finished_at)),
                   start_ms) AS end_ms,
           arrayMin(arrayPushBack(arrayMap(x -> x.2, arrayFilter(
               x -> (x.1 = s.1 OR x.1 = bitAnd(s.1, 0xFFFF000000000000) + {NO_WORKER_KEY})
                    AND x.2 >= s.2, attempt_ends)), {NEVER_MS})) AS own_end_ms
    FROM (
        SELECT tenant, model, ran_on_key, started_at, finished_at, attempt_ends,
               -- (a replaced attempt's failure ends no request: outcomes.py)
               outcome != 'unfinished' AS finished,
               multiIf(NOT finished, {NEVER_MS}, first_unnamed_end_ms > 0, first_unnamed_end_ms,
                       toUnixTimestamp64Milli(ifNull(first_finished_at,
                                                     assumeNotNull(finished_at))))
                   AS first_end_ms,
               -- (a start stored twice is one; a request in flight written before schema
               -- version 10: its first start, on the worker it runs on)
               if(finished OR NOT empty(attempt_starts), arrayDistinct(attempt_starts),
                  [(ran_on_key, toUnixTimestamp64Milli(assumeNotNull(started_at)))]) AS starts,
               finished AND length(starts) = 1
                   AND bitAnd(starts[1].1, 0xFFFFFFFFFFFF) = ran_on_key AS alone,
               seen_at >= {WINDOW_START} AS in_window,
               in_window AND outcome = 'ok' AND step = steps_total
                   AND (task_key, request_key) IN succeeded_tasks AS counts_task
        FROM task_steps
        WHERE started_at IS NOT NULL AND ran_on_key != 0)
    ARRAY JOIN if(alone OR NOT finished, starts,
                  arrayPushFront(starts, (toUInt64(0), toInt64(0)))) AS s,
               arrayEnumerate(if(alone OR NOT finished, starts,
                                 arrayPushFront(starts, (0, 0)))) AS n
    WHERE in_window OR end_ms > toUnixTimestamp64Milli({WINDOW_START})),
by_pool AS (
    -- Requests that ran, summed where they ran: a request, and a successful task, counts on
    -- the day it started; its time, attempt by attempt, in each day it spans (the end is
    -- exclusive: an attempt that ends at midnight takes none of the next day); in the window
    -- only (a request sent before it counts nowhere, and its time there only is charged; one
    -- running at its end is charged up to the end).
    SELECT addDays(toDate('1970-01-01'), day_n) AS day, wi.pool AS pool,
           if(r.finished, r.tenant, '{IN_FLIGHT}') AS tenant, if(r.finished, r.model, '') AS model,
           countIf(r.counted AND r.in_window AND day_n = first_day) AS n_requests,
           sum(greatest(0, least(end_at, (day_n + 1) * 86400000,
                                 toUnixTimestamp64Milli({UNTIL}))
                           - greatest(r.start_ms, day_n * 86400000,
                                      toUnixTimestamp64Milli({WINDOW_START})))) / 1000 AS busy_s,
           countIf(r.counted AND day_n = first_day AND r.counts_task) AS n_tasks
    FROM ran AS r ASOF INNER JOIN worker_incarnations AS wi
        ON r.worker_key = wi.worker_key AND r.at >= wi.started
    ARRAY JOIN range(intDiv(r.start_ms, 86400000) AS first_day,
                     greatest(intDiv((if(r.end_ms < {NEVER_MS}, r.end_ms,
                                         greatest(r.start_ms, toUnixTimestamp64Milli(wi.last_beat)))
                                      AS end_at) - 1, 86400000), first_day) + 1) AS day_n
    WHERE day_n >= intDiv(toUnixTimestamp64Milli({WINDOW_START}), 86400000)
      AND day_n * 86400000 < toUnixTimestamp64Milli({UNTIL})
    GROUP BY day, pool, tenant, model),
attributed AS (
    -- Nullable, so that a pool-day none of them ran on (the FULL JOIN below) has NULLs here
    SELECT toNullable(day) AS day, toNullable(pool) AS pool, toNullable(tenant) AS tenant,
           model, n_requests, n_tasks,
           -- (by busy time; where none, by requests; where none counted either, equally:
           -- before 6 Dec 0 / 0, a NaN cost)
           toNullable(multiIf(sum(busy_s) OVER w > 0, busy_s / sum(busy_s) OVER w,
                              sum(n_requests) OVER w > 0, n_requests / sum(n_requests) OVER w,
                              1 / count() OVER w)) AS share
    FROM by_pool
    WINDOW w AS (PARTITION BY by_pool.day, by_pool.pool))
SELECT ifNull(a.day, pc.day) AS day, ifNull(a.tenant, '(unattributed)') AS tenant,
       ifNull(a.model, '') AS model, ifNull(a.pool, pc.pool) AS pool,
       ifNull(a.n_requests, 0) AS requests, round(ifNull(a.n_tasks, 0), 3) AS successful_tasks,
       round(ifNull(a.share, 1), 4) AS pool_share,
       round(ifNull(a.share, 1) * ifNull(pc.pool_gpu_s, 0) / 3600, 4) AS gpu_hours,
       round(ifNull(a.share, 1) * ifNull(pc.pool_cost_usd, 0), 6) AS cost_usd,
       if(successful_tasks > 0, round(cost_usd / successful_tasks, 6), NULL)
           AS cost_per_successful_task_usd
FROM attributed AS a FULL OUTER JOIN pool_cost AS pc ON a.day = pc.day AND a.pool = pc.pool
ORDER BY day, tenant, model, pool
{FINAL_SETTINGS}"""


def gpu_prices(settings_rows: list[list[Any]]) -> dict[str, float]:
    """The prices in force after the price settings (rows of ``PRICE_SETTINGS_SQL``: each
    setting's latest value, in the order they were made), as ``config_in_force`` applies them."""
    return dict(config_in_force(settings_rows).gpu_prices_usd_per_hour)


def cost_parameters(settings_rows: list[list[Any]]) -> dict[str, Any]:
    prices = gpu_prices(settings_rows)
    return {"price_gpus": list(prices), "price_usd": list(prices.values()),
            "gap_cap_ms": HEARTBEAT_GAP_CAP_MS}
