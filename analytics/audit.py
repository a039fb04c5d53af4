"""``governor report --audit``: every accepted request reached exactly one terminal state.

Read from the base tables with ``FINAL`` (each Kafka record counted once, whatever the sink did),
not from the rollups, since this is the proof. Per request id:

- **accepted**: it has a ``Queued`` event;
- **terminal**: an accepted request that reached exactly one terminal state (completed, failed,
  rejected or cancelled), each attempt reporting it at most once;
- **violations**: requests that break the invariant, each counted once under the first kind that
  applies: ``multiple_terminal`` (more than one terminal state, or one attempt reporting one
  twice, accepted or not), ``missing_terminal`` (accepted, none), ``terminal_without_queued`` (a
  completed, failed or cancelled request that was never queued). A request admission rejected has
  no ``Queued``: it is not accepted, and it is fine with exactly one ``Rejected``
  (``rejected_at_admission``); so is one its client cancelled while it waited for a worker, with
  exactly one ``Cancelled`` that names no worker and no attempt started
  (``cancelled_before_placed``).
- a failure of an attempt that a newer attempt replaced is not a state of the request (the
  router lets the newer attempt go on), so it breaks nothing: one that names its attempt is
  told by it (below the newest started), one that names none (a worker older than 7 Dec) by
  its worker (not the newest started attempt's);
- **repeated_terminal**: terminal requests whose one state more than one attempt reported: an
  attempt the router had replaced (its worker only slow to heart-beat) completed too. Not a
  violation (the client reads one answer, the newest attempt's), but work done twice.
- **unanswered**: sent by a client (an ``inference_request`` row) but neither queued nor
  rejected: lost before admission. Reported beside the invariant, and it fails the audit too.

The ``type`` filter is applied before ``FINAL`` collapses copies of a record (``PREWHERE``):
``type`` is part of the sorting key, so the copies of a record are all kept or all left out, and
the other events' columns are never read.

``grace_s`` leaves out requests whose latest event is that recent (still in flight): they are
counted as ``in_flight`` instead of as violations. Default 0: after a run, nothing is in flight.
Recent is counted back from the window's end (``{now}``): ``until_ms`` where given (before 7 Dec
the wall clock even then, so a grace at a past ``--until`` left nothing in flight), else
``now_ms`` (default the wall clock), never the engine's clock: time is a parameter, which a test
can fix.

``until_ms`` (``--until``; ``{until}``) audits the requests sent before it (their first event),
each judged by all of its events, those after it too, as the reports judge the requests of a
window that ends then: a request still running at ``until`` that ended once since is fine, one
that ended twice since is a violation, and those sent later, perhaps still running, are left
out. (Not the audit as it would have read at ``until``: every request then running would miss
its terminal state.) Before 7 Dec ``--until`` with the audit alone was refused, and with a
report named it left the audit checking every request.
"""

from typing import Any

from analytics.query import SqlSource
from analytics.window import NOW, UNTIL, wall_clock_ms, window_parameters

