"""The per-request outcome every report builds on, as a SQL common table expression.

``request_outcomes`` (a rollup kept by materialized views) holds partial rows per request; read
with ``FINAL`` they merge into one row each, which this classifies:

- ``ok``: completed by its deadline (one that states none: its creation plus
  ``slo.deadline_s``, as the streams judge it; before 6 Dec any completion of it was ``ok``);
- ``late``: completed after its deadline;
- ``failed``, ``rejected``, ``cancelled``: its terminal event (a failure of an attempt that a
  newer one replaced is none, as the router, the streams and the audit take it: schema version
  17; before, a request whose continuation was then cancelled, or ran on, was ``failed``);
- ``unfinished``: no terminal event yet.

A request succeeds when it is ``ok``; a task succeeds when every one of its steps has a successful
request (``DESIGN.md``). Requests are selected by when the client sent them (or first seen): the
``{days}`` days before ``{now}`` (``--until``, else the time the report runs) and before
``{until}`` (``--until``, else no end: ``analytics/window.py``), each judged by all of its
events, those after the end too. Reports on tasks read ``task_steps`` (``TASK_STEPS_CTE``) instead: the
tasks whose latest request was sent in those days, with their steps sent up to
``TASK_LOOKBACK_DAYS`` (1) before them (a task's first steps are often sent just before the window
its last one is in; filtered request by request, it lost them and failed "not sent"). ``ran_on_key`` is the key (``worker_incarnations.worker_key``) of the
worker that completed a request (of its newest completing attempt, if two did; rows written
before schema version 6: the greater id) or, if none did, of the worker of its latest attempt
(rows written before schema version 3 lack it: the greatest of the ids of the workers it ran on);
0 if it ran nowhere. ``task_key`` is a 64-bit hash of the tenant and ``task`` (a task id is its
tenant's own): grouping on it is cheaper. A request's deadline is judged by its first completion
(``completed_at``): an attempt that was replaced and reports late does not make it late.
``attempt_starts``, ``attempt_ends`` and ``first_finished_at`` (schema version 10) time each
attempt for the cost report (``analytics/cost.py``), with ``first_unnamed_end_ms`` (version 15:
the first terminal event that names no attempt).
A request's tenant, model, task, step, steps, TTFT SLO, deadline and prompt tokens are what the
router accepted (its ``Queued``), else its first ``InferenceRequest`` read (``request_facts``,
schema version 11): not those of another request sent under its id.
"""

import json
from typing import Any

from analytics.migrations.m002_rollups import CANCELLED, COMPLETED, FAILED, REJECTED
from analytics.migrations.m003_last_attempt import WORKER_KEY
from analytics.migrations.m011_request_facts import FACTS
from analytics.window import NOW, in_window
from schemas.config import GovernorConfig, SloConfig

#: Query parameters the CTE takes, with their defaults (the SLO's: ``slo_parameters`` gives
#: those of the settings in force), but for the window's end, ``now`` (``analytics.window``).
DEFAULTS = {"days": 7, "default_ttft_slo_s": SloConfig().ttft_slo_s,
            "default_deadline_s": SloConfig().deadline_s}


def settings_sql(name: str) -> str:
    """The latest value of the setting ``name`` and of each under it (``config_settings``), in
    the order they were made: rows for ``config_in_force``."""
    return f"""
SELECT setting, argMax(value, (time, kafka_offset)) FROM config_settings
WHERE setting = '{name}' OR startsWith(setting, '{name}.')
GROUP BY setting
ORDER BY max((time, kafka_offset))"""


#: The SLO settings (``slo``, ``slo.ttft_slo_s``, ``slo.deadline_s``), for ``slo_parameters``.
SLO_SETTINGS_SQL = settings_sql("slo")


