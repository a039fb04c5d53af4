"""The audit names every way a request can break "exactly one terminal state", counting each
Kafka record once even when the store holds it twice."""

import time

from analytics.audit import run_audit
from analytics.batch import Batch
from analytics.journal import Journal
from analytics.query import StoreSource
from analytics.rows import message_row
from schemas import events

NOW = int(time.time() * 1000) - 60_000


def _event(kind, rid, **fields):
    return kind(event_time_ms=NOW, request_id=rid, **fields)


QUEUED = dict(prompt_tokens=1, max_tokens=1, created_ms=NOW)
DONE = dict(worker_id="w", prompt_tokens=1, output_tokens=1, e2e_s=1.0)
HISTORY = [
    _event(events.Queued, "a", **QUEUED), _event(events.Completed, "a", **DONE),
    _event(events.Queued, "b", **QUEUED), _event(events.Completed, "b", **DONE),
    _event(events.Failed, "b", reason="worker_lost"),
    _event(events.Completed, "c", **DONE),
    _event(events.Rejected, "d", reason="load_shed"),
    _event(events.Rejected, "d", reason="load_shed"),
    _event(events.Rejected, "e", reason="rate_limited"),
    # f's first attempt was replaced (its worker slow to heart-beat) and completed late too:
    _event(events.Queued, "f", **QUEUED), _event(events.Completed, "f", **DONE, attempt=2),
    _event(events.Completed, "f", **DONE, attempt=1),
    # g's one attempt reported its completion twice (two records): a violation.
    _event(events.Queued, "g", **QUEUED), _event(events.Completed, "g", **DONE),
    _event(events.Completed, "g", **DONE),
    # h's attempt 1 on w1 was replaced by attempt 2 on w2, which completed; w1 then reported a
    # failure late: not a second state (the router let attempt 2 go on)
    _event(events.Queued, "h", **QUEUED),
    _event(events.Started, "h", worker_id="w1"), _event(events.Started, "h", worker_id="w2",
                                                        attempt=2),
    _event(events.Completed, "h", **{**DONE, "worker_id": "w2"}, attempt=2),
    _event(events.Failed, "h", reason="engine_error", worker_id="w1"),
    # i's client cancelled it while it waited for a worker (the router ends it, no Queued): fine;
    # j was cancelled by a worker without ever being queued: a violation
    _event(events.Cancelled, "i", reason="user left"),
    _event(events.Cancelled, "j", reason="user left", worker_id="w1"),
]


def test_every_kind_of_violation_is_counted_once_and_named(store):
    batch = Batch()
    for offset, message in enumerate(HISTORY):
        table, columns = message_row(message, "telemetry")
        batch.add(table, ("t.telemetry", 0, offset, message.event_time_ms, *columns))
    Journal(store).commit(1, batch)
    # The same Kafka record (a's Completed) inserted again, outside the journal's protection:
    again = Batch()
    table, columns = message_row(HISTORY[1], "telemetry")
    again.add(table, ("t.telemetry", 0, 1, NOW, *columns))
    for insert in again.inserts(99):
        store.insert(insert.table, insert.data, token=insert.token)
    assert store.query("SELECT count() FROM request_events").rows == [[len(HISTORY) + 1]]

    audit = run_audit(StoreSource(store))
    assert {k: audit[k] for k in ("requests", "accepted", "terminal", "violations",
                                  "multiple_terminal", "missing_terminal",
                                  "terminal_without_queued", "rejected_at_admission",
                                  "cancelled_before_placed", "repeated_terminal",
                                  "unanswered")} == {
        "requests": 10, "accepted": 5, "terminal": 3, "violations": 5, "multiple_terminal": 3,
        "missing_terminal": 0, "terminal_without_queued": 2, "rejected_at_admission": 1,
        "cancelled_before_placed": 1, "repeated_terminal": 1, "unanswered": 0}
    assert sorted((v["request_id"], v["kind"]) for v in audit["violation_ids"]) == [
        ("b", "multiple_terminal"), ("c", "terminal_without_queued"), ("d", "multiple_terminal"),
        ("g", "multiple_terminal"), ("j", "terminal_without_queued")]
    assert audit["ok"] is False


