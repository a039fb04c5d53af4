"""Tests of schemas.config: GovernorConfig defaults, ``with_setting`` and the ConfigSet record."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.codec import DecodeError, decode, encode
from schemas.config import (DEFAULT_GPU_PRICES_USD_PER_HOUR, ConfigSet, GovernorConfig, check_key,
                            setting_names)
from schemas.limits import MAX_EPOCH_MS, MAX_MAP_ENTRIES, MAX_POOL_CHARS
from schemas.topics import TopicCatalog

CONFIG_TOPIC = TopicCatalog().spec("governor.config")


def test_defaults() -> None:
    config = GovernorConfig()
    assert config.slo.ttft_slo_s == 2.0
    assert config.slo.deadline_s == 60.0
    assert config.tenants == {}
    assert config.gpu_prices_usd_per_hour == DEFAULT_GPU_PRICES_USD_PER_HOUR
    assert config.routing_policy == "governor"
    assert config.worker_heartbeat_timeout_s == 3.0


def test_default_prices_are_not_shared_between_instances() -> None:
    a = GovernorConfig()
    a.gpu_prices_usd_per_hour["a100"] = 99.0
    fresh = GovernorConfig().gpu_prices_usd_per_hour
    assert fresh["a100"] == DEFAULT_GPU_PRICES_USD_PER_HOUR["a100"]


@pytest.mark.parametrize(
    ("key", "value", "read"),
    [
        ("slo.ttft_slo_s", 0.5, lambda c: c.slo.ttft_slo_s),
        ("slo.deadline_s", 120, lambda c: c.slo.deadline_s),
        ("slo", {"ttft_slo_s": 1.0, "deadline_s": 5.0},
         lambda c: (c.slo.ttft_slo_s, c.slo.deadline_s)),
        ("worker_heartbeat_timeout_s", 1.5, lambda c: c.worker_heartbeat_timeout_s),
        ("routing_policy", "kv_aware", lambda c: c.routing_policy),
        ("gpu_prices_usd_per_hour.b200", 5.5, lambda c: c.gpu_prices_usd_per_hour["b200"]),
        ("gpu_prices_usd_per_hour.h100", 2.25, lambda c: c.gpu_prices_usd_per_hour["h100"]),
        ("tenants.acme", {"requests_per_s": 5, "tokens_per_s": 100},
         lambda c: (c.tenants["acme"].requests_per_s, c.tenants["acme"].burst_s)),
        ("autoscaler.pools.h100@llama-3-8b", {"max_replicas": 0},
         lambda c: c.autoscaler.bounds("h100@llama-3-8b")),
        ("autoscaler.pools.h100@llama-3.1-8b", {"max_replicas": 0},
         lambda c: c.autoscaler.bounds("h100@llama-3.1-8b")),
        ("tenants.team.search", {"requests_per_s": 5, "tokens_per_s": 100},
         lambda c: (c.tenants["team.search"].requests_per_s, c.tenants["team.search"].burst_s)),
    ],
)
def test_with_setting_sets_the_value(key: str, value: Any, read: Any) -> None:
    before = GovernorConfig()
    after = before.with_setting(key, value)
    expected = {
        "slo": (1.0, 5.0),
        "tenants.acme": (5.0, 2.0),
        "autoscaler.pools.h100@llama-3-8b": (0, 0),
        "autoscaler.pools.h100@llama-3.1-8b": (0, 0),
        "tenants.team.search": (5.0, 2.0),
    }.get(key, value)
    assert read(after) == expected
    assert after != before
    assert before == GovernorConfig(), "with_setting must not change the original"


def test_with_setting_keeps_the_other_settings() -> None:
    config = GovernorConfig().with_setting("slo.deadline_s", 30.0)
    config = config.with_setting("gpu_prices_usd_per_hour.b200", 6.0)
    config = config.with_setting("slo.ttft_slo_s", 1.0)
    assert config.slo.deadline_s == 30.0
    assert config.slo.ttft_slo_s == 1.0
    assert config.gpu_prices_usd_per_hour == {**DEFAULT_GPU_PRICES_USD_PER_HOUR, "b200": 6.0}


def test_with_setting_changes_a_field_of_an_existing_tenant() -> None:
    config = GovernorConfig().with_setting("tenants.acme", {"requests_per_s": 5, "tokens_per_s": 9})
    config = config.with_setting("tenants.acme.burst_s", 7.0)
    assert config.tenants["acme"].burst_s == 7.0
    assert config.tenants["acme"].requests_per_s == 5
    pool = "h100@llama-3.1-8b"
    config = config.with_setting(f"autoscaler.pools.{pool}", {"max_replicas": 4})
    config = config.with_setting(f"autoscaler.pools.{pool}.min_replicas", 2)
    assert config.autoscaler.bounds(pool) == (2, 4)
    # a name with a dot whose first part is an entry, the rest no field of it: an entry too
    config = config.with_setting("tenants.acme.eu", {"requests_per_s": 1, "tokens_per_s": 1})
    assert config.tenants["acme.eu"].requests_per_s == 1 and "acme" in config.tenants
    config = config.with_setting("tenants.acme.eu.burst_s", 3.0)
    assert config.tenants["acme.eu"].burst_s == 3.0 and config.tenants["acme"].burst_s == 7.0


def test_null_removes_an_entry_of_a_map_and_only_an_entry() -> None:
    """An operator could add a tenant's limit, a pool's bounds, a price or a weight one at a
    time but not take one away (``tenants.acme null`` was refused: "Input should be an
    object"), short of setting the whole map again."""
    pool = "h100@llama-3.1-8b"
    config = (GovernorConfig()
              .with_setting("tenants.acme", {"requests_per_s": 5, "tokens_per_s": 9})
              .with_setting("tenants.gold", {"requests_per_s": 50, "tokens_per_s": 90})
              .with_setting(f"autoscaler.pools.{pool}", {"min_replicas": 2})
              .with_setting("router_weights.prefix", 4.0))
    assert set(config.with_setting("tenants.acme", None).tenants) == {"gold"}
    assert config.with_setting(f"autoscaler.pools.{pool}", None).autoscaler.bounds(pool) == (0, 16)
    assert config.with_setting("router_weights.prefix", None).router_weights == {}
    assert "h100" not in config.with_setting("gpu_prices_usd_per_hour.h100",
                                             None).gpu_prices_usd_per_hour
    with pytest.raises(KeyError, match="no entry 'ghost' to remove under 'tenants'"):
        config.with_setting("tenants.ghost", None)
    for key, field in (("tenants.acme.burst_s", "burst_s"), ("slo", "slo"),
                       ("slo.ttft_slo_s", "ttft_slo_s"), ("tenants", "tenants")):
        with pytest.raises(ValidationError, match=field):  # a field or a section: no entry
            config.with_setting(key, None)


@pytest.mark.parametrize(("key", "whole"), [
    ("tenants.acme.priority",
     """tenants.acme '{"requests_per_s": ..., "tokens_per_s": ..., "priority": ...}'"""),
    ("tenants.acme.tokens_per_s", """tenants.acme '{"requests_per_s": ..., "tokens_per_s": ...}'"""),
    ("autoscaler.pools.h100@m.min_replicas", """autoscaler.pools.h100@m '{"min_replicas": ...}'""")])
def test_a_field_of_an_entry_not_there_says_to_add_the_entry_whole(key: str, whole: str) -> None:
    """``config set tenants.acme.priority 5``, as its help suggests, was refused with "no entry
    'acme'" alone, which did not say that a new tenant is set whole, nor with which fields."""
    entry = key.rpartition(".")[0]
    with pytest.raises(KeyError) as raised:
        GovernorConfig().with_setting(key, 5)
    assert raised.value.args[0] == (
        f"no setting named {key!r}: {entry.rpartition('.')[0]} has no entry "
        f"{entry.rpartition('.')[2]!r} (add it whole first: governor config set {whole})")


@pytest.mark.parametrize(
    "key",
    ["", "nope", "slo.nope", "slo.ttft_slo_s.deeper", "nope.ttft_slo_s", "tenants.ghost.burst_s",
     "routing_policy.x", ".slo", "slo."],
)
def test_with_setting_rejects_unknown_keys(key: str) -> None:
    with pytest.raises(KeyError, match="no setting named"):
        GovernorConfig().with_setting(key, 1.0)


@pytest.mark.parametrize(("key", "hint"), [
    ("retry_budget.ratio", "did you mean retry_budget_ratio?"),
    ("autoscaler.target_utilization", "did you mean autoscaler.target_utilisation?"),
    ("slo.bogus", "slo has slo.ttft_slo_s, slo.deadline_s"),
    ("nosuch.key", "`governor config get` lists them")])
def test_an_unknown_key_is_told_the_settings_most_like_it(key: str, hint: str) -> None:
    # (it was told only that no setting had its name)
    for check in (lambda: GovernorConfig().with_setting(key, 1.0), lambda: check_key(key),
                  lambda: GovernorConfig().setting(key)):
        with pytest.raises(KeyError) as raised:
            check()
        assert raised.value.args[0] == f"no setting named {key!r} ({hint})"


def test_setting_names_are_every_setting_and_the_maps_by_their_own_name() -> None:
    names = setting_names()
    assert {"slo.ttft_slo_s", "retry_budget_ratio", "tenants", "autoscaler.pools",
            "autoscaler.target_utilisation"} <= set(names)
    for name in names:  # each is a setting
        GovernorConfig().setting(name)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("slo.ttft_slo_s", -1.0, "slo.ttft_slo_s"),
        ("slo.ttft_slo_s", 0, "slo.ttft_slo_s"),
        ("slo.ttft_slo_s", math.nan, "slo.ttft_slo_s"),
        ("slo.deadline_s", 86_401, "slo.deadline_s"),
        ("slo.deadline_s", "soon", "slo.deadline_s"),
        ("worker_heartbeat_timeout_s", -3, "worker_heartbeat_timeout_s"),
        ("routing_policy", "random", "routing_policy"),
        ("gpu_prices_usd_per_hour.b200", "cheap", "gpu_prices_usd_per_hour.b200"),
        ("gpu_prices_usd_per_hour.b200", math.inf, "gpu_prices_usd_per_hour.b200"),
        ("gpu_prices_usd_per_hour.b200", -1.0, "gpu_prices_usd_per_hour.b200"),
        ("gpu_prices_usd_per_hour.b200", 1e308, "gpu_prices_usd_per_hour.b200"),
        ("autoscaler.min_replicas", 17, "min_replicas (17) must be at most max_replicas (16)"),
        ("autoscaler.pools.h100", {"max_replicas": 2},
         "pools: 'h100' is no pool name: expected GPU@MODEL"),
        ("autoscaler.pools.@llama-3-8b", {"max_replicas": 2}, "is no pool name"),
        ("autoscaler.pools.H100@llama-3-8b", {"max_replicas": 2},
         "a pool's GPU type is lower case, as its workers report it: h100@llama-3-8b"),
        ("autoscaler.pools.H100@llama-2-70b", {"gpus": 4}, "h100@llama-2-70b"),
        ("gpu_prices_usd_per_hour.bad name", 1.0, "gpu_prices_usd_per_hour"),
        ("tenants.acme", {"requests_per_s": -5, "tokens_per_s": 100},
         "tenants.acme.requests_per_s"),
        ("tenants.acme", {"requests_per_s": 5}, "tenants.acme.tokens_per_s"),
        ("slo", {"ttft_slo_s": 1.0, "extra": 1}, "slo.extra"),
    ],
)
def test_with_setting_rejects_bad_values_naming_the_field(key: str, value: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        GovernorConfig().with_setting(key, value)
    assert field in str(info.value)


def test_config_is_frozen_and_strict() -> None:
    with pytest.raises(ValidationError):
        GovernorConfig(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="frozen"):
        GovernorConfig().routing_policy = "round_robin"  # type: ignore[misc]


# --- ConfigSet ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [1, 2.5, "text", None, True, [1, "a", None], {"a": {"b": [1.5, False]}}]
)
def test_config_set_carries_any_json_value(value: Any) -> None:
    record = ConfigSet(event_time_ms=1, key="slo.ttft_slo_s", value=value)
    back = decode(CONFIG_TOPIC, encode(record))
    assert back.value == value
    assert back.set_by == "operator"


