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
    return _instance(cls, defaults, fields, set(fields))


class Template:
    """``construct`` for many messages of one class that share some fields (a worker's
    heartbeats): ``Template(cls, **shared)(**rest)`` is ``construct(cls, **shared, **rest)``.
    The shared values must be immutable (one object serves every message)."""

    def __init__(self, cls: type[M], **shared: Any) -> None:
        if cls not in _DEFAULTS:
            _DEFAULTS[cls] = _defaults(cls)
        self.cls = cls
        self.values = {**_DEFAULTS[cls], **shared}
        self.names = frozenset(shared)

    def __call__(self, **fields: Any) -> Any:
        return self.of(fields)

    def of(self, fields: dict[str, Any]) -> Any:
        """``self(**fields)`` from a dict the caller hands over (not copied again)."""
        return _instance(self.cls, self.values, fields, {*self.names, *fields})


def _instance(cls: type[M], defaults: dict[str, Any], fields: dict[str, Any], names: set[str]) -> M:
    obj = cls.__new__(cls)
    values = defaults.copy()
    values.update(fields)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", names)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj
