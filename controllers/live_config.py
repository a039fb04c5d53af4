"""The configuration in force, from the records of the compacted ``governor.config`` topic. Pure.

Records apply in offset order, each on top of the last good configuration. A record whose key
names no setting, whose value fails validation, or that the component cannot apply (for example
an unknown scorer name) is rejected with the reason, and the last good configuration stays. So
is a record whose Kafka key is not the setting it sets: the topic is compacted by key, and such
a record would take the place of the setting its key names.

Compaction keeps the newest record of each key, a rejected one too: left alone, a rejected
record would take the place of the good one before it, and a component started after the log
cleaner ran would not have that setting. ``to_restore`` lists the good records to write again
(the router does) where a key's newest record was rejected.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from schemas.config import ConfigSet, GovernorConfig
from schemas.errors import one_line
from schemas.events import ConfigApplied, ConfigRejected


@dataclass
class LiveConfig:
    component: str
    config: GovernorConfig = GovernorConfig()
    #: Called with each candidate configuration; raises ValueError if the component cannot use it.
    check: Callable[[GovernorConfig], None] = lambda _config: None
    #: The last record applied under each key.
    good: dict[str, ConfigSet] = field(default_factory=dict)
    #: Keys whose newest record was rejected, and the good record before it: ``to_restore``.
    _shadowed: dict[str, ConfigSet] = field(default_factory=dict)

    def apply(self, record: ConfigSet, offset: int, now_ms: int,
              record_key: bytes | None = None) -> ConfigApplied | ConfigRejected:
        """``record_key``: the Kafka key of the record (None: not from the topic)."""
        try:
            if record_key is not None and record_key != record.key.encode():
                raise ValueError(
                    f"the record's key {record_key.decode(errors='replace')[:80]!r} is not the "
                    f"setting it sets, {record.key!r}: the topic is compacted by key, so a "
                    "record's key must be its setting")
            candidate = self.config.with_setting(record.key, record.value)
            self.check(candidate)
        except (KeyError, ValueError, ValidationError) as exc:
            if record_key is not None and record.set_by != self.component:  # (a restoring
                # record rejected in turn is not restored again: that could go on for ever)
                shadowed = self.good.get(record_key.decode(errors="replace"))
                if shadowed is not None:
                    self._shadowed[shadowed.key] = shadowed
            return ConfigRejected(event_time_ms=now_ms, key=record.key, component=self.component,
                                  config_offset=offset, reason=one_line(exc)[:2048])
        self.config = candidate
        self.good[record.key] = record
        self._shadowed.pop(record.key, None)
        return ConfigApplied(event_time_ms=now_ms, key=record.key, component=self.component,
                             config_offset=offset)

    def to_restore(self, set_by: str, now_ms: int) -> list[ConfigSet]:
        """The good records to write again, once each: those that a rejected record, the
        newest of its key so far, would take the place of."""
        restore = [record.model_copy(update={"event_time_ms": now_ms, "set_by": set_by})
                   for record in self._shadowed.values()]
        self._shadowed.clear()
        return restore


