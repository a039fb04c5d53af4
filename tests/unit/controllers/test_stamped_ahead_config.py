"""A configuration record that says a time more than 10 s after its record was written (its
writer's clock runs fast) is rejected, by the record's own timestamp, so every component judges
it alike whenever it reads it; the value in force is written again. Before 6 Dec it was applied
as set at its stamp, and an operator's command made before that time was ignored for its
tenant, silently, until the clock caught up (``tests/integration/test_stamped_ahead.py``)."""

import pytest

from controllers.live_config import RESTORED_BY, LiveConfig
from controllers.overrides import AHEAD_MS
from schemas.config import ConfigSet

T0 = 1_700_000_000_000
ACME = {"requests_per_s": 1, "tokens_per_s": 1e6}


def _read(live: LiveConfig, record: ConfigSet, offset: int, written_ms: int, now_ms: int):
    return live.apply(record, offset, now_ms, record.key.encode(), written_ms=written_ms)


@pytest.mark.parametrize("now_ms", [T0, T0 + 2 * 3_600_000])  # (a reader's clock, or start)
def test_a_record_stamped_ahead_of_its_writing_is_rejected_and_restored(now_ms: int) -> None:
    live = LiveConfig("router")
    assert _read(live, ConfigSet(event_time_ms=T0, key="tenants.acme", value=ACME), 0, T0,
                 now_ms).type == "config_applied"
    ahead = ConfigSet(event_time_ms=T0 + 5 + 3_600_000, key="tenants.acme",
                      value={**ACME, "requests_per_s": 2})
    verdict = _read(live, ahead, 1, T0 + 5, now_ms)
    assert verdict.type == "config_rejected"
    assert verdict.reason.startswith("future_event_time: stamped 3600.000s after its record "
                                     "was written (at most 10s"), verdict.reason
    assert live.config.tenants["acme"].requests_per_s == 1
    (restored,) = live.to_restore(now_ms)
    assert (restored.key, restored.value["requests_per_s"], restored.set_by,
            restored.in_force_since_ms) == ("tenants.acme", 1, RESTORED_BY, T0)


@pytest.mark.parametrize(("field", "ahead_ms", "taken"), [
    ("event_time_ms", AHEAD_MS, True), ("event_time_ms", AHEAD_MS + 1, False),
    ("in_force_since_ms", AHEAD_MS + 1, False), ("entries_since_ms", AHEAD_MS + 1, False),
    ("restored_at", AHEAD_MS + 1, True)])
def test_every_time_a_record_says_its_value_held_since_counts(field: str, ahead_ms: int,
                                                              taken: bool) -> None:
    """Since when a restoring record says its value, or an entry of its map, has held counts;
    its own stamp (its router's clock) does not, since it says nothing of the value."""
    at = T0 + ahead_ms
    times = {"event_time_ms": at if field in ("event_time_ms", "restored_at") else T0}
    if field == "restored_at":
        times.update(in_force_since_ms=T0, set_by=RESTORED_BY)
    if field == "in_force_since_ms":
        times.update(in_force_since_ms=at, set_by=RESTORED_BY)
    if field == "entries_since_ms":
        times.update(in_force_since_ms=T0, entries_since_ms={"acme": at}, set_by=RESTORED_BY)
    record = ConfigSet(key="tenants", value={"acme": ACME}, **times)
    verdict = _read(LiveConfig("router"), record, 0, T0, T0)
    assert (verdict.type == "config_applied") is taken, verdict