def test_an_empty_store_passes(store):
    audit = run_audit(StoreSource(store))
    assert (audit["accepted"], audit["terminal"], audit["violations"]) == (0, 0, 0)
    assert audit["ok"] is True


def test_violations_are_named_however_many_requests_went_unanswered(store):
    """The ids were one list capped at ``max_ids`` before it was split by kind: 300 unanswered
    requests and one missing its terminal state named no violation."""
    from schemas.requests import InferenceRequest

    batch = Batch()
    for i in range(300):
        message = InferenceRequest(event_time_ms=NOW, created_ms=NOW, request_id=f"u{i:03}",
                                   prompt_tokens=1, max_tokens=1)
        table, columns = message_row(message, "requests")
        batch.add(table, ("t.requests", 0, i, NOW, *columns))
    table, columns = message_row(_event(events.Queued, "lost", **QUEUED), "telemetry")
    batch.add(table, ("t.telemetry", 0, 0, NOW, *columns))
    Journal(store).commit(1, batch)

    audit = run_audit(StoreSource(store), max_ids=10)
    assert (audit["violations"], audit["missing_terminal"], audit["unanswered"]) == (1, 1, 300)
    assert audit["violation_ids"] == [{"request_id": "lost", "kind": "missing_terminal"}]
    assert len(audit["unanswered_ids"]) == 10
    assert set(audit["unanswered_ids"]) <= {f"u{i:03}" for i in range(300)}


def test_a_late_failure_of_a_replaced_attempt_is_told_by_its_attempt(store):
    """k's attempt 1 on w1 was replaced (w1 silent), its continuation (attempt 3) went back to
    w1, the only worker, and completed; w1 then reported attempt 1's failure late: no second
    state, though its worker is the newest attempt's (before 7 Dec a failure named no attempt,
    and the audit took it for attempt 3's). A failure that names the newest attempt (m), or
    none from another worker than the newest's (n, as before), is judged as ever."""
    history = [
        _event(events.Queued, "k", **QUEUED), _event(events.Started, "k", worker_id="w1"),
        _event(events.Started, "k", worker_id="w1", attempt=3),
        _event(events.Completed, "k", **{**DONE, "worker_id": "w1"}, attempt=3),
        _event(events.Failed, "k", reason="engine_error", worker_id="w1", attempt=1),
        _event(events.Queued, "m", **QUEUED), _event(events.Started, "m", worker_id="w1"),
        _event(events.Started, "m", worker_id="w1", attempt=2),
        _event(events.Completed, "m", **{**DONE, "worker_id": "w1"}, attempt=1),
        _event(events.Failed, "m", reason="engine_error", worker_id="w1", attempt=2),
        _event(events.Queued, "n", **QUEUED), _event(events.Started, "n", worker_id="w1"),
        _event(events.Started, "n", worker_id="w2", attempt=2),
        _event(events.Completed, "n", **{**DONE, "worker_id": "w2"}, attempt=2),
        _event(events.Failed, "n", reason="engine_error", worker_id="w1"),
    ]
    batch = Batch()
    for offset, message in enumerate(history):
        table, columns = message_row(message, "telemetry")
        batch.add(table, ("t.telemetry", 0, offset, message.event_time_ms, *columns))
    Journal(store).commit(1, batch)

    audit = run_audit(StoreSource(store))
    assert {k: audit[k] for k in ("accepted", "terminal", "violations", "multiple_terminal")} \
        == {"accepted": 3, "terminal": 2, "violations": 1, "multiple_terminal": 1}
    assert [(v["request_id"], v["kind"]) for v in audit["violation_ids"]] == [
        ("m", "multiple_terminal")]
