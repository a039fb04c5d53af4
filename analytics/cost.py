"""Cost per successful task by tenant, model, pool and day.

The method (all of it in the SQL below, so anyone can check it against the tables):

1. **GPU time provisioned.** Each worker's heartbeats (``worker_status``, about every 0.5 s) are
   sorted per worker incarnation (``worker_id``, ``started``) and day; each heartbeat in a state
   other than ``stopped`` or ``crashed`` counts the time until the next one, capped at the
   heartbeat timeout (3 s), so a worker that stops reporting stops costing after 3 s. Summed per
   day and pool: GPU-seconds. Idle, warming, draining and sleeping GPUs cost the same as busy ones.
2. **Price.** GPU-seconds × the pool's GPU price per hour / 3600. Prices are
   ``schemas.config.DEFAULT_GPU_PRICES_USD_PER_HOUR`` overlaid with the latest
   ``gpu_prices_usd_per_hour`` settings on ``governor.config`` (``config_settings``: each
   setting's latest value, kept however long ago it was made, as the compacted topic keeps it);
   the latest price applies to the whole window. A GPU type without a price costs 0 (its hours
   still show).
3. **Attribution.** A pool-day's cost is shared among the requests that ran on it that day, in
   proportion to their GPU time that day: from a request's first ``Started`` to its terminal
   event (a request that runs past midnight counts in each day for its time in it), on
   the worker it ended on: the one that completed it, or else the worker of its latest attempt
   (a request resumed elsewhere counts whole where it ended), in the pool that worker was in
   when the request ended (a worker id used again for another pool, as the local supervisor's
   slot names are, counts in each pool for its own time). Failed, late and retried work is paid
   for, like idle time; a pool-day that served no request shows as tenant ``(unattributed)``.
4. **Successful tasks.** A task succeeds when each of its steps has a request that completed by
   its deadline (a task id is its tenant's own). A task is in the window when its latest
   request is, and its steps sent up to ``TASK_LOOKBACK_DAYS`` (1) before the window count too
   (``analytics/outcomes.py``). Each successful task counts once, in the row of
   its final step's successful request (that request's tenant, model, pool and the day it
   started, the day a request is counted on; the first of them by request key if the final
   step was sent twice), so the column sums to the number of successful tasks.

``cost_per_successful_task_usd`` = cost / successful tasks of the row (empty where none).
"""

import json
from typing import Any

from analytics.outcomes import (FINAL_SETTINGS, OUTCOMES_CTE, RAN_ON_POOL, TASK_IN_WINDOW,
                                TASK_STEPS_CTE, WORKER_INCARNATIONS_CTE)
from schemas.config import GovernorConfig

HEARTBEAT_GAP_CAP_MS = int(GovernorConfig().worker_heartbeat_timeout_s * 1000)

PRICE_SETTINGS_SQL = """
SELECT setting, argMax(value, (time, kafka_offset)) FROM config_settings
WHERE setting = 'gpu_prices_usd_per_hour' OR startsWith(setting, 'gpu_prices_usd_per_hour.')
GROUP BY setting
ORDER BY max((time, kafka_offset))"""

COST_SQL = f"""
WITH {OUTCOMES_CTE.strip()},
{TASK_STEPS_CTE.strip()},
{WORKER_INCARNATIONS_CTE.strip()},
pool_cost AS (
    SELECT day, pool, sum(gpu_s) AS pool_gpu_s,
           sum(gpu_s * mapFromArrays({{price_gpus:Array(String)}},
                                     {{price_usd:Array(Float64)}})[gpu_type]) / 3600
               AS pool_cost_usd
    FROM (
        SELECT toDate(time) AS day, any(pool) AS pool, any(gpu_type) AS gpu_type,
               -- each heartbeat as one number, time * 2 + live: sorting plain numbers is fast
               arraySort(groupArray(toUnixTimestamp64Milli(time) * 2
                                    + (state NOT IN ('stopped', 'crashed')))) AS beats,
               arraySum((gap, live) -> if(live, least(gap, {{gap_cap_ms:UInt64}}), 0),
                        arrayPopFront(arrayDifference(arrayMap(b -> intDiv(b, 2), beats))),
                        arrayPopBack(arrayMap(b -> b % 2 = 1, beats))) / 1000 AS gpu_s
        FROM worker_status  -- no FINAL needed: a heartbeat stored twice adds a gap of 0
        WHERE time >= now64(3) - toIntervalDay({{days:UInt32}})
        GROUP BY worker_id, started, day)
    GROUP BY day, pool),
succeeded_tasks AS (
    -- each with the one request it is counted on (its final step may have been sent twice)
    SELECT task_key, minIf(request_key, outcome = 'ok' AND step = steps_total) AS counted_on
    FROM task_steps GROUP BY task_key
    HAVING {TASK_IN_WINDOW} AND max(steps_total) > 0
       AND length(groupUniqArrayIf(step, outcome = 'ok')) = max(steps_total)),
by_pool AS (
    -- Requests that ran, summed where they ran, their time in each day it spans; a request
    -- counts on the day it started, a successful task where (and when) its final step started.
    SELECT addDays(toDate('1970-01-01'), day_n) AS day, pool, tenant, model,
           countIf(day_n = first_day) AS n_requests,
           sum(greatest(0, least(end_ms, (day_n + 1) * 86400000)
                           - greatest(start_ms, day_n * 86400000))) / 1000 AS busy_s,
           countIf(day_n = first_day AND counts_task) AS n_tasks
    FROM (
        SELECT wi.pool AS pool, o.tenant AS tenant, o.model AS model,
               toUnixTimestamp64Milli(assumeNotNull(o.started_at)) AS start_ms,
               toUnixTimestamp64Milli(assumeNotNull(o.finished_at)) AS end_ms,
               intDiv(start_ms, 86400000) AS first_day,
               o.outcome = 'ok' AND o.step = o.steps_total
                   AND (o.task_key, o.request_key) IN succeeded_tasks AS counts_task
        FROM {RAN_ON_POOL}
        WHERE o.started_at IS NOT NULL AND o.finished_at IS NOT NULL AND o.ran_on_key != 0)
    -- (the end is exclusive: a request that ends at midnight takes none of the next day)
    ARRAY JOIN range(first_day, greatest(intDiv(end_ms - 1, 86400000), first_day) + 1) AS day_n
    GROUP BY day, pool, tenant, model),
attributed AS (
    -- Nullable, so that a pool-day none of them ran on (the FULL JOIN below) has NULLs here
    SELECT toNullable(day) AS day, toNullable(pool) AS pool, toNullable(tenant) AS tenant,
           model, n_requests, n_tasks,
           toNullable(if(sum(busy_s) OVER w > 0, busy_s / sum(busy_s) OVER w,
                         n_requests / sum(n_requests) OVER w)) AS share
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
    setting's latest value, in the order they were made).

    Settings are applied to the defaults as the config topic's consumers apply them: one that
    fails validation is skipped and the last good prices stay. (Only each setting's latest value
    is kept, as the compacted topic keeps it: a setting whose latest value was refused counts as
    never made, not as its value before.)
    """
    config = GovernorConfig()
    for key, value in settings_rows:
        try:
            config = config.with_setting(key, json.loads(value))
        except (ValueError, KeyError):
            continue
    return dict(config.gpu_prices_usd_per_hour)


def cost_parameters(settings_rows: list[list[Any]]) -> dict[str, Any]:
    prices = gpu_prices(settings_rows)
    return {"price_gpus": list(prices), "price_usd": list(prices.values()),
            "gap_cap_ms": HEARTBEAT_GAP_CAP_MS}