def config_in_force(settings_rows: list[list[Any]]) -> GovernorConfig:
    """The configuration after the settings (rows of a ``settings_sql``: each setting's latest
    value, in the order they were made), applied to the defaults as the config topic's consumers
    apply them: one that fails validation is skipped and the last good value stays. (Only each
    setting's latest value is kept, as the compacted topic keeps it: a setting whose latest value
    was refused counts as never made, not as its value before.)"""
    config = GovernorConfig()
    for key, value in settings_rows:
        try:
            config = config.with_setting(key, json.loads(value))
        except (ValueError, KeyError):
            continue
    return config


def slo_parameters(settings_rows: list[list[Any]]) -> dict[str, float]:
    """The CTE's SLO parameters from the ``slo`` settings in force (rows of
    ``SLO_SETTINGS_SQL``): the targets of requests that state none, as the streams take them."""
    slo = config_in_force(settings_rows).slo
    return {"default_ttft_slo_s": slo.ttft_slo_s, "default_deadline_s": slo.deadline_s}


def _fact(name: str) -> str:
    return f"tupleElement(request_facts, '{name}')"


#: What each request asked for: its ``request_facts`` (schema version 11: its Queued, else its
#: first InferenceRequest, whatever a later record under its id says), or, in rows written
#: before that version (``rank`` 0), its columns as they are.
_STATED = f"{_fact('rank')} > 0"
_REQUEST_FACTS = ",\n                     ".join(
    [f"if({_STATED}, {_fact(name)}, {name}) AS {name}" for name in FACTS]
    + [f"if({_STATED}, if({_fact('task_id')} = '', 0, cityHash64({_fact('task_id')})), task_key)"
       " AS task_key"])

#: The worker's key packed with an event that names no worker (a router's ``Cancelled``) in
#: ``attempt_ends`` and ``failed_attempts``.
NO_WORKER_KEY = WORKER_KEY.format(worker="''")

_ATTEMPT, _WORKER = "bitShiftRight({}, 48)", "bitAnd({}, 0xFFFFFFFFFFFF)"
#: Whether a request failed: a failure of an attempt that a newer one replaced is no state of
#: the request (the router lets the newer attempt go on), told as the audit tells it: by its
#: attempt, below the newest started (``last_attempt``), or where it names none (0: a writer
#: older than 7 Dec) by its worker, not the newest attempt's. A request with events stored
#: before schema version 17 (``failures_named`` 0: ``failed_attempts`` lacks theirs) is judged
#: as before: any failure is the request's.
_OWN = f"""f -> if({_ATTEMPT.format('f.1')} > 0,
                   {_ATTEMPT.format('f.1')} >= {_ATTEMPT.format('last_attempt')},
                   {_WORKER.format('f.1')} = {NO_WORKER_KEY} OR last_attempt = 0
                   OR {_WORKER.format('f.1')} = {_WORKER.format('last_attempt')})"""
_FAILED_NOW = f"""bitAnd(events, {FAILED}) != 0
               AND (failures_named = 0 OR arrayExists({_OWN}, failed_attempts))"""
#: A failed request's reason: the greatest of its own failures' (``reason`` is the greatest of
#: all its failures', a replaced attempt's too), or as before for one stored before version 17.
_FAILED_REASON = f"""if(failures_named = 0, reason,
                  arrayMax(arrayMap(f -> f.2, arrayFilter({_OWN}, failed_attempts))))"""


def _outcomes(name: str, since: str) -> str:
    """The CTE ``name``: the outcome of every request first seen at or after ``since`` and
    before the window's end, if it has one (as it stands now: one sent before the end is judged
    by all of its events, those after the end too)."""
    return f"""
{name} AS (
    SELECT request_id, tenant, model, if(task_id = '', request_id, task_id) AS task,
           request_key, if(task_key = 0, request_key, cityHash64(tenant, task_key)) AS task_key,
           step,
           steps_total, ifNull(ttft_slo_s, {{default_ttft_slo_s:Float64}}) AS ttft_slo,
           first_seen AS seen_at, started_at, finished_at, first_finished_at, deadline,
           reason, worker_id, attempt_starts, attempt_ends, first_unnamed_end_ms,
           multiIf(completed_attempt > 0, bitAnd(completed_attempt, 0xFFFFFFFFFFFF),
                   worker_id != '', {WORKER_KEY.format(worker="worker_id")},
                   last_attempt > 0, bitAnd(last_attempt, 0xFFFFFFFFFFFF),
                   last_worker_id != '', {WORKER_KEY.format(worker="last_worker_id")}, 0)
               AS ran_on_key,
           ttft_s, continuation_ttft_s, e2e_s, prompt_tokens, output_tokens, cached_tokens,
           bitAnd(events, {COMPLETED}) != 0 AS completed,
           -- (one that states none: its creation, else when first seen, + slo.deadline_s)
           ifNull(deadline, if(created > toDateTime64(0, 3), created, first_seen)
                            + toIntervalMillisecond(toInt64({{default_deadline_s:Float64}} * 1000)))
               AS due,
           multiIf(completed AND ifNull(completed_at, finished_at) <= due, 'ok',
                   completed, 'late', failed, 'failed',
                   bitAnd(events, {REJECTED}) != 0, 'rejected',
                   bitAnd(events, {CANCELLED}) != 0, 'cancelled', 'unfinished') AS outcome
    -- (the reason of a failure that is no state of the request, a replaced attempt's, is
    -- none of the request's either)
    FROM (SELECT * REPLACE ({_REQUEST_FACTS},
                            multiIf(failed, {_FAILED_REASON},
                                    bitAnd(events, {REJECTED}) != 0, reason, '') AS reason),
                 {_FAILED_NOW} AS failed
          FROM request_outcomes FINAL
          WHERE {in_window("first_seen", since)})
)"""


#: How long before a report's window the earlier steps of its tasks are looked for.
TASK_LOOKBACK_DAYS = 1

#: When a report's window begins: ``{days}`` days before its end.
WINDOW_START = f"{NOW} - toIntervalDay({{days:UInt32}})"

#: The requests of the ``{days}`` days before the window's end.
OUTCOMES_CTE = _outcomes("outcomes", WINDOW_START)

#: The requests of the ``TASK_LOOKBACK_DAYS`` before the window too, to group into tasks: a
#: task belongs to the window its latest request was sent in (``TASK_IN_WINDOW``, a condition
#: on the group), and its earlier steps are found if sent at most ``TASK_LOOKBACK_DAYS`` before
#: the window began (an earlier one counts as not sent).
TASK_STEPS_CTE = _outcomes(
    "task_steps", f"{NOW} - toIntervalDay({{days:UInt32}} + {TASK_LOOKBACK_DAYS})")
TASK_IN_WINDOW = f"max(seen_at) >= {WINDOW_START}"

#: Every report ends with this: FINAL may merge each partition on its own (and in parallel),
#: which is right for every table here: a record's copies always share a partition (their event
#: time is the same), and the rollups read with FINAL have one partition.
FINAL_SETTINGS = "SETTINGS do_not_merge_across_partitions_select_final = 1"

#: Each worker incarnation's pool (an id can be used again for another pool: the local
#: supervisor names workers by slot). A request is charged to the incarnation of ``ran_on_key``
#: that was up when it finished (``ASOF`` on ``started``); see ``RAN_ON_POOL``. ``last_beat``:
#: the incarnation's newest heartbeat (where the cost report ends an attempt still running).
WORKER_INCARNATIONS_CTE = f"""
worker_incarnations AS (
    SELECT worker_id, {WORKER_KEY.format(worker="worker_id")} AS worker_key, started,
           argMax(pool, time) AS pool, max(time) AS last_beat
    FROM worker_status
    WHERE {in_window("time", f"{NOW} - toIntervalDay({{days:UInt32}} + 1)")}
    GROUP BY worker_id, started
)"""

#: ``outcomes AS o`` joined to the worker incarnation it ended on (``wi``: its pool, id);
#: requests that ran nowhere, or on a worker no heartbeat in the window names, drop out.
RAN_ON_POOL = """outcomes AS o ASOF INNER JOIN worker_incarnations AS wi
        ON o.ran_on_key = wi.worker_key AND o.finished_at >= wi.started"""
