"""The operator's overrides of the configuration: the last ``SetAdmissionLimits`` and the last
``SetRetryBudget`` command, and what of each still holds. Pure: times are passed in.

A command's tenant limits hold over the configuration's until the configuration sets that
tenant's limit again (to another value or the same) by a change made after the command (by the
two messages' event times); its retry budget likewise, until the configuration sets the budget
after it. The router applies what holds. The controllers restate each command, unchanged but for
its reason, every ``RESTATE_S`` while any of it holds, so that a router started after the
command left its read-back window (``--recovery-window-s``), or a restarted controllers process,
still has it; a restatement keeps the command's id and event time, so a router that holds the
command takes it for the same one, and weighs the configuration against the time it was
commanded.

A command stamped further ahead of when its record was written than an event may be
(``AHEAD_MS``: its issuer's clock runs fast) is refused (``CommandRefused``; the router
dead-letters it, so the analytics can say so): taken, it would pass over every command stamped
before its time as older, and no configuration record made before then could end it. When it
was written is the Kafka record's timestamp, which the broker stamps as it appends it to the
control topic (``LogAppendTime``): every reader, whenever it starts, judges a record alike.
"""

from dataclasses import dataclass, field

from controllers.router.fleet import MAX_AHEAD_MS
from schemas.commands import SetAdmissionLimits, SetRetryBudget, TenantLimit
from schemas.config import ConfigSet, GovernorConfig, map_entry
from schemas.errors import TerminalError
from schemas.limits import MAX_REASON_CHARS

#: How often the controllers restate a command that holds: well within a router's read-back
#: window (600 s by default) and their own.
RESTATE_S = 60.0
#: What a restatement's reason begins with (the command's own reason follows).
RESTATED = "restated by the controllers"
#: How far ahead of its reader's clock a command may be stamped: as far as an event may be.
AHEAD_MS = MAX_AHEAD_MS



class CommandRefused(TerminalError):
    """A command its reader does not take: stamped more than ``AHEAD_MS`` ahead of when its
    record was written (a dead letter's reason ``future_event_time``; the message says by how
    much)."""

Override = SetAdmissionLimits | SetRetryBudget
_BUDGET_KEYS = frozenset({"retry_budget_ratio", "retry_budget_min_per_s"})


def _budget(config: GovernorConfig) -> tuple[float, float]:
    return config.retry_budget_ratio, config.retry_budget_min_per_s


def _tenants_set(key: str) -> set[str]:
    """The tenant a configuration record of ``key`` (other than ``tenants``) sets:
    ``tenants.NAME`` or a field of it (no tenant's name ends as a field does:
    ``schemas.commands.TenantName``)."""
    located = map_entry(key)
    return {located[1]} if located is not None and located[0] == "tenants" else set()


def _sets_tenant(key: str, tenant: str) -> bool:
    """Whether a configuration record of ``key`` sets ``tenant``'s limit."""
    return key == "tenants" or tenant in _tenants_set(key)


