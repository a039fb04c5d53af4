"""Tests of controllers.live_config.LiveConfig: applied and rejected verdicts, last good config."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.live_config import RESTORED_BY, LiveConfig
from controllers.router.core import RouterCore
from schemas.config import ConfigSet, GovernorConfig
from schemas.events import ConfigApplied, ConfigRejected

T0 = 1_700_000_000_000


def _set(key: str, value: Any) -> ConfigSet:
    return ConfigSet(event_time_ms=T0, key=key, value=value)


@pytest.mark.parametrize(
    ("key", "value", "read", "expected"),
    [
        ("routing_policy", "least_loaded", lambda c: c.routing_policy, "least_loaded"),
        ("slo.ttft_slo_s", 0.5, lambda c: c.slo.ttft_slo_s, 0.5),
        ("breaker.cooldown_s", 30, lambda c: c.breaker.cooldown_s, 30.0),
        ("router_weights.prefix", 4.0, lambda c: c.router_weights["prefix"], 4.0),
        ("gpu_prices_usd_per_hour.b200", 6.5, lambda c: c.gpu_prices_usd_per_hour["b200"], 6.5),
        ("tenants.acme", {"requests_per_s": 5, "tokens_per_s": 1000},
         lambda c: (c.tenants["acme"].requests_per_s, c.tenants["acme"].burst_s), (5.0, 2.0)),
    ],
)
def test_a_valid_setting_is_applied(key: str, value: Any, read, expected: Any) -> None:
    live = LiveConfig("router-0")
    verdict = live.apply(_set(key, value), offset=7, now_ms=T0 + 1)
    assert isinstance(verdict, ConfigApplied)
    assert (verdict.key, verdict.component, verdict.config_offset, verdict.event_time_ms) == (
        key, "router-0", 7, T0 + 1)
    assert read(live.config) == expected
    assert live.config != GovernorConfig()  # the setting changed something


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("slo.ttft_slo_s", -1, "ttft_slo_s"),
        ("breaker.itl_ratio", 0.5, "itl_ratio"),
        ("retry_budget_ratio", 2.0, "retry_budget_ratio"),
        ("routing_policy", "fastest", "routing_policy"),
        ("router_weights.prefix", -3, "prefix"),
        ("no_such_setting", 1, "no_such_setting"),
        ("slo.nope", 1, "slo.nope"),
        ("nothing.here.at_all", 1, "nothing.here.at_all"),
    ],
)
def test_a_bad_setting_is_rejected_naming_it(key: str, value: Any, named: str) -> None:
    live = LiveConfig("router-0")
    before = live.config
    verdict = live.apply(_set(key, value), offset=3, now_ms=T0)
    assert isinstance(verdict, ConfigRejected)
    assert named in verdict.reason
    assert (verdict.key, verdict.config_offset) == (key, 3)
    assert live.config is before


def test_the_check_callback_rejects_and_the_last_good_config_stays() -> None:
    def check(config: GovernorConfig) -> None:
        if config.slo.ttft_slo_s > 5:
            raise ValueError("ttft target above 5 s is not allowed here")

    live = LiveConfig("c", check=check)
    assert isinstance(live.apply(_set("slo.ttft_slo_s", 3), 0, T0), ConfigApplied)
    verdict = live.apply(_set("slo.ttft_slo_s", 9), 1, T0)
    assert isinstance(verdict, ConfigRejected)
    assert verdict.reason == "ttft target above 5 s is not allowed here"
    assert live.config.slo.ttft_slo_s == 3
    # later records apply on top of the last good config
    assert isinstance(live.apply(_set("slo.deadline_s", 30), 2, T0), ConfigApplied)
    assert (live.config.slo.ttft_slo_s, live.config.slo.deadline_s) == (3, 30)


def test_the_router_rejects_an_unknown_scorer_weight() -> None:
    live = LiveConfig("router-0", check=RouterCore().apply_config)
    verdict = live.apply(_set("router_weights.speeed", 1.0), 0, T0)
    assert isinstance(verdict, ConfigRejected)
    assert "speeed" in verdict.reason
    assert live.config.router_weights == {}
    assert isinstance(live.apply(_set("router_weights.price", 3.0), 1, T0), ConfigApplied)


def test_a_new_ttft_slo_reaches_every_controller_that_judges_by_it() -> None:
    from controllers.service import ControllersService
    from schemas.topics import TopicCatalog

    controllers = ControllersService("127.0.0.1:1", TopicCatalog("unit"))
    controllers.apply_config(GovernorConfig().with_setting("slo.ttft_slo_s", 0.5))
    assert (controllers.shedding.ttft_slo_s, controllers.weights.ttft_slo_s,
            controllers.autoscaler.ttft_slo_s) == (0.5, 0.5, 0.5)


def test_a_record_whose_kafka_key_is_not_its_setting_is_rejected() -> None:
    live = LiveConfig("router-0")
    verdict = live.apply(_set("slo.deadline_s", 45), offset=4, now_ms=T0,
                         record_key=b"slo.ttft_slo_s")
    assert isinstance(verdict, ConfigRejected)
    assert "the record's key 'slo.ttft_slo_s' is not the setting it sets, 'slo.deadline_s'" \
        in verdict.reason
    assert live.config == GovernorConfig()
    assert isinstance(live.apply(_set("slo.deadline_s", 45), 5, T0, b"slo.deadline_s"),
                      ConfigApplied)


def test_the_value_in_force_is_written_where_a_rejected_record_would_shadow_a_good_one() -> None:
    """Compaction keeps a key's newest record: a rejected one would take the place of the good
    one before it."""
    live = LiveConfig("router-0")
    good = _set("breaker.itl_ratio", 4.0)
    live.apply(good, 0, T0, b"breaker.itl_ratio")
    live.apply(_set("breaker.itl_ratio", -1), 1, T0, b"breaker.itl_ratio")
    live.apply(_set("slo.deadline_s", 45), 2, T0, b"breaker.itl_ratio")  # (a key not its own)
    live.apply(_set("slo.nope", 1), 3, T0, b"slo.nope")  # nothing good before it: nothing to do
    (restored,) = live.to_restore(T0 + 5)
    assert (restored.key, restored.value, restored.set_by, restored.event_time_ms) == (
        "breaker.itl_ratio", 4.0, RESTORED_BY, T0 + 5)
    assert live.to_restore(T0 + 6) == []  # once
    assert live.config.breaker.itl_ratio == 4.0


def test_a_key_set_well_again_after_a_rejected_record_needs_nothing_written() -> None:
    live = LiveConfig("router-0")
    live.apply(_set("breaker.itl_ratio", 4.0), 0, T0, b"breaker.itl_ratio")
    live.apply(_set("breaker.itl_ratio", -1), 1, T0, b"breaker.itl_ratio")
    live.apply(_set("breaker.itl_ratio", 5.0), 2, T0, b"breaker.itl_ratio")
    assert live.to_restore(T0) == []


def test_a_restoring_record_that_is_rejected_in_turn_is_not_restored_again() -> None:
    """A setting good once may be refused later (the router's check reads other settings):
    written again it is rejected, and two routers each writing again the other's would go on
    for ever."""
    refuse = {"now": False}

    def check(_config: GovernorConfig) -> None:
        if refuse["now"]:
            raise ValueError("refused now")

    live = LiveConfig("router-0", check=check)
    live.apply(_set("breaker.itl_ratio", 4.0), 0, T0, b"breaker.itl_ratio")
    refuse["now"] = True
    restoring = ConfigSet(event_time_ms=T0, key="breaker.itl_ratio", value=4.0,
                          set_by=RESTORED_BY)  # (another router's: the same marker)
    assert isinstance(live.apply(restoring, 1, T0, b"breaker.itl_ratio"), ConfigRejected)
    assert live.to_restore(T0) == []


def test_what_is_written_again_is_the_value_in_force_not_the_shadowed_record() -> None:
    """A later record of the whole section changed the key's value: writing the old record
    again would change the configuration in force (from a review: an autoscaler cap lowered by
    a record every component rejected)."""
    live = LiveConfig("router-0")
    live.apply(_set("autoscaler.max_replicas", 8), 0, T0, b"autoscaler.max_replicas")
    section = live.config.autoscaler.model_dump(mode="json") | {"max_replicas": 20}
    live.apply(_set("autoscaler", section), 1, T0, b"autoscaler")
    live.apply(_set("autoscaler.max_replicas", -1), 2, T0, b"autoscaler.max_replicas")
    (restored,) = live.to_restore(T0)
    assert (restored.key, restored.value) == ("autoscaler.max_replicas", 20)
    assert isinstance(live.apply(restored, 3, T0, b"autoscaler.max_replicas"), ConfigApplied)
    assert live.config.autoscaler.max_replicas == 20 and live.to_restore(T0) == []


def test_a_value_written_again_says_since_when_it_has_been_in_force() -> None:
    """Written now, it restates a setting made earlier: a router weighs it against the commands
    made since by that time (a restarted router, reading it alone after compaction, took it for
    a change made after a newer ``SetAdmissionLimits``). A record of the key or its section
    counts, setting the value it had too (it ends a command as a change does); one of another
    key does not; a restoring record read back passes its time on."""
    def at(ms: int, key: str, value: Any) -> ConfigSet:
        return ConfigSet(event_time_ms=T0 + ms, key=key, value=value)

    live = LiveConfig("router-0")
    for offset, record in enumerate([
            at(1, "autoscaler.max_replicas", 8),
            at(2, "autoscaler", live.config.autoscaler.model_dump(mode="json")
               | {"max_replicas": 8}),  # (the same value)
            at(3, "autoscaler.min_replicas", 2),  # (another key of the section)
            at(4, "autoscaler.max_replicas", -1),
            at(5, "shedding.low", 0.1), at(6, "shedding.low", -1)]):
        live.apply(record, offset, T0, record.key.encode())
    restored = {r.key: r for r in live.to_restore(T0 + 7)}
    assert {key: (r.event_time_ms, r.in_force_since_ms) for key, r in restored.items()} == {
        "autoscaler.max_replicas": (T0 + 7, T0 + 2), "shedding.low": (T0 + 7, T0 + 5)}
    reader = LiveConfig("started-after-compaction")
    reader.apply(restored["shedding.low"], 0, T0, b"shedding.low")
    reader.apply(at(8, "shedding.low", -1), 1, T0, b"shedding.low")
    (again,) = reader.to_restore(T0 + 9)
    assert (again.value, again.in_force_since_ms) == (0.1, T0 + 5)
    default = LiveConfig("router-0")  # a record of the default value sets it too
    default.apply(at(1, "slo.ttft_slo_s", GovernorConfig().slo.ttft_slo_s), 0, T0, b"slo.ttft_slo_s")
    default.apply(at(2, "slo.ttft_slo_s", -1), 1, T0, b"slo.ttft_slo_s")
    assert [r.in_force_since_ms for r in default.to_restore(T0 + 3)] == [T0 + 1]


def test_a_record_that_restates_nothing_is_written_without_in_force_since_ms() -> None:
    """A reader older than the field forbids it: every other record is written as before."""
    from schemas.codec import encode

    assert b"in_force_since_ms" not in encode(_set("slo.ttft_slo_s", 1.0))
    assert b'"in_force_since_ms":5' in encode(ConfigSet(
        event_time_ms=T0, key="slo.ttft_slo_s", value=1.0, in_force_since_ms=5))


def _compacted(records: list[tuple[bytes, ConfigSet]]) -> GovernorConfig:
    """The configuration a component started after the log cleaner ran reads: the newest record
    of each key, in offset order."""
    newest = {key: (offset, record) for offset, (key, record) in enumerate(records)}
    live = LiveConfig("started-after-compaction")
    for key, (offset, record) in sorted(newest.items(), key=lambda item: item[1][0]):
        live.apply(record, offset, T0, key)
    return live.config


@pytest.mark.parametrize("settings", [
    # the high holds only above the low of the record before it, which compaction drops
    [("shedding.low", 0.1), ("shedding.high", 0.2), ("shedding.low", 0.05)],
    # the autoscaler's target holds only below the kv_high of a record compaction drops
    [("autoscaler.enabled", True), ("shedding.kv_high", 0.95),
     ("autoscaler.target_utilisation", 0.9), ("shedding.kv_high", 0.92)],
    # the least replicas hold only under the most of a record compaction drops
    [("autoscaler.max_replicas", 20), ("autoscaler.min_replicas", 18),
     ("autoscaler.max_replicas", 19)],
])
def test_what_compaction_keeps_gives_the_configuration_in_force(settings) -> None:
    """Before, a component started once the log cleaner had run took the default high (0.5)
    where the routers had 0.2: the setting changed with nobody setting it. The writer of the
    last change (``governor config set``) writes what ``kept_otherwise`` gives after it."""
    live = LiveConfig("governor-config-cli", check=RouterCore().apply_config)
    records = [(key.encode(), _set(key, value)) for key, value in settings]
    for offset, (key, record) in enumerate(records):
        assert isinstance(live.apply(record, offset, T0, key), ConfigApplied)
    written = live.kept_otherwise(T0)
    assert written and all(record.set_by == RESTORED_BY for record in written)
    for record in written:  # written, then read back as every record is
        records.append((record.key.encode(), record))
        assert isinstance(live.apply(record, len(records) - 1, T0, record.key.encode()),
                          ConfigApplied)
    assert _compacted(records) == live.config
    assert live.kept_otherwise(T0) == []  # nothing more to write


def test_nothing_is_written_where_what_compaction_keeps_gives_the_same() -> None:
    live = LiveConfig("router-0")
    for offset, (key, value) in enumerate([("shedding.low", 0.1), ("shedding.low", 0.2),
                                           ("slo.ttft_slo_s", 1.0), ("shedding.high", 0.6)]):
        live.apply(_set(key, value), offset, T0, key.encode())
    assert live.kept_otherwise(T0) == []


def test_a_removal_read_from_the_topic_of_an_entry_not_there_changes_nothing() -> None:
    """Compaction can leave ``tenants.acme null`` as its key's only record: a component started
    then applies it as nothing to do (before 6 Dec it published a ``ConfigRejected``, "no entry
    to remove"). Outside the topic (``governor config set``'s check) it is still refused."""
    live = LiveConfig("router-0")
    verdict = live.apply(_set("tenants.acme", None), offset=3, now_ms=T0, record_key=b"tenants.acme")
    assert isinstance(verdict, ConfigApplied) and live.config == GovernorConfig()
    refused = LiveConfig("router-0").apply(_set("tenants.acme", None), offset=3, now_ms=T0)
    assert isinstance(refused, ConfigRejected) and "no entry 'acme' to remove" in refused.reason
