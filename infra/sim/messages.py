"""Messages built fast for the simulator's in-process hand-offs.

The simulator builds a message for every heartbeat, token batch and lifecycle event it feeds the
router core; pydantic's validation (and even ``model_construct``, which resolves every default on
each call) would cost more than the simulation itself. ``construct(cls, **fields)`` makes the
same instance ``model_construct`` would, from defaults resolved once per class. Only for values
the simulator made itself: nothing here validates.
"""

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_DEFAULTS: dict[type, dict[str, Any]] = {}
_set = object.__setattr__


def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    values = {}
    for name, info in cls.model_fields.items():
        if not info.is_required():
            values[name] = info.get_default(call_default_factory=True)
    return values


def construct(cls: type[M], **fields: Any) -> M:
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = _DEFAULTS[cls] = _defaults(cls)
    obj = cls.__new__(cls)
    values = defaults.copy()
    values.update(fields)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", set(fields))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj
