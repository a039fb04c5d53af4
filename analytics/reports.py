"""The reports of ``governor report``: named SQL over the analytics store.

Each report is one query (read it with ``governor report NAME --show-sql``) over the ``--days``
days before its window's end, ``{now}``: ``--until``, else the wall clock as it runs (never the
engine's clock: time is a parameter); time series use ``--bucket`` (minute, hour or day).
Request outcomes come from ``analytics/outcomes.py``; cost from ``analytics/cost.py``, which
documents its method.

A report refuses ``--days`` beyond what the tables it reads keep (their TTLs): cost and cache
read heartbeats, kept 30 days, from a day before their window: at most 29, fewer by as many
days as ``--until`` is ago (the TTLs count from the wall clock). (Before 5 Dec, asked for more,
they stopped at 30 days without a word: older requests and tasks dropped out of the cost report
and their days cost nothing.)
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analytics.cost import COST_SQL, PRICE_SETTINGS_SQL, cost_parameters
from analytics.outcomes import (DEFAULTS, FINAL_SETTINGS, OUTCOMES_CTE, RAN_ON_POOL,
                                SLO_SETTINGS_SQL, TASK_IN_WINDOW, TASK_LOOKBACK_DAYS,
                                TASK_STEPS_CTE, WINDOW_START, WORKER_INCARNATIONS_CTE,
                                slo_parameters)
from analytics.query import QueryError, SqlSource
from analytics.store import QueryResult
from analytics.window import (DAY_MS, ReportError, in_window, sql_time, wall_clock_ms,
                              window_parameters)

BUCKETS_S = {"minute": 60, "hour": 3600, "day": 86_400}

#: The days the tables the reports read keep their rows (the TTLs of ``analytics/migrations``).
KEPT_DAYS = {"worker_status": 30, "request_outcomes": 90, "control_commands": 365,
             "config_changes": 365, "dead_letters": 30}

SLO_SQL = f"""
WITH {OUTCOMES_CTE.strip()}
SELECT bucket, tenant, finished, slo_met, round(slo_met / finished, 4) AS slo_attainment,
       -- (t-digests answer Float32: rounded as such, 0.4 read back as 0.4000000059604645)
       round(toFloat64(q[1]), 4) AS ttft_p50_s, round(toFloat64(q[2]), 4) AS ttft_p90_s,
       round(toFloat64(q[3]), 4) AS ttft_p99_s, round(toFloat64(e2e_q), 4) AS e2e_p99_s
FROM (
    SELECT toStartOfInterval(assumeNotNull(finished_at), toIntervalSecond({{bucket_s:UInt32}}))
               AS bucket,
           tenant, count() AS finished,
           -- (its first token's TTFT, no continuation's, schema version 16; one whose first
           -- token was lost, by its continuation's; one with no first token, an empty answer,
           -- by its end, as the streams judge it: before 6 Dec a miss)
           countIf(outcome = 'ok' AND coalesce(ttft_s, continuation_ttft_s, e2e_s) <= ttft_slo)
               AS slo_met,
           quantilesTDigest(0.5, 0.9, 0.99)(ttft_s) AS q, quantileTDigest(0.99)(e2e_s) AS e2e_q
    FROM outcomes
    WHERE outcome NOT IN ('unfinished', 'cancelled')
    GROUP BY bucket, tenant)
ORDER BY bucket, tenant
{FINAL_SETTINGS}"""

#: Per pool and day: the prompt tokens the workers' prefix caches were asked for and held (their
#: counters, in tokens), and the completed requests' prompt tokens and the share of them cached
#: (each ``Completed``'s ``cached_tokens``).
CACHE_SQL = f"""
WITH {OUTCOMES_CTE.strip()},
{WORKER_INCARNATIONS_CTE.strip()},
blocks AS (
    SELECT day, pool, sum(queries) AS lookups, sum(hits) AS block_hits FROM (
        SELECT toDate(time) AS day, pool, worker_id, started,
               max(prefix_cache_queries) - if(toDate(started) = day, 0, min(prefix_cache_queries))
                   AS queries,
               max(prefix_cache_hits) - if(toDate(started) = day, 0, min(prefix_cache_hits)) AS hits
        FROM worker_status FINAL
        WHERE {in_window("time", WINDOW_START)}
        GROUP BY day, pool, worker_id, started)
    GROUP BY day, pool),
tokens AS (
    SELECT toDate(assumeNotNull(o.finished_at)) AS day, wi.pool AS pool,
           sum(o.prompt_tokens) AS prompt, sum(o.cached_tokens) AS cached
    FROM {RAN_ON_POOL}
    WHERE o.completed
    GROUP BY day, pool)
SELECT b.day AS day, b.pool AS pool, b.lookups AS looked_up_tokens, b.block_hits AS hit_tokens,
       if(b.lookups > 0, round(b.block_hits / b.lookups, 4), NULL) AS hit_rate,
       t.prompt AS prompt_tokens, t.cached AS cached_tokens,
       if(t.prompt > 0, round(t.cached / t.prompt, 4), NULL) AS token_hit_rate
