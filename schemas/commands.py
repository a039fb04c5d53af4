"""Imperatives the controllers publish to ``governor.control`` (key: the target).

Controllers are level-triggered: a command states the whole desired state of its target (a full
weight vector, an absolute pool size), never a delta, so a restarted controller converges without
replaying history. Every command says who issued it and why, for the audit trail.
"""

import hashlib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import Message
from schemas.limits import (
    MAX_ID_CHARS,
    MAX_MAP_ENTRIES,
    EpochMs,
    Id,
    IntChoice,
    Name,
    PoolName,
    Reason,
    addressable,
)


def command_id(kind: str, target: str, now_ms: int) -> str:
    """``<kind>-<target>-<now_ms>``, within the id limit: a target too long to fit (a worker id
    or pool name near its own limit) is replaced by a digest of it."""
    cid = f"{kind}-{target}-{now_ms}"
    if len(cid) <= MAX_ID_CHARS:
        return cid
    return f"{kind}-{hashlib.blake2b(target.encode(), digest_size=8).hexdigest()}-{now_ms}"


def target(command: "Command") -> str:
    """What a command is about, its key on the control topic: the worker or the pool it names,
    else its type (a command for the whole fleet)."""
    return getattr(command, "worker_id", None) or getattr(command, "pool", None) or command.type


class Command(Message):
    """Common fields of every command."""

    command_id: Id
    issued_by: Id = "operator"
    reason: Reason = ""


class SetRoutingWeights(Command):
    """Relative share of traffic per pool (GPU type × model); pools absent get weight 0."""

    type: Literal["set_routing_weights"] = "set_routing_weights"
    weights: dict[PoolName, Annotated[float, Field(ge=0, le=1e6)]] = Field(max_length=MAX_MAP_ENTRIES)


class TenantLimit(BaseModel):
    """Token-bucket limits of one tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    requests_per_s: float = Field(gt=0, le=1e6)
    tokens_per_s: float = Field(gt=0, le=1e9)
    burst_s: float = Field(default=2.0, gt=0, le=3600)
    priority: int = Field(default=0, ge=0, le=9, description="the tenant's service class: the "
                          "least priority its requests are served at")


#: A tenant's name where it is given limits (configured or commanded).
TenantName = Annotated[Name, addressable("tenant", "tenants", TenantLimit.model_fields,
                                        "a tenant's limits")]


class SetAdmissionLimits(Command):
    """Admission limits of some tenants, over the configuration's until it sets each again;
    tenants absent keep the configuration's (no limits: the last command ends)."""

    type: Literal["set_admission_limits"] = "set_admission_limits"
    limits: dict[TenantName, TenantLimit] = Field(max_length=MAX_MAP_ENTRIES)


class SetLoadShedLevel(Command):
    """Shed requests of ``model`` (None: of every model) whose value is below ``min_value``
    (0 sheds nothing)."""

    type: Literal["set_load_shed_level"] = "set_load_shed_level"
    min_value: float = Field(ge=0, le=1e9)
    model: Name | None = None


class SetBreakerState(Command):
    """Open, half-open or close the circuit breaker of one worker."""

    type: Literal["set_breaker_state"] = "set_breaker_state"
    worker_id: Id
    state: Literal["closed", "open", "half_open"]
    until_ms: EpochMs | None = None


class SetRetryBudget(Command):
    """Retries allowed, as a share of recent requests."""

    type: Literal["set_retry_budget"] = "set_retry_budget"
    ratio: float = Field(ge=0, le=1)
    min_per_s: float = Field(default=1.0, ge=0, le=1e6)


class ScalePool(Command):
    """The absolute number of workers a pool should have."""

    type: Literal["scale_pool"] = "scale_pool"
    pool: PoolName
    gpu_type: Name
    model: Name
    replicas: int = Field(ge=0, le=4096)


class DrainWorker(Command):
    """A worker takes no new work and finishes what it has; at ``deadline_ms``, if given, it
    hands what still runs back to the router (continued elsewhere). It stays drained, holding
    its model, until woken (``SleepWorker`` level 0) or stopped (SIGTERM)."""

    type: Literal["drain_worker"] = "drain_worker"
    worker_id: Id
    deadline_ms: EpochMs | None = None


class LoadModel(Command):
    """Load a model's weights on a worker (a cold start)."""

    type: Literal["load_model"] = "load_model"
    worker_id: Id
    model: Name


class SleepWorker(Command):
    """Put a worker to sleep (level 1 offloads weights, level 2 discards them) or wake it."""

    type: Literal["sleep_worker"] = "sleep_worker"
    worker_id: Id
    level: IntChoice(0, 1, 2) = Field(description="0 wakes the worker")


class InjectFault(Command):
    """Chaos testing: make one worker's engine crash, slow down by ``factor`` or stall."""

    type: Literal["inject_fault"] = "inject_fault"
    worker_id: Id
    fault: Literal["crash", "slow", "stall"]
    factor: float = Field(default=1.0, gt=0, le=1000)
    duration_s: float = Field(default=0.0, ge=0, le=86_400)
