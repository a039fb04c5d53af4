"""Tests of controllers.live_config.LiveConfig: applied and rejected verdicts, last good config."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.live_config import LiveConfig
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