@dataclass
class OperatorOverrides:
    limits: SetAdmissionLimits | None = None  # the last command of each kind
    budget: SetRetryBudget | None = None
    #: the command's tenant limits that the configuration has not set again since
    held_limits: dict[str, TenantLimit] = field(default_factory=dict)
    budget_holds: bool = False
    restate_s: float = RESTATE_S
    #: when the commands held were last restated, or commanded if since (a command read back,
    #: commanded long ago, is restated at once)
    _restated_ms: int = 0
    #: when the configuration last set each tenant's limit (a record of ``tenants.NAME`` or a
    #: field of it), every tenant's (``tenants``) and the retry budget: a command commanded
    #: before then but read after (stamped before a slow send, or its issuer's clock behind)
    #: does not hold over it, as it does not for a process that reads the configuration after
    #: the command (a restarted one)
    _tenant_set_ms: dict[str, int] = field(default_factory=dict)
    _tenants_set_ms: int = -1
    _budget_set_ms: int = -1

    def take(self, command: Override, written_ms: int) -> bool:
        """Take a command whose record was written at ``written_ms`` (its Kafka timestamp):
        what of it the configuration has not set since it was commanded holds. False (nothing changes) for a restatement of the one in force
        (its tenants since set in the configuration stay the configuration's) or one commanded
        before it (a restatement that crossed a newer command on the topic; ``_rank``). Raises
        ``CommandRefused`` for one stamped more than ``AHEAD_MS`` after ``written_ms``."""
        if command.event_time_ms - written_ms > AHEAD_MS:
            raise CommandRefused(
                f"{command.type} {command.command_id} refused: stamped "
                f"{(command.event_time_ms - written_ms) / 1000:.3f}s after its record was "
                f"written (at most {AHEAD_MS / 1000:g}s; its issuer's clock runs fast?)")
        last = self.limits if isinstance(command, SetAdmissionLimits) else self.budget
        if last is not None and _rank(command) <= _rank(last):
            return False
        at = command.event_time_ms
        if isinstance(command, SetAdmissionLimits):
            self.limits, self.held_limits = command, {
                tenant: limit for tenant, limit in command.limits.items()
                if max(self._tenants_set_ms, self._tenant_set_ms.get(tenant, -1)) < at}
        else:
            self.budget, self.budget_holds = command, self._budget_set_ms < at
        self._restated_ms = max(self._restated_ms, command.event_time_ms)
        return True

    def configured(self, before: GovernorConfig, after: GovernorConfig,
                   change: ConfigSet | None) -> None:
        """The configuration went from ``before`` to ``after`` by ``change`` (None: a whole new
        configuration, now). A tenant's limit that it changes or sets (``tenants``,
        ``tenants.NAME``, a field of it: the value it had, too), and the retry budget likewise,
        are the configuration's again where the change was made after the command (by when
        the value it sets was set, ``value_since_ms``; a tenant's in a record of every tenant's,
        ``entry_since_ms``)."""
        key = "" if change is None else change.key
        if change is not None:
            self._note_set(change, before, after)
        if self.held_limits:
            for tenant in [t for t in self.held_limits
                           if (change is None
                               or change.entry_since_ms(t) >= self.limits.event_time_ms)
                           and (_sets_tenant(key, t)
                                or after.tenants.get(t) != before.tenants.get(t))]:
                del self.held_limits[tenant]
        if self.budget_holds and \
                (change is None or change.value_since_ms >= self.budget.event_time_ms) \
                and (key in _BUDGET_KEYS or _budget(after) != _budget(before)):
            self.budget_holds = False

    def _note_set(self, change: ConfigSet, before: GovernorConfig,
                  after: GovernorConfig) -> None:
        """Note when the tenants' limits and the budget that ``change`` sets (or changes) were
        set: since when it says the value, or each tenant's limit, has held."""
        key = change.key
        if key == "tenants":
            self._tenants_set_ms = max(self._tenants_set_ms, change.value_since_ms)
        if key.startswith("tenants.") or after.tenants == before.tenants:
            changed = _tenants_set(key)
        else:
            changed = {t for t in after.tenants.keys() | before.tenants.keys()
                       if after.tenants.get(t) != before.tenants.get(t)}
        if key == "tenants":
            changed |= set(change.entries_since_ms or ())
        for tenant in changed:
            self._tenant_set_ms[tenant] = max(self._tenant_set_ms.get(tenant, -1),
                                              change.entry_since_ms(tenant))
        if key in _BUDGET_KEYS or _budget(after) != _budget(before):
            self._budget_set_ms = max(self._budget_set_ms, change.value_since_ms)

    def tenant_limits(self, config: GovernorConfig) -> dict[str, TenantLimit]:
        """Each tenant's limits in force: the command's where they hold, else the configuration's."""
        return {**config.tenants, **self.held_limits}

    def retry_budget(self, config: GovernorConfig) -> tuple[float, float]:
        """The retry budget in force (ratio, floor per second)."""
        if self.budget_holds:
            return self.budget.ratio, self.budget.min_per_s
        return _budget(config)

    def summary(self) -> str:
        """What holds, for a log line ("" if nothing)."""
        held = []
        if self.held_limits:
            held.append(f"admission limits of {len(self.held_limits)} tenant(s) "
                        f"({self.limits.command_id})")
        if self.budget_holds:
            held.append(f"retry budget {self.budget.ratio:g} ({self.budget.command_id})")
        return ", ".join(held)

    def restatements(self, now_ms: int) -> list[Override]:
        """The commands that hold, ``restate_s`` after they were commanded or last restated."""
        held = [c for c, holds in ((self.limits, bool(self.held_limits)),
                                   (self.budget, self.budget_holds)) if holds]
        if not held or now_ms - self._restated_ms < self.restate_s * 1000:
            return []
        self._restated_ms = now_ms
        return [c.model_copy(update={"reason": _restated(c.reason)}) for c in held]


def _rank(command: Override) -> tuple[int, str, str]:
    """Which of two commands of a kind is the later: by event time, then (two of one
    millisecond) by id and content, so that every reader keeps the same one whatever order it
    reads them in; a restatement, equal in all but its reason, ranks as the command."""
    return (command.event_time_ms, command.command_id,
            command.model_dump_json(exclude={"reason"}))


def _restated(reason: str) -> str:
    if reason.startswith(RESTATED):
        return reason
    return f"{RESTATED}: {reason}"[:MAX_REASON_CHARS] if reason else RESTATED
