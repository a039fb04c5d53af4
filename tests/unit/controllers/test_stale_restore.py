"""A restoring record (the value in force written again after a rejected record) that lands
after a newer setting of its key, or of an entry of its map: written by a router that read the
rejected record but not yet the newer one (one reading behind, or the newer record produced
between its read and its write). Before, every component took it, so the newer setting was
undone for all (and for good, once compaction kept the restoring record alone under its key).
Now a component that has a newer setting there refuses it, and a router writes the value in
force again, which a component started on the compacted topic reads too."""

from controllers.live_config import RESTORED_BY, LiveConfig
from schemas.config import ConfigSet
from schemas.events import ConfigApplied, ConfigRejected

T0 = 1_700_000_000_000
ACME, GAMMA = ({"requests_per_s": r, "tokens_per_s": 1e6} for r in (1, 3))


def _set(key: str, value, at: int) -> ConfigSet:
    return ConfigSet(event_time_ms=at, key=key, value=value)


def _read(live: LiveConfig, records: list[ConfigSet]) -> list[ConfigApplied | ConfigRejected]:
    return [live.apply(record, offset, T0 + 100, record.key.encode())
            for offset, record in enumerate(records)]


def _stale_restore(records: list[ConfigSet]) -> ConfigSet:
    """What a router that has read ``records`` (the last rejected) writes."""
    behind = LiveConfig("router-behind")
    _read(behind, records)
    (restoring,) = behind.to_restore(T0 + 50)
    assert restoring.set_by == RESTORED_BY
    return restoring


def test_a_restoring_record_after_a_newer_setting_of_its_key_does_not_undo_it() -> None:
    history = [_set("shedding.low", 0.1, T0), _set("shedding.low", 7, T0 + 10)]
    newer = _set("shedding.low", 0.05, T0 + 20)
    stale = _stale_restore(history)
    live = LiveConfig("router-0")
    verdicts = _read(live, [*history, newer, stale])
    assert isinstance(verdicts[-1], ConfigRejected) and "set after it" in verdicts[-1].reason
    assert live.config.shedding.low == 0.05
    (again,) = live.to_restore(T0 + 60)
    assert (again.key, again.value, again.in_force_since_ms) == ("shedding.low", 0.05, T0 + 20)
    restarted = LiveConfig("router-1")  # on the compacted topic: the key's newest alone
    _read(restarted, [again])
    assert restarted.config.shedding.low == 0.05


def test_a_restoring_record_of_a_map_does_not_undo_an_entry_set_after_what_it_knew() -> None:
    history = [_set("tenants", {"acme": ACME}, T0), _set("tenants", "not a map", T0 + 10)]
    gamma = _set("tenants.gamma", GAMMA, T0 + 20)
    stale = _stale_restore(history)
    live = LiveConfig("router-0")
    _read(live, [*history, gamma, stale])
    assert sorted(live.config.tenants) == ["acme", "gamma"]
    (again,) = live.to_restore(T0 + 60)
    assert (again.key, sorted(again.value), again.entries_since_ms) == (
        "tenants", ["acme", "gamma"], {"gamma": T0 + 20})
    restarted = LiveConfig("router-1")
    _read(restarted, [gamma, again])
    assert restarted.config.tenants == live.config.tenants


def test_a_restoring_record_of_what_is_in_force_is_taken() -> None:
    """Nothing set since: every router's restoring record applies (they say the same)."""
    history = [_set("tenants", {"acme": ACME}, T0), _set("tenants", "not a map", T0 + 10)]
    live = LiveConfig("router-0")
    verdicts = _read(live, [*history, _stale_restore(history), _stale_restore(history)])
    assert [v.type for v in verdicts[-2:]] == ["config_applied", "config_applied"]
    assert live.to_restore(T0 + 60) == []


def test_a_removal_shadowed_by_a_rejected_record_is_written_again() -> None:
    """``tenants.b`` removed, then a rejected record of ``tenants.b``: compaction keeps the
    rejected one alone under the key, so a component started afterwards had b again, from an
    older record of every tenant's, where the running ones had none. Before, nothing was written
    again for a removed entry."""
    history = [_set("tenants", {"acme": ACME, "b": ACME}, T0), _set("tenants.b", None, T0 + 10),
               _set("tenants.b", "bad", T0 + 20)]
    live = LiveConfig("router-0")
    _read(live, history)
    (again,) = live.to_restore(T0 + 30)
    assert (again.key, again.value, again.in_force_since_ms) == ("tenants.b", None, T0 + 10)
    restarted = LiveConfig("router-1")  # each key's newest: every tenant's, and b's written again
    _read(restarted, [history[0], again])
    assert sorted(restarted.config.tenants) == sorted(live.config.tenants) == ["acme"]
