"""The configuration in force, from the records of the compacted ``governor.config`` topic. Pure.

Records apply in offset order, each on top of the last good configuration. A record whose key
names no setting, whose value fails validation, or that the component cannot apply (for example
an unknown scorer name) is rejected with the reason, and the last good configuration stays.
"""

from collections.abc import Callable
from dataclasses import dataclass

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

    def apply(self, record: ConfigSet, offset: int, now_ms: int) -> ConfigApplied | ConfigRejected:
        try:
            candidate = self.config.with_setting(record.key, record.value)
            self.check(candidate)
        except (KeyError, ValueError, ValidationError) as exc:
            return ConfigRejected(event_time_ms=now_ms, key=record.key, component=self.component,
                                  config_offset=offset, reason=one_line(exc)[:2048])
        self.config = candidate
        return ConfigApplied(event_time_ms=now_ms, key=record.key, component=self.component,
                             config_offset=offset)


