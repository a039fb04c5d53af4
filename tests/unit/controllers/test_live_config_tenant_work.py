"""A record's work in ``LiveConfig`` does not grow with the tenants configured: it validates and
reads the tenant it sets, not every tenant (``GovernorConfig.with_setting``), and notes what it
set from that tenant's data alone (``LiveConfig._set``). Before, each record dumped and
validated the whole configuration three times over: with 1,000 tenants, 5 ms a record in every
router and controllers process, 2.9 s to read them at start, and ``governor config set``'s
replay of the topic (``kept_otherwise``) 3.9 s, growing with the square of the tenants
(``python -m benchmarks.live_config_apply``). Counted here, not timed; and on random records
what it notes is what comparing the whole configurations before and after each notes."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers.live_config import RESTORED_BY, LiveConfig, _changed, _set_by, _whole_entry
from schemas.config import ConfigSet, GovernorConfig
from tests.config_changes import BASE, changes, many_tenants, tenants_looked_at

T0 = 1_700_000_000_000
LIMIT = {"requests_per_s": 10.0, "tokens_per_s": 1e4}


def _read(live: LiveConfig, key: str, value: object, offset: int) -> str:
    """A record of the topic applied, as a component reads it."""
    record = ConfigSet(event_time_ms=T0 + offset, key=key, value=value)
    return live.apply(record, offset, T0, key.encode(), written_ms=T0 + offset).type


def test_one_tenant_s_record_looks_at_that_tenant_alone_of_a_thousand(monkeypatch) -> None:
    live = LiveConfig("router", many_tenants(1_000))
    looked_at = tenants_looked_at(monkeypatch)
    assert _read(live, "tenants.t-7.requests_per_s", 20.0, 0) == "config_applied"
    assert _read(live, "tenants.new", LIMIT, 1) == "config_applied"
    assert _read(live, "tenants.t-8", None, 2) == "config_applied"
    assert _read(live, "tenants.t-9.priority", 10, 3) == "config_rejected"
    assert len(looked_at) <= 4 * 4, f"{len(looked_at)} tenants' limits dumped or validated"
    monkeypatch.undo()
    assert live.config.tenants["t-7"].requests_per_s == 20.0
    assert list(live.config.tenants)[-1] == "new" and "t-8" not in live.config.tenants
    assert live._data == live.config.model_dump(mode="json")


def test_reading_and_replaying_n_tenants_records_looks_at_each_a_few_times(monkeypatch) -> None:
    """A component started on the topic applies each tenant's record; ``governor config set``
    replays them all (``kept_otherwise``) and reads each key's value in force."""
    tenants = 300
    looked_at = tenants_looked_at(monkeypatch)
    live = LiveConfig("router")
    for n in range(tenants):
        assert _read(live, f"tenants.t-{n}", LIMIT, n) == "config_applied"
    assert len(looked_at) <= 4 * tenants, f"start: {len(looked_at)} tenants' limits looked at"
    looked_at.clear()
    assert live.kept_otherwise(T0) == []
    assert len(looked_at) <= 8 * tenants, f"replay: {len(looked_at)} tenants' limits looked at"
    monkeypatch.undo()
    assert live._data == live.config.model_dump(mode="json")


class _WholeConfigurations(LiveConfig):
    """The reference: the leaves a record set found in the whole configurations' data."""

    def _leaves_set(self, key: str, candidate: GovernorConfig) -> tuple[set[str], dict]:
        data = candidate.model_dump(mode="json")
        set_by = _set_by(key, self._data) | _set_by(key, data)
        if not set_by and not _whole_entry(key):  # a field the data leave out (a pool's gpus
            set_by = {key}  # null) is set all the same; a missing entry removed is not
        return _changed(self._data, data) | set_by, data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(st.tuples(changes, st.sampled_from(["operator", RESTORED_BY])),
                        min_size=1, max_size=12))
def test_random_records_note_what_comparing_the_whole_configurations_notes(history) -> None:
    fast, whole = LiveConfig("router", BASE), _WholeConfigurations("router", BASE)
    for offset, ((key, value), set_by) in enumerate(history):
        record = ConfigSet(event_time_ms=T0 + 10 * offset, key=key, value=value, set_by=set_by)
        verdicts = [live.apply(record, offset, T0, key.encode()).type for live in (fast, whole)]
        assert verdicts[0] == verdicts[1]
        for name in ("config", "_data", "_changed_ms", "_entry_set_ms", "_map_set_ms",
                     "_set_offset"):
            assert getattr(fast, name) == getattr(whole, name), (name, record)
    assert fast._data == fast.config.model_dump(mode="json")
    assert fast.to_restore(T0) == whole.to_restore(T0)
    assert fast.kept_otherwise(T0) == whole.kept_otherwise(T0)
