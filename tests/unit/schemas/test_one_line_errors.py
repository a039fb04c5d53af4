"""A refused setting reads as the rule it broke: pydantic's wrapping of a validator's own
message ("Value error, ..."), and the "value" it names a rule of the whole configuration by,
say nothing to the operator."""

import pytest
from pydantic import ValidationError

from schemas.config import GovernorConfig
from schemas.errors import one_line


def _refusal(config: GovernorConfig, key: str, value) -> str:
    with pytest.raises(ValidationError) as refused:
        config.with_setting(key, value)
    return one_line(refused.value)


def test_a_rule_across_sections_reads_as_its_own_message():
    config = GovernorConfig().with_setting("shedding.kv_high", 0.5)
    assert _refusal(config, "autoscaler.enabled", True) == (
        "shedding.kv_high (0.5) must be above autoscaler.target_utilisation (0.6) while the "
        "autoscaler is enabled: the fleet would shed work before a worker is added")


def test_a_rule_of_a_section_names_the_section_and_not_pydantics_wrapping():
    said = _refusal(GovernorConfig(), "shedding.low", 0.6)
    assert said == "shedding: low (0.6) must be below high (0.5): the level holds between them"


def test_a_field_limit_keeps_its_field_and_limit():
    said = _refusal(GovernorConfig(), "retry_budget_ratio", 2)
    assert said == "retry_budget_ratio: Input should be less than or equal to 1"