AUDIT_SQL = f"""
SELECT count() AS requests,
       countIf(n_queued > 0) AS accepted,
       countIf(n_queued > 0 AND n_states = 1 AND n_terminal = n_reports) AS terminal,
       countIf(n_queued > 0 AND n_states = 1 AND n_terminal = n_reports AND n_reports > 1)
           AS repeated_terminal,
       countIf(n_queued = 0 AND n_terminal = 1 AND n_rejected = 1) AS rejected_at_admission,
       countIf(kind = 'cancelled_before_placed') AS cancelled_before_placed,
       countIf(kind = 'multiple_terminal') AS multiple_terminal,
       countIf(kind = 'missing_terminal') AS missing_terminal,
       countIf(kind = 'terminal_without_queued') AS terminal_without_queued,
       countIf(kind = 'unanswered') AS unanswered,
       countIf(kind = 'in_flight') AS in_flight,
       -- two lists: a cap on one shared list let unanswered ids crowd the violations' out
       groupArrayIf({{max_ids:UInt32}})((any_id, kind), kind IN ('multiple_terminal',
           'missing_terminal', 'terminal_without_queued')) AS violation_examples,
       groupArrayIf({{max_ids:UInt32}})(any_id, kind = 'unanswered') AS unanswered_examples
FROM (
    SELECT any(request_id) AS any_id,
           countIf(type = 'queued') AS n_queued,
           argMaxIf(worker_id, attempt, type = 'started') AS last_worker,
           maxIf(attempt, type = 'started') AS last_attempt,
           -- each failure as (attempt, worker): one of an attempt a newer one replaced is no
           -- state of the request (the router lets the newer attempt go on); told by its
           -- attempt, or where it names none (0: a worker older than the field) by its worker
           arrayFilter(f -> if(f.1 > 0, f.1 >= last_attempt,
                               f.2 = '' OR last_worker = '' OR f.2 = last_worker),
                       groupArrayIf((attempt, worker_id), type = 'failed')) AS failures,
           countIf(type = 'completed') AS n_completed,
           countIf(type = 'rejected') AS n_rejected,
           countIf(type = 'cancelled') AS n_cancelled,
           n_completed + n_rejected + n_cancelled + length(failures) AS n_terminal,
           (n_completed > 0) + (n_rejected > 0) + (n_cancelled > 0) + notEmpty(failures)
               AS n_states,
           -- (a state each attempt reported, once however often it did)
           uniqExactIf((type, attempt), type IN ('completed', 'rejected', 'cancelled'))
               + length(arrayDistinct(arrayMap(f -> f.1, failures))) AS n_reports,
           anyIf(worker_id, type = 'cancelled') AS cancelled_by,
           max(time) >= {NOW} - toIntervalMillisecond({{grace_ms:UInt64}}) AS recent,
           multiIf(n_states > 1 OR n_terminal > n_reports, 'multiple_terminal',
                   n_queued > 0 AND n_terminal = 0 AND recent, 'in_flight',
                   n_queued > 0 AND n_terminal = 0, 'missing_terminal',
                   n_queued = 0 AND n_terminal = 1 AND n_cancelled = 1 AND cancelled_by = ''
                       AND last_worker = '', 'cancelled_before_placed',
                   n_queued = 0 AND n_states = 1 AND n_rejected = 0, 'terminal_without_queued',
                   n_queued = 0 AND n_terminal = 0 AND recent, 'in_flight',
                   n_queued = 0 AND n_terminal = 0, 'unanswered', '') AS kind
    FROM request_events FINAL
    PREWHERE type IN ('inference_request', 'queued', 'started', 'completed', 'failed',
                      'rejected', 'cancelled')
    GROUP BY cityHash64(request_id)
    HAVING min(time) < {UNTIL})
SETTINGS do_not_merge_across_partitions_select_final = 1"""

_INVARIANT_KINDS = ("multiple_terminal", "missing_terminal", "terminal_without_queued")


def audit_parameters(grace_s: float = 0.0, max_ids: int = 10, now_ms: int | None = None,
                     until_ms: int | None = None) -> dict[str, Any]:
    """The values of ``AUDIT_SQL``'s query parameters (``now_ms``: None, the wall clock;
    ``until_ms``: None, every request), the grace counting back from the window's end."""
    now = wall_clock_ms() if now_ms is None else now_ms
    return {"grace_ms": int(grace_s * 1000), "max_ids": max_ids,
            **window_parameters(now, until_ms)}


def run_audit(source: SqlSource, grace_s: float = 0.0, max_ids: int = 10,
              now_ms: int | None = None, until_ms: int | None = None) -> dict[str, Any]:
    """The audit object: ``{"accepted", "terminal", "violations", ...}`` (see the module doc)."""
    row = source.query(AUDIT_SQL, audit_parameters(grace_s, max_ids, now_ms, until_ms)).dicts()[0]
    violations = sum(row[kind] for kind in _INVARIANT_KINDS)
    return {
        "accepted": row["accepted"],
        "terminal": row["terminal"],
        "violations": violations,
        "violation_ids": [{"request_id": rid, "kind": kind}
                          for rid, kind in row.pop("violation_examples")],
        **{key: row[key] for key in ("requests", "rejected_at_admission",
                                     "cancelled_before_placed", *_INVARIANT_KINDS,
                                     "repeated_terminal", "unanswered", "in_flight")},
        "unanswered_ids": row.pop("unanswered_examples"),
        "ok": violations == 0 and row["unanswered"] == 0,
    }
