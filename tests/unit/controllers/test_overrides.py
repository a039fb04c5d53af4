"""The operator's ``SetAdmissionLimits`` and ``SetRetryBudget``: what holds over the
configuration, and their restatement (``controllers.overrides``), in the pure object, the
router core and the controllers. Before 6 Dec nothing restated them: a router started more than
its read-back window (600 s) after a command ran by the configuration while the routers that
had read it kept it."""

import pytest

from controllers.overrides import AHEAD_MS, RESTATE_S, RESTATED, CommandRefused, OperatorOverrides
from controllers.router.core import RouterCore
from controllers.service import ControllersService
from schemas.commands import SetAdmissionLimits, SetRetryBudget, TenantLimit
from schemas.config import ConfigSet, GovernorConfig
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000
ONE, MANY = (TenantLimit(requests_per_s=r, tokens_per_s=1e6, burst_s=1) for r in (1, 100))
RESTATE_MS = int(RESTATE_S * 1000)


def _limits(at: int = T0, command_id: str = "c1", **limits: TenantLimit) -> SetAdmissionLimits:
    return SetAdmissionLimits(event_time_ms=at, command_id=command_id, limits=limits,
                              reason="incident 42")


def _budget(at: int = T0, ratio: float = 0.0) -> SetRetryBudget:
    return SetRetryBudget(event_time_ms=at, command_id=f"b{at}", ratio=ratio, min_per_s=0.0)


def _set(config: GovernorConfig, key: str, at: int, **value) -> ConfigSet:
    """The record of the configuration topic that set ``key`` as ``config`` has it."""
    return ConfigSet(event_time_ms=at, key=key, value=value["value"] if value
                     else config.setting(key))


def test_a_command_is_restated_unchanged_but_for_its_reason_while_it_holds() -> None:
    overrides = OperatorOverrides()
    command = _limits(a=MANY)
    assert overrides.take(command, T0) and overrides.take(_budget(), T0)
    assert overrides.restatements(T0 + RESTATE_MS - 1) == []  # commanded just now
    restated = overrides.restatements(T0 + RESTATE_MS)
    assert [c.model_dump(exclude={"reason"}) for c in restated] == [
        command.model_dump(exclude={"reason"}), _budget().model_dump(exclude={"reason"})]
    assert restated[0].reason == f"{RESTATED}: incident 42"
    assert overrides.restatements(T0 + 2 * RESTATE_MS - 1) == []
    again = overrides.restatements(T0 + 2 * RESTATE_MS)
    assert again[0].reason == restated[0].reason  # (a restatement read back: not prefixed twice)
    assert not overrides.take(again[0], T0) and not overrides.take(restated[1], T0)  # the same ones


def test_a_command_read_back_long_after_it_was_commanded_is_restated_at_once() -> None:
    overrides = OperatorOverrides()
    overrides.take(_limits(a=MANY), T0)
    assert len(overrides.restatements(T0 + 10 * RESTATE_MS)) == 1


def test_nothing_is_restated_once_the_configuration_has_set_all_of_it_again() -> None:
    overrides = OperatorOverrides()
    overrides.take(_limits(a=MANY, b=MANY), T0)
    overrides.take(_budget(), T0)
    before = GovernorConfig(tenants={"a": ONE}, retry_budget_ratio=0.3)
    older = before.model_copy(update={"tenants": {"a": MANY, "b": ONE}})
    overrides.configured(before, older, _set(older, "tenants", T0 - 1))  # made before it
    assert overrides.tenant_limits(older) == {"a": MANY, "b": MANY}
    newer = older.model_copy(update={"tenants": {"a": ONE, "b": ONE}})
    overrides.configured(older, newer, _set(newer, "tenants.a", T0 + 1))  # a's, after it
    assert overrides.tenant_limits(newer) == {"a": ONE, "b": MANY}
    assert overrides.retry_budget(newer) == (0.0, 0.0)
    latest = newer.model_copy(update={"tenants": {"a": ONE}, "retry_budget_ratio": 0.5})
    overrides.configured(newer, latest, None)  # b removed, the budget changed: now
    assert overrides.tenant_limits(latest) == {"a": ONE}
    assert overrides.retry_budget(latest) == (0.5, latest.retry_budget_min_per_s)
    assert overrides.restatements(T0 + 10 * RESTATE_MS) == []
    emptied = OperatorOverrides()
    emptied.take(_limits(command_id="clear"), T0)  # an empty command holds nothing
    assert emptied.restatements(T0 + 10 * RESTATE_MS) == []