@pytest.mark.parametrize(
    ("key", "ok"),
    [("slo.ttft_slo_s", True), ("gpu_prices_usd_per_hour.b200", True), ("a:b-c_d", True),
     ("", False), ("has space", False), ("k" * 257, False), ("k" * 256, True), ("x/y", True),
     ("autoscaler.pools.h100@meta-llama/Llama-3-8B", True), ("a=b", False),
     ("line\n", False)],
)
def test_config_set_key(key: str, ok: bool) -> None:
    if ok:
        assert ConfigSet(event_time_ms=1, key=key, value=1).key == key
    else:
        with pytest.raises(ValidationError, match="key"):
            ConfigSet(event_time_ms=1, key=key, value=1)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"[1, NaN]",
                                     b'{"a": Infinity}'])
def test_config_set_from_the_wire_rejects_non_finite_numbers(literal: bytes) -> None:
    """NaN and infinity are rejected on every float, including inside a JSON value: they would
    not survive a re-encode (JSON has no such numbers) and no setting accepts them."""
    raw = b'{"type":"config_set","event_time_ms":1,"key":"slo.ttft_slo_s","value":' + literal + b"}"
    with pytest.raises(DecodeError) as info:
        decode(CONFIG_TOPIC, raw)
    assert info.value.reason == "schema_violation"
    assert "value" in info.value.detail


