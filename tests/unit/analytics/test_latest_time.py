"""A record stamped at the latest time the messages accept (``MAX_EPOCH_MS``) is kept by every
table it reaches. The tables expire rows by 32-bit ``DateTime`` rules (``TTL toDateTime(time) +
INTERVAL N DAY``), which end in February 2106: before 7 Dec the models accepted times up to
2286, and a record stamped from about 2105 on was dropped on insert, with no row and no dead
letter. The limit is now the start of 2100, well inside what the store keeps."""

from schemas import events
from schemas.commands import SetLoadShedLevel
from schemas.limits import MAX_EPOCH_MS
from tests.unit.analytics.test_last_attempt import _write

AT = MAX_EPOCH_MS
COMMON = dict(request_id="r-late", tenant="acme", model="m", created_ms=AT)


def test_a_record_at_the_latest_time_accepted_is_kept_by_every_table(store):
    _write(store, 1, [
        ("telemetry", events.Queued(event_time_ms=AT, prompt_tokens=1, max_tokens=1, **COMMON)),
        ("telemetry", events.Completed(event_time_ms=AT, worker_id="w", prompt_tokens=1,
                                       output_tokens=1, e2e_s=0.5, **COMMON)),
        ("telemetry", events.WorkerStatus(event_time_ms=AT, worker_id="w", slot=0, pool="h100@m",
                                          gpu_type="h100", models_loaded=["m"], started_ms=AT)),
        ("control", SetLoadShedLevel(event_time_ms=AT, command_id="c-late", issued_by="op",
                                     min_value=0.0))])
    counts = {table: store.query(f"SELECT count() FROM {table} FINAL").rows[0][0] for table in (
        "request_events", "request_outcomes", "request_minute", "worker_status",
        "control_commands")}
    assert counts["request_events"] == 2 and counts["request_outcomes"] == 1
    assert counts["worker_status"] == 1 and counts["control_commands"] == 1
    assert counts["request_minute"] > 0  # (a row per minute and kind of event)