def test_a_setting_written_again_with_the_value_it_had_ends_a_command_as_a_change_does() -> None:
    """"Until the configuration sets that tenant's limit again": a record setting the limit it
    had ends the command for that tenant, as it does for a router that reads it from a
    compacted topic, where it may be the tenant's only record. Before, a live router kept the
    command (nothing changed) and a router restarted after compaction did not."""
    config = GovernorConfig(tenants={"a": ONE, "b": ONE}, retry_budget_ratio=0.3)
    overrides = OperatorOverrides()
    overrides.take(_limits(a=MANY, b=MANY), T0)
    overrides.take(_budget(), T0)
    for key in ("tenants.a.burst_s", "retry_budget_ratio"):
        overrides.configured(config, config, _set(config, key, T0 + 1))
    assert overrides.tenant_limits(config) == {"a": ONE, "b": MANY}
    assert overrides.retry_budget(config) == (0.3, config.retry_budget_min_per_s)
    overrides.configured(config, config, _set(config, "tenants.bb", T0 + 1, value=None))
    assert overrides.tenant_limits(config)["b"] == MANY  # (another tenant's entry)


def test_a_restatement_does_not_bring_back_a_limit_the_configuration_set_since() -> None:
    config = GovernorConfig(tenants={"a": ONE})
    core = RouterCore(config)
    command = _limits(a=MANY)
    core.observe(command, T0)
    assert core.admission.limits["a"] == MANY
    changed = config.model_copy(update={"tenants": {"a": ONE, "b": ONE}})
    core.apply_config(changed, _set(changed, "tenants.a", T0 + 10))  # after the command
    assert core.admission.limits["a"] == ONE
    core.observe(command.model_copy(update={"reason": f"{RESTATED}: incident 42"}), T0 + 20)
    assert core.admission.limits["a"] == ONE


def test_a_restatement_that_crossed_a_newer_command_is_passed_over() -> None:
    core = RouterCore(GovernorConfig())
    old, new = _limits(a=MANY), _limits(T0 + 5, "c2", a=ONE)
    core.observe(old, T0)
    core.observe(new, T0 + 5)
    core.observe(old.model_copy(update={"reason": RESTATED}), T0 + 6)
    assert core.admission.limits["a"] == ONE
    core.observe(_budget(T0 + 5, ratio=0.2), T0 + 5)
    core.observe(_budget(T0, ratio=0.9), T0 + 6)
    assert core.retry_budget.ratio == 0.2


def test_the_controllers_restate_the_operators_commands_until_the_configuration_replaces_them(
) -> None:
    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(_limits(a=MANY), T0)
    service.observe(_budget(), T0)

    def restated(now: int) -> list[str]:
        return [c.type for c in service.tick(now, restate=False)
                if isinstance(c, SetAdmissionLimits | SetRetryBudget)]

    assert restated(T0 + 1_000) == []
    assert restated(T0 + RESTATE_MS) == ["set_admission_limits", "set_retry_budget"]
    assert restated(T0 + RESTATE_MS + 250) == []
    config = service.live_config.config
    changed = config.model_copy(update={"tenants": {"a": ONE}})
    service.overrides.configured(config, changed, _set(changed, "tenants.a", T0 + RESTATE_MS))
    assert restated(T0 + 2 * RESTATE_MS) == ["set_retry_budget"]


