"""``GovernorConfig.with_setting`` validates a change as validating the whole configuration
would, but for the maps no validator reads beyond an entry (``_SELF_CONTAINED``: tenants, GPU
prices, scorer weights), of which it validates only the entry a change sets. Before, each record
dumped and validated every tenant: with 1,000 tenants one record cost 5 ms of CPU in every
router and controllers process, a restart reading them 2.9 s, ``governor config set`` 3.9 s
(``python -m benchmarks.live_config_apply``). Here: the work of one tenant's record does not
grow with the tenants configured, and on random changes the result, or the error, is the one
validating the whole configuration gives."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import config as config_module
from schemas.config import GovernorConfig
from schemas.limits import MAX_MAP_ENTRIES
from tests.config_changes import BASE, SHAPE, changes, many_tenants, tenants_looked_at

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

def _outcome(config: GovernorConfig, key: str, value: Any, missing_ok: bool) -> Any:
    """What ``with_setting`` gives: the configuration, as JSON in its order, or the error."""
    try:
        changed = config.with_setting(key, value, missing_ok=missing_ok)
    except (KeyError, ValidationError) as exc:
        return type(exc), str(exc)
    return changed, json.dumps(changed.model_dump(mode="json"))


def _whole(config: GovernorConfig, key: str, value: Any, missing_ok: bool) -> Any:
    """The reference: the whole configuration validated, as before (no map kept apart)."""
    with mock.patch.object(config_module, "_SELF_CONTAINED", ()):
        return _outcome(config, key, value, missing_ok)


def _read(config: GovernorConfig, key: str) -> Any:
    try:
        return config.setting(key)
    except KeyError as exc:
        return str(exc)


@SETTINGS
@given(history=st.lists(st.tuples(changes, st.booleans()), min_size=1, max_size=12))
# (a model declared again in another case: its pool takes the later one's heads, 8, not 6)
@example(history=[(("models.tiny", {**SHAPE, "n_heads": 6, "n_kv_heads": 3}), False)])
@example(history=[(("tenants.b", None), False), (("tenants.b.x.priority", 9), False)])
def test_a_change_gives_what_validating_the_whole_configuration_gives(history) -> None:
    config = BASE
    for (key, value), missing_ok in history:
        outcome = _outcome(config, key, value, missing_ok)
        assert outcome == _whole(config, key, value, missing_ok), (key, value)
        with mock.patch.object(config_module, "_SELF_CONTAINED", ()):
            whole_read = _read(config, key)
        assert _read(config, key) == whole_read
        if isinstance(outcome[0], GovernorConfig):
            config = outcome[0]


@pytest.mark.parametrize(("key", "entry", "most"), [
    ("tenants", {"requests_per_s": 1, "tokens_per_s": 1}, MAX_MAP_ENTRIES),
    ("gpu_prices_usd_per_hour", 1.0, MAX_MAP_ENTRIES),
    ("router_weights", 1.0, 64),
])
def test_an_entry_past_a_full_map_is_refused_as_validating_it_whole_refuses_it(key, entry, most):
    full = GovernorConfig().with_setting(key, {f"e{n}": entry for n in range(most)})
    outcome = _outcome(full, f"{key}.one-more", entry, False)
    assert outcome[0] is ValidationError and f"at most {most} items" in outcome[1]
    assert outcome == _whole(full, f"{key}.one-more", entry, False)
    assert _outcome(full, f"{key}.e3", entry, False) == _whole(full, f"{key}.e3", entry, False)


@pytest.mark.parametrize(("key", "value"), [
    ("tenants.t-7.requests_per_s", 20.0),
    ("tenants.t-7", {"requests_per_s": 20.0, "tokens_per_s": 1e4, "priority": 3}),
    ("tenants.new", {"requests_per_s": 20.0, "tokens_per_s": 1e4}),
    ("tenants.t-7", None),
    ("tenants.t-7.priority", 10),  # (refused)
    ("shedding.low", 0.1),
])
def test_one_change_dumps_and_validates_no_other_tenant_of_a_thousand(monkeypatch, key, value):
    config = many_tenants(1_000)
    looked_at = tenants_looked_at(monkeypatch)
    try:
        config.with_setting(key, value).setting(key)
    except (KeyError, ValidationError):  # (removed; refused)
        pass
    assert len(looked_at) <= 3, f"{len(looked_at)} tenants' limits dumped or validated"
