"""``governor command``: an operator's command on ``governor.control``, checked as the
components that obey it check it (the control topic's own schema, strictly).

The operator's commands are the ones nothing else restates: a temporary override of the tenants'
admission limits or of the retry budget (the controllers keep restating those while they hold,
``controllers.overrides``), a pool's size for the supervisor while the autoscaler is off, and a
worker's drain, sleep, model load or injected fault. The commands the controllers own (routing
weights, load-shed levels, breaker states) are refused: the controllers restate the state they
want every few seconds, so an operator's would not last.
"""

import json
from typing import TextIO

from infra.delivery import send_once
from schemas.codec import MAX_RECORD_BYTES, DecodeError, decode
from schemas.commands import (Command, DrainWorker, InjectFault, LoadModel, ScalePool,
                              SetAdmissionLimits, SetRetryBudget, SleepWorker, command_id, target)
from schemas.errors import TerminalError, one_line
from schemas.limits import pool_name
from schemas.topics import TopicCatalog
from workers.sim.models import check_gpu_spelling, check_spelling, gpu_spec, model_spec

OPERATORS = {model.model_fields["type"].default: model for model in (
    SetAdmissionLimits, SetRetryBudget, ScalePool, DrainWorker, SleepWorker, LoadModel, InjectFault)}
#: Commands the controllers restate every few seconds, and what to change instead.
CONTROLLERS_OWN = {
    "set_routing_weights": "the routing weights follow the `router_weights` and `slo` settings",
    "set_load_shed_level": "the shedding levels follow the `shedding` settings",
    "set_breaker_state": "the breakers follow the `breaker` settings; drain a worker "
                         "(drain_worker) to take it out of service",
}
#: The fields each fault of ``inject_fault`` uses, and how long it lasts (a worker's engine
#: slows down until told another factor, and stalls for ``duration_s``: ``workers.service``).
FAULT_FIELDS = {"crash": ((), "the worker is killed at once"),
                "slow": (("factor",), "it lasts until the worker's next slow fault; factor 1 "
                                      "ends it"),
                "stall": (("duration_s",), "it lasts duration_s")}
#: Fields the command line sets itself.
SET_HERE = frozenset({"type", "schema_version", "event_time_ms", "command_id", "issued_by",
                      "reason"})


def fields_from(stream: TextIO) -> str:
    """FIELDS read from ``stream`` (stdin: ``-``), at most a record's size."""
    text = stream.read(MAX_RECORD_BYTES + 1)
    if len(text) > MAX_RECORD_BYTES:
        raise TerminalError(f"FIELDS on stdin is over {MAX_RECORD_BYTES:,} characters, the "
                            "most a command's record may be")
    return text


def operator_command(kind: str, fields: str, *, reason: str, issued_by: str,
                     now_ms: int) -> Command:
    """The command ``kind`` (``drain_worker`` or ``drain-worker``) with ``fields``, a JSON object
    of its own fields, made at ``now_ms``; a ``TerminalError`` naming the field and its limit if
    a component would refuse it."""
    kind = kind.replace("-", "_")
    if kind in CONTROLLERS_OWN:
        raise TerminalError(f"{kind} is the controllers' own: they restate the state they want "
                            f"every few seconds, so an operator's would not last ("
                            f"{CONTROLLERS_OWN[kind]}: governor config set ...)")
    if kind not in OPERATORS:
        raise TerminalError(f"no command {kind[:60]!r}; an operator's is one of "
                            f"{', '.join(OPERATORS)}")
    try:
        data = json.loads(fields)
    except json.JSONDecodeError as exc:
        raise TerminalError(f"{kind}: FIELDS is not JSON ({exc})") from None
    except RecursionError:  # (nested past the parser's depth: no JSONDecodeError)
        raise TerminalError(f"{kind}: FIELDS is not JSON (nested too deep to parse)") from None
    if not isinstance(data, dict):
        raise TerminalError(f"{kind}: FIELDS must be a JSON object of the command's fields, "
                            "e.g. '{\"worker_id\": \"worker-3\"}'")
    if SET_HERE & data.keys():
        raise TerminalError(f"{kind}: {', '.join(sorted(SET_HERE & data.keys()))} is set by "
                            "governor command (the reason and issuer by --reason, --issued-by)")
    draft = {**data, "type": kind, "event_time_ms": now_ms, "command_id": kind,
             "issued_by": issued_by, "reason": reason}
    catalog = TopicCatalog()
    try:
        command = decode(catalog.spec(catalog.control), json.dumps(draft).encode())
    except DecodeError as exc:  # (each field's error, a validator's message as it wrote it)
        raise TerminalError(one_line(exc.invalid) if exc.invalid else exc.detail) from None
    if isinstance(command, InjectFault):
        _check_fault_fields(command, data.keys())
    if isinstance(command, ScalePool):
        _check_gpu_type(command.gpu_type)
        if command.pool != (named := pool_name(command.gpu_type, command.model)):
            raise TerminalError(f"scale_pool.pool: {command.pool!r} is not gpu_type@model, "
                                f"{named} (the supervisor and the autoscaler know a pool by it)")
    about = target(command)
    name = f"{kind}-{now_ms}" if about == kind else command_id(kind, about, now_ms)
    return command.model_copy(update={"command_id": name})


def _check_fault_fields(command: InjectFault, given) -> None:
    """An ``inject_fault`` gives the fields its fault uses, and no other: before 7 Dec a
    ``slow`` fault's ``duration_s`` was sent and ignored (the worker stayed slow), and a
    ``slow`` without a ``factor`` or a ``stall`` without a ``duration_s`` did nothing."""
    uses, lasts = FAULT_FIELDS[command.fault]
    for field in ("factor", "duration_s"):
        if field in given and field not in uses:
            raise TerminalError(f"inject_fault.{field}: a {command.fault} fault does not use it "
                                f"({lasts})")
        if field in uses and field not in given:
            raise TerminalError(f"inject_fault.{field}: a {command.fault} fault needs it ({lasts})")
    if command.fault == "stall" and command.duration_s == 0:
        raise TerminalError("inject_fault.duration_s: a stall of 0 s does nothing; give more "
                            "than 0 s, up to 86,400 s")


def _check_gpu_type(gpu_type: str) -> None:
    """A ``scale_pool``'s GPU type is one a worker runs on, named in lower case as pools are
    (``infra.stack.parse_fleet``): before 7 Dec an unknown one was sent, and the supervisor
    refused it; one in upper case would have started a pool the autoscaler does not know."""
    try:
        gpu_spec(gpu_type)
        check_gpu_spelling(gpu_type)
    except ValueError as exc:
        raise TerminalError(f"scale_pool.gpu_type: {exc}") from None


def commanded_model(command: Command) -> str | None:
    """The model a ``LoadModel`` or ``ScalePool`` names (a worker loads it, the supervisor
    starts workers of it); None for other commands."""
    return command.model if isinstance(command, (LoadModel, ScalePool)) else None


def check_model_known(command: Command) -> None:
    """The model a command names (``commanded_model``) is one the workers' catalog knows: built
    in, or declared by the setting ``models`` (``workers.sim.models.configure_models`` with the
    configuration in force first, where it is not built in), and spelt as requests name it; a
    ``TerminalError`` naming it and the known models, or its spelling, otherwise (a worker
    or the supervisor refuses it, dead-lettered: before, a ``load_model`` was sent, and only
    logged; one in another letter case was loaded, and the worker reported a model no request
    names; before 7 Dec (later) a ``scale_pool`` was sent whatever its model)."""
    model = commanded_model(command)
    if model is not None:
        try:
            model_spec(model)
            check_spelling(model)
        except ValueError as exc:
            raise TerminalError(f"{command.type}.model: {exc}") from None


async def send(bootstrap: str, catalog: TopicCatalog, command: Command) -> None:
    """Produce ``command`` to the control topic under its target, and wait for the broker: at
    most ``DELIVERY_S`` (``infra.delivery``)."""
    await send_once(bootstrap, [(catalog.control, command, target(command), None)],
                    f"the command {command.command_id}")