def test_a_command_stamped_too_far_ahead_of_its_record_is_refused() -> None:
    """An operator's clock an hour fast: taken, its command passed over every later one (older
    by event time) and no configuration record could end it, for an hour."""
    overrides = OperatorOverrides()
    with pytest.raises(CommandRefused, match="stamped 10.001s after its record was written"):
        overrides.take(_limits(T0 + AHEAD_MS + 1, a=MANY), T0)
    with pytest.raises(CommandRefused, match="stamped 3600.000s after its record was written"):
        overrides.take(_budget(T0 + 3_600_000), T0)
    assert overrides.limits is None and overrides.budget is None
    assert overrides.take(_limits(T0 + AHEAD_MS, "c2", a=ONE), T0)  # (within: taken)
    assert overrides.take(_limits(T0 + AHEAD_MS + 1, "c3", a=MANY), T0 + 1)


def test_router_and_controllers_refuse_a_command_stamped_an_hour_ahead() -> None:
    core = RouterCore(GovernorConfig(tenants={"a": ONE}))
    service = ControllersService("unused:9092", TopicCatalog("t"))
    with pytest.raises(CommandRefused):  # (the router's service dead-letters it)
        core.observe(_limits(T0 + 3_600_000, "fast", a=MANY), T0)
    service.observe(_limits(T0 + 3_600_000, "fast", a=MANY), T0)  # (logged)
    for observe in (core.observe, service.observe):
        observe(_limits(T0, "now", a=ONE), T0)
    assert core.admission.limits["a"] == ONE
    assert core.overrides.limits.command_id == service.overrides.limits.command_id == "now"


def test_a_command_read_after_a_newer_setting_does_not_hold_over_it() -> None:
    """Commanded before the configuration set a tenant (or the budget) but read after it
    (stamped before a slow send, or its issuer's clock behind): the setting is the newer word,
    as for a process that reads the configuration after the command. Before, a running router
    held the command's limit, one restarted after it the configuration's."""
    config = GovernorConfig(tenants={"a": ONE, "b.x": ONE}, retry_budget_ratio=0.3)
    overrides = OperatorOverrides()
    for key in ("tenants.a", "tenants.b.x.burst_s", "retry_budget_ratio"):
        overrides.configured(config, config, _set(config, key, T0 + 1, value=1.0))
    overrides.take(_limits(a=MANY, c=MANY, **{"b.x": MANY}), T0 + 2)  # commanded at T0
    overrides.take(_budget(), T0 + 2)
    assert overrides.tenant_limits(config) == {"a": ONE, "b.x": ONE, "c": MANY}
    assert overrides.retry_budget(config) == (0.3, config.retry_budget_min_per_s)
    overrides.configured(config, config, _set(config, "tenants", T0 + 3, value={}))  # all
    overrides.take(_limits(T0 + 2, "c2", a=MANY, c=MANY), T0 + 3)
    assert overrides.tenant_limits(config) == {"a": ONE, "b.x": ONE}
    assert overrides.restatements(T0 + 10 * RESTATE_MS) == []  # (nothing of either holds)


def test_of_two_commands_stamped_in_one_millisecond_every_reader_keeps_the_same_one() -> None:
    """Two commands of one millisecond (``governor command`` names both ``KIND-<ms>``): which
    holds does not hang on the order they are read in, so a restatement of one that crossed the
    other, or a router that reads back only restatements, does not bring the other back."""
    first = _limits(command_id="set_admission_limits-1", a=MANY)
    second = _limits(command_id="set_admission_limits-1", a=ONE)
    held = []
    for order in ([first, second], [second, first],
                  [first, second, first.model_copy(update={"reason": RESTATED})]):
        core = RouterCore(GovernorConfig())
        for command in order:
            core.observe(command, T0)
        held.append(core.admission.limits["a"])
    assert held[0] == held[1] == held[2]