FROM blocks AS b LEFT JOIN tokens AS t ON b.day = t.day AND b.pool = t.pool
ORDER BY day, pool
{FINAL_SETTINGS}"""

#: A command its readers dead-lettered did not hold for them: ``refused`` says why and who
#: (a router refuses an operator's command stamped more than 10 s after its record was written,
#: ``future_event_time``; the supervisor a pool size the local stack cannot give), of any
#: record of the command (a restatement too); '' where none did, NULL where the dead letters
#: are no longer kept (``{dead_letters_kept_from}``: their TTL counts back from the wall clock,
#: whatever the window's end). The command shows once, with the reason of its first record.
ACTIONS_SQL = f"""
SELECT * FROM (
    SELECT time, 'command' AS kind, type AS action, issued_by AS actor, target,
           argMin(reason, (kafka_partition, kafka_offset)) AS reason, params,
           if(countIf(refused_by != '') > 0,
              concat(anyIf(refused_why, refused_by != ''), ' by ', arrayStringConcat(
                  arraySort(groupUniqArrayIf(refused_by, refused_by != '')), ', '), ': ',
                  argMinIf(refused_error, refused_at, refused_by != '')),
              if(time < {{dead_letters_kept_from:DateTime64(3, 'UTC')}}, NULL, ''))
               AS refused
    FROM (SELECT * FROM control_commands FINAL
          WHERE {in_window("time", WINDOW_START)}) AS c
    LEFT JOIN (SELECT source_topic, source_partition, source_offset, consumer AS refused_by,
                      reason AS refused_why, error AS refused_error, time AS refused_at
               FROM dead_letters FINAL
               WHERE endsWith(source_topic, '.control')) AS d
        ON c.kafka_topic = d.source_topic AND c.kafka_partition = d.source_partition
           AND c.kafka_offset = d.source_offset
    GROUP BY time, type, command_id, issued_by, target, params
    UNION ALL
    SELECT time, 'config', type, if(type = 'config_set', set_by, component), setting, reason,
           value, toNullable('')
    FROM config_changes FINAL
    WHERE {in_window("time", WINDOW_START)})
ORDER BY time DESC
LIMIT {{limit:UInt32}}
{FINAL_SETTINGS}"""

TASK_FAILURES_SQL = f"""
WITH {TASK_STEPS_CTE.strip()},
failing AS (
    SELECT max(steps_total) AS total, groupUniqArrayIf(step, outcome = 'ok') AS ok_steps,
           groupArrayIf((step, outcome, reason, ifNull(finished_at, seen_at)), outcome != 'ok')
               AS misses
    FROM task_steps GROUP BY task_key
    HAVING {TASK_IN_WINDOW} AND length(ok_steps) < total),
located AS (
    SELECT total, ok_steps, arrayFilter(m -> NOT has(ok_steps, m.1), misses) AS open_misses,
           if(empty(open_misses), arrayFirst(k -> NOT has(ok_steps, k), range(1, total + 1)),
              arrayMin(m -> m.1, open_misses)) AS failed_step,
           arrayReverseSort(m -> m.4, arrayFilter(m -> m.1 = failed_step, open_misses)) AS at_step,
           if(empty(at_step), 'not_sent', if(at_step[1].3 = '', at_step[1].2,
                                              concat(at_step[1].2, ':', at_step[1].3))) AS why
    FROM failing)
SELECT failed_step AS step, total AS steps_total, why AS outcome, count() AS tasks,
       sum(arrayCount(k -> k < failed_step, ok_steps)) AS earlier_steps_completed