@pytest.mark.parametrize("value", [math.nan, math.inf, [1.0, -math.inf], {"a": {"b": math.nan}}])
def test_config_set_in_python_rejects_non_finite_numbers(value: Any) -> None:
    with pytest.raises(ValidationError, match="value"):
        ConfigSet(event_time_ms=1, key="k", value=value)


def test_a_setting_is_read_by_the_keys_that_set_it() -> None:
    pool = "h100@llama-3.1-8b"
    config = GovernorConfig().with_setting(f"autoscaler.pools.{pool}", {"max_replicas": 4})
    config = config.with_setting("tenants.team.search", {"requests_per_s": 5, "tokens_per_s": 9})
    assert config.setting(f"autoscaler.pools.{pool}") == {"min_replicas": None, "max_replicas": 4}
    assert config.setting(f"autoscaler.pools.{pool}.max_replicas") == 4
    assert config.setting("tenants.team.search.requests_per_s") == 5
    assert config.setting("slo.ttft_slo_s") == GovernorConfig().slo.ttft_slo_s
    for key in ("autoscaler.pools.h100@nope", "tenants.ghost.burst_s", "slo.nope", "nope"):
        with pytest.raises(KeyError):
            config.setting(key)


def test_shedding_on_kv_use_must_start_above_the_autoscalers_target_while_it_scales() -> None:
    scaling = GovernorConfig().with_setting("autoscaler.enabled", True)
    assert scaling.with_setting("shedding.kv_high", 0.7).shedding.kv_high == 0.7
    with pytest.raises(ValidationError, match=r"shedding.kv_high \(0.6\) must be above "
                                              r"autoscaler.target_utilisation \(0.6\)"):
        scaling.with_setting("shedding.kv_high", 0.6)
    with pytest.raises(ValidationError, match="shedding.kv_high"):
        scaling.with_setting("shedding.kv_high", 0.5).with_setting("autoscaler.enabled", False)
    fixed = GovernorConfig().with_setting("shedding.kv_high", 0.5)  # no autoscaler: any level
    assert fixed.shedding.kv_high == 0.5
    with pytest.raises(ValidationError, match="while the autoscaler is enabled"):
        fixed.with_setting("autoscaler.enabled", True)


