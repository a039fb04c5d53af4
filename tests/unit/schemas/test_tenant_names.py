"""A tenant's name is one a configuration key can address: ``tenants.b.burst_s`` is tenant
``b``'s ``burst_s``, so a tenant named ``b.burst_s`` (a name ending in ``.`` and a field of its
limits) could be set only whole, and a record of ``tenants.b.burst_s`` read as setting either.
Such a name is refused where tenants are given limits: the configuration's ``tenants`` and an
operator's ``SetAdmissionLimits``. Before 6 Dec both took it."""

import pytest
from pydantic import ValidationError

from schemas.commands import SetAdmissionLimits, TenantLimit
from schemas.config import GovernorConfig

T0 = 1_700_000_000_000
LIMIT = {"requests_per_s": 1, "tokens_per_s": 1e6}
AMBIGUOUS = [f"b.{field}" for field in TenantLimit.model_fields] + ["org.team.priority"]


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_a_tenant_named_as_a_field_of_another_is_refused_in_the_configuration(name) -> None:
    with pytest.raises(ValidationError) as info:
        GovernorConfig().with_setting("tenants", {name: LIMIT})
    assert "tenants" in str(info.value) and f"tenant name {name!r} ends in" in str(info.value)


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_a_tenant_named_as_a_field_of_another_is_refused_in_a_command(name) -> None:
    with pytest.raises(ValidationError) as info:
        SetAdmissionLimits(event_time_ms=T0, command_id="c", limits={name: LIMIT})
    assert "limits" in str(info.value) and f"tenants.{name}" in str(info.value)


@pytest.mark.parametrize("name", ["b", "b.x", "team.alpha", "org/a.b", "b.burst", "burst_s",
                                  "b.priority2"])
def test_other_names_with_dots_are_taken_and_addressed_by_their_key(name) -> None:
    config = GovernorConfig().with_setting(f"tenants.{name}", LIMIT)
    assert config.with_setting(f"tenants.{name}.priority", 3).tenants[name].priority == 3
    assert SetAdmissionLimits(event_time_ms=T0, command_id="c", limits={name: LIMIT})
