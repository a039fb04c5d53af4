"""What the pure aggregators emit, and the scope keys signals are kept under. Pure.

An aggregator never sends anything: it returns ``Out`` records, and the Faust adapter (or the
in-memory pipeline of the tests and the simulator) routes them: ``scope`` records are observations
for the window book of a scope key, ``worker`` records go to the worker aggregator of a worker id,
``task`` records to the task aggregator of a task id.
"""

from typing import Any, Literal, NamedTuple

from schemas.limits import FLEET_KEY

Route = Literal["scope", "worker", "task"]

FLEET = f"fleet:{FLEET_KEY}"


class Out(NamedTuple):  # a tuple: the aggregators make several per event
    route: Route
    key: str
    payload: dict[str, Any]
    #: (source, offset, index) of the record an observation first came from, when an upstream
    #: stage assigned it (relayed observations keep it, so re-sent relays dedupe downstream).
    origin: tuple[str, int, int] | None = None


def scope_key(scope: str, name: str) -> str:
    return f"{scope}:{name}"


def split_scope_key(key: str) -> tuple[str, str]:
    scope, _, name = key.partition(":")
    return scope, name


def observe(keys: list[str], obs: dict[str, Any]) -> list[Out]:
    return [Out("scope", key, obs) for key in keys]