@pytest.mark.parametrize(("key", "value"), [
    ("breaker.consecutive", True), ("slo.ttft_slo_s", "2.5"), ("autoscaler.enabled", 1),
    ("breaker.min_outcomes", 4.0),
])
def test_a_setting_of_the_wrong_json_type_is_refused_not_coerced(key, value) -> None:
    """As the topics' records are decoded: before 5 Dec `true` was taken for 1, "2.5" for
    2.5, 1 for true and 4.0 for 4."""
    with pytest.raises(ValidationError, match=key.split(".")[-1]):
        GovernorConfig().with_setting(key, value)


def test_an_integer_is_a_number_for_a_float_setting() -> None:
    assert GovernorConfig().with_setting("slo.ttft_slo_s", 3).slo.ttft_slo_s == 3.0


def test_a_heartbeat_timeout_is_at_least_two_of_the_workers_heartbeats() -> None:
    """At 0.3 s (accepted before 6 Dec) the router took live workers, heard every 0.5 s, for
    gone between two heartbeats: on ``governor up`` at 4 requests/s it moved 11 requests from
    worker to worker and failed 17 ``retry_budget_exhausted`` in 15 s."""
    import inspect

    from schemas.config import WORKER_HEARTBEAT_S
    from workers.service import WorkerService

    assert inspect.signature(WorkerService).parameters["status_interval_s"].default \
        == WORKER_HEARTBEAT_S
    floor = GovernorConfig().with_setting("worker_heartbeat_timeout_s", 1)
    assert floor.worker_heartbeat_timeout_s == 1
    with pytest.raises(ValidationError, match=r"worker_heartbeat_timeout_s\n.*greater than or "
                                              r"equal to 1"):
        GovernorConfig().with_setting("worker_heartbeat_timeout_s", 0.3)


def test_a_default_ttft_target_past_the_default_deadline_is_refused() -> None:
    """A trace row saying so is refused by the loader; before 6 Dec the setting was taken."""
    with pytest.raises(ValueError, match=r"ttft_slo_s \(100\) must not exceed deadline_s \(60\)"):
        GovernorConfig().with_setting("slo.ttft_slo_s", 100)
    raised = GovernorConfig().with_setting("slo.deadline_s", 120).with_setting("slo.ttft_slo_s", 100)
    assert (raised.slo.ttft_slo_s, raised.slo.deadline_s) == (100, 120)


_SINCE = 1_700_000_000_000


def _restoring(entries: Any) -> bytes:
    return (b'{"type":"config_set","schema_version":1,"event_time_ms":1700000000000,'
            b'"key":"tenants","value":{},"set_by":"governor-restore",'
            b'"in_force_since_ms":1700000000000,"entries_since_ms":'
            + json.dumps(entries).encode() + b"}")


@pytest.mark.parametrize(("entries", "limit"), [
    ({f"t{i}": _SINCE for i in range(MAX_MAP_ENTRIES + 1)}, "at most 1024 items"),
    ({"p" * (MAX_POOL_CHARS + 1): _SINCE}, "at most 129 characters"),
    ({"": _SINCE}, "at least 1 character"),
    ({"a b": _SINCE}, "should match pattern"),
    ({"a": MAX_EPOCH_MS + 1}, f"less than or equal to {MAX_EPOCH_MS}"),
    ({"a": -1}, "greater than or equal to 0"),
])
def test_entries_since_ms_just_past_each_limit_is_dead_lettered_naming_it(
        entries: dict, limit: str) -> None:
    """Its number of entries, their names (a pool's, the longest a map has) and their times are
    bounded as every field that crosses a topic is (before 6 Dec: any number of entries)."""
    spec = TopicCatalog("t").spec(TopicCatalog("t").config)
    with pytest.raises(DecodeError) as info:
        decode(spec, _restoring(entries))
    assert "entries_since_ms" in str(info.value) and limit in str(info.value), info.value


@pytest.mark.parametrize("entries", [
    {f"t{i}": _SINCE for i in range(MAX_MAP_ENTRIES)}, {"p" * MAX_POOL_CHARS: MAX_EPOCH_MS},
    {"a": 0}])
def test_entries_since_ms_at_its_limits_is_read(entries: dict) -> None:
    spec = TopicCatalog("t").spec(TopicCatalog("t").config)
    assert decode(spec, _restoring(entries)).entries_since_ms == entries