FROM located
GROUP BY step, steps_total, outcome
ORDER BY step, tasks DESC, outcome
{FINAL_SETTINGS}"""

REJECTIONS_SQL = f"""
WITH {OUTCOMES_CTE.strip()}
SELECT toDate(seen_at) AS day, tenant, outcome, reason, count() AS requests
FROM outcomes
WHERE outcome IN ('rejected', 'failed')
GROUP BY day, tenant, outcome, reason
ORDER BY day, requests DESC, tenant, outcome, reason
{FINAL_SETTINGS}"""


@dataclass(frozen=True)
class Report:
    name: str
    title: str
    sql: str
    #: the tables whose TTLs bound ``--days`` (see ``KEPT_DAYS``)
    reads: tuple[str, ...]
    #: parameters from the store (None: with no store, the settings' defaults)
    extra_parameters: Callable[[SqlSource | None], dict[str, Any]] | None = None
    #: days before the window it reads as well (a task's earlier steps, a worker's pool)
    lookback_days: int = 0

    @property
    def max_days(self) -> int:
        """The longest ``--days`` it answers in full; the table that keeps the least."""
        return min(KEPT_DAYS[table] for table in self.reads) - self.lookback_days

    def check_days(self, days: int, ended_ms_ago: int = 0) -> None:
        """Refuse a window that reaches back past what its tables keep. Their TTLs count back
        from the wall clock: a window that ended ``ended_ms_ago`` (``--until``) has that much
        less to reach back."""
        most = self.max_days - ended_ms_ago / DAY_MS
        if days <= most:
            return
        table = min(self.reads, key=KEPT_DAYS.__getitem__)
        before = f", from {self.lookback_days} day before its window" \
            if self.lookback_days else ""
        ending = f"a window that ends {ended_ms_ago / DAY_MS:.1f} days ago (--until)" \
            if ended_ms_ago else "it"
        raise ReportError(
            f"the {self.name} report reads {table}, kept {KEPT_DAYS[table]} days{before}: "
            f"{ending} answers at most --days {max(0, math.floor(most))}, not {days} (it would "
            "leave out what is older without a word)")


#: How the engine says a result went past ``READ_SETTINGS``' rows or bytes (its numbers).
_TOO_MANY = re.compile(r"Limit for result exceeded, (.*?)\.? \(TOO_MANY_ROWS_OR_BYTES\)")


def too_many_rows(name: str, days: int, bucket: str, error: str) -> str | None:
    """What to say of report ``name`` over ``days`` that the store cut off as ``error`` says:
    past the rows (or bytes) a query here may return, and which options make it smaller; None
    for another error."""
    found = _TOO_MANY.search(error)
    if found is None:
        return None
    smaller = ["fewer --days"]
    if "{bucket_s:" in REPORTS[name].sql and bucket != "day":
        smaller.append(f"a coarser --bucket than {bucket}")
    return (f"the {name} report over --days {days} has more rows than a query here may return "
            f"({found[1]}): give {' or '.join(smaller)}")


def _cost_extra(source: SqlSource | None) -> dict[str, Any]:
    return cost_parameters(source.query(PRICE_SETTINGS_SQL).rows if source is not None else [])


REPORTS: dict[str, Report] = {report.name: report for report in (
    Report("cost", "Cost per successful task by tenant, model, pool and day", COST_SQL,
           ("worker_status", "request_outcomes"), _cost_extra, TASK_LOOKBACK_DAYS),
    Report("slo", "SLO attainment and TTFT percentiles over time", SLO_SQL,
           ("request_outcomes",)),
    Report("cache", "Prefix-cache hit rate by pool", CACHE_SQL,
           ("worker_status", "request_outcomes"), lookback_days=1),  # (worker_incarnations)
    Report("actions", "What the controllers and operators did, and why (latest first)",
           ACTIONS_SQL, ("control_commands", "config_changes")),
    Report("task-failures", "Where tasks failed, by step", TASK_FAILURES_SQL,
           ("request_outcomes",), lookback_days=TASK_LOOKBACK_DAYS),
    Report("rejections", "Rejected, shed and failed requests by reason", REJECTIONS_SQL,
           ("request_outcomes",)),
)}


def report_parameters(name: str, days: int = 7, bucket: str = "hour", limit: int = 100,
                      source: SqlSource | None = None, until_ms: int | None = None,
                      now_ms: int | None = None) -> dict[str, Any]:
    """The values of the query parameters of report ``name`` (its ``{name:Type}``): ``--days``,
    ``--bucket``, ``--limit``, the window's ``now`` and ``until`` (``window_parameters``: from
    ``until_ms``, ``--until``, or else ``now_ms``, the wall clock when None), and the settings in force in ``source``'s store (None: their defaults, as
    ``--show-sql`` lists them for ``governor sql --param``)."""
    report = REPORTS[name]
    now = wall_clock_ms() if now_ms is None else now_ms
    parameters: dict[str, Any] = {
        **DEFAULTS, "days": days, "bucket_s": BUCKETS_S[bucket], "limit": limit,
        **window_parameters(now, until_ms),
        "dead_letters_kept_from": sql_time(now - KEPT_DAYS["dead_letters"] * DAY_MS)}
    if source is not None and "{default_" in report.sql:  # requests that state no SLO: judged
        parameters.update(slo_parameters(source.query(SLO_SETTINGS_SQL).rows))  # by those
    if report.extra_parameters is not None:
        parameters.update(report.extra_parameters(source))
    return {k: v for k, v in parameters.items() if "{" + k + ":" in report.sql}


def run_report(source: SqlSource, name: str, days: int = 7, bucket: str = "hour",
               limit: int = 100, until_ms: int | None = None,
               now_ms: int | None = None) -> QueryResult:
    """Report ``name`` over the ``days`` before ``until_ms`` (None: those before ``now_ms``, the
    wall clock when None, with no end), refused if that reaches back past what its tables
    keep."""
    now = wall_clock_ms() if now_ms is None else now_ms
    REPORTS[name].check_days(days, ended_ms_ago=0 if until_ms is None else now - until_ms)
    try:
        return source.query(REPORTS[name].sql,
                            report_parameters(name, days, bucket, limit, source, until_ms, now))
    except QueryError as exc:
        said = too_many_rows(name, days, bucket, str(exc))
        if said is None:
            raise
        raise ReportError(said) from None
