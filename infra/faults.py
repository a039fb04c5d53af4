"""Fault injection for the demo and for anyone checking resilience.

``kill:SLOT@SECONDS`` SIGKILLs the worker on a slot; ``start:SLOT@SECONDS`` starts a worker on
the slot again (as an orchestrator or the autoscaler would after a crash);
``slow:SLOT:FACTOR@SECONDS`` makes its GPU that many times slower (an ``InjectFault`` command on
``governor.control``); ``stall:SLOT:S@SECONDS`` stalls it for S seconds; ``restart:NAME@SECONDS`` SIGKILLs a
control-plane component (``router``, ``controllers``, ``streams`` or ``sink``) and starts it
again, as an orchestrator would (it must carry on with what it had in hand);
``pause:TARGET:S@SECONDS`` SIGSTOPs a component or the worker on a slot and SIGCONTs it S seconds
later (a process frozen past its session and heartbeat timeouts, as a VM paused or a long GC
would). SECONDS count from the start of the replay.
"""

import asyncio
import math
import re
from dataclasses import dataclass

from infra.bus import now_ms
from infra.delivery import send_once
from infra.stack import Stack
from schemas.commands import InjectFault, command_id
from schemas.topics import TopicCatalog

#: The control-plane components a ``restart`` or a ``pause`` names.
COMPONENTS = ("router", "controllers", "streams", "sink")
_NAMES = "|".join(COMPONENTS)
_PATTERN = re.compile(r"^(kill|start):(\d+)@([^:@]+)$|^(slow|stall):(\d+):([^:@]+)@([^:@]+)$"
                      rf"|^restart:({_NAMES})@([^:@]+)$"
                      rf"|^pause:(?:({_NAMES})|(\d+)):([^:@]+)@([^:@]+)$")


@dataclass(frozen=True)
class Fault:
    kind: str
    slot: int
    at_s: float
    value: float = 0.0  # slowdown factor, or stall or pause seconds
    component: str = ""  # restart, pause: the component (a pause of a worker names none)

    @property
    def worker_id(self) -> str:
        return f"worker-{self.slot}"

    @property
    def process(self) -> str:
        """The stack's name of the process the fault acts on."""
        return self.component or self.worker_id

    def __str__(self) -> str:
        target = self.component or self.slot
        return f"{self.kind}:{target}@{self.at_s:g}"


#: How long a ``start`` waits for the worker a kill of its slot ends before it is not injected.
START_WAIT_S = 10.0
#: The largest slowdown and the longest stall an ``InjectFault`` command carries.
MAX_SLOWDOWN, MAX_STALL_S = 1000.0, 86_400.0


def _number(text: str, what: str) -> float:
    """``text`` as a finite number, 0 or more (``5``, ``2.5``, ``1e3``); else an error naming
    ``what``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number, 0 or more, not {text!r}")
    return value


def parse_fault(text: str, slots: int | None = None) -> Fault:
    """``slots``: the fleet's worker slots, when known: a fault on a slot past them is refused."""
    m = _PATTERN.match(text.strip())
    try:
        if m is None:
            raise ValueError("expected kill:SLOT@S, start:SLOT@S, slow:SLOT:FACTOR@S, "
                             "stall:SLOT:SECONDS@S, restart:COMPONENT@S or "
                             "pause:COMPONENT|SLOT:SECONDS@S (S: seconds, e.g. 5 or 2.5; "
                             f"COMPONENT: {', '.join(COMPONENTS)})")
        if m.group(8):
            return Fault("restart", -1, _number(m.group(9), "the time after @"),
                         component=m.group(8))
        if m.group(12):
            fault = Fault("pause", int(m.group(11) or -1), _number(m.group(13), "the time after @"),
                          _number(m.group(12), "the pause's seconds"), component=m.group(10) or "")
            if fault.value <= 0:
                raise ValueError("the pause's seconds must be positive")
        elif m.group(1):
            fault = Fault(m.group(1), int(m.group(2)), _number(m.group(3), "the time after @"))
        else:
            value = "the slowdown factor" if m.group(4) == "slow" else "the stall's seconds"
            fault = Fault(m.group(4), int(m.group(5)), _number(m.group(7), "the time after @"),
                          _number(m.group(6), value))
            if fault.value <= 0:
                raise ValueError("the factor or duration must be positive")
            if fault.kind == "slow" and fault.value > MAX_SLOWDOWN:
                raise ValueError(f"the slowdown factor must be at most {MAX_SLOWDOWN:g}")
            if fault.kind == "stall" and fault.value > MAX_STALL_S:
                raise ValueError(f"a stall lasts at most {MAX_STALL_S:g} s")
    except ValueError as exc:  # (float("1.2.3") too)
        raise ValueError(f"bad fault {text!r}: {exc}") from None
    if slots is not None and fault.slot >= slots:
        raise ValueError(f"bad fault {text!r}: the fleet has slots 0 to {slots - 1}")
    return fault


def check_sequence(given: list[tuple[str, Fault]]) -> None:
    """Refuse a ``start`` of a slot whose worker runs then, and a ``kill`` of one whose worker
    was killed and not started since (every slot's worker runs at the start): the one would not
    be injected, the other would do nothing. ``given``: each fault with its text as given. A
    kill and a start at the same moment run in no set order, so a start must come later."""
    killed: dict[int, float] = {}  # slot -> when its worker was killed, while it is not started
    order = {"kill": 0, "start": 1}  # (at one moment: the start is refused, not the kill)
    turns = sorted((f.at_s, order[f.kind], text, f) for text, f in given if f.kind in order)
    for at_s, _, text, fault in turns:
        if fault.kind == "start":
            if killed.get(fault.slot, at_s) >= at_s:
                raise ValueError(
                    f"bad fault {text!r}: the worker on slot {fault.slot} runs then (a start "
                    f"follows a kill of its slot, e.g. --fault kill:{fault.slot}@S with S "
                    f"below {at_s:g})")
            del killed[fault.slot]
        elif fault.slot in killed:
            raise ValueError(f"bad fault {text!r}: no worker runs on slot {fault.slot} then "
                             f"(killed at {killed[fault.slot]:g} s, and not started since)")
        else:
            killed[fault.slot] = at_s


async def inject_at(fault: Fault, start: float, stack: Stack, bootstrap: str,
                    catalog: TopicCatalog, injected: dict[Fault, int]) -> None:
    """Wait until ``fault.at_s`` after ``start`` (loop time), inject it, record when (epoch ms)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + fault.at_s - loop.time()))  # the scheduled moment
    if fault.kind == "kill":
        await asyncio.to_thread(stack.kill, fault.worker_id)
    elif fault.kind == "start":
        # (a start follows a kill of its slot: on a loaded machine that kill may not have
        # reached the worker yet; waited for, not refused as a start of a running worker)
        await asyncio.to_thread(stack.processes[fault.worker_id].wait, START_WAIT_S)
        stack.respawn(fault.worker_id)
    elif fault.kind == "restart":
        await asyncio.to_thread(stack.restart, fault.component)
    elif fault.kind == "pause":
        stack.pause(fault.process)
        try:
            await asyncio.sleep(fault.value)
        finally:  # (cancelled at the end of the run: the process is stopped, not left frozen)
            stack.resume(fault.process)
    else:
        await _command(fault, bootstrap, catalog)
    injected[fault] = now_ms()


async def _command(fault: Fault, bootstrap: str, catalog: TopicCatalog) -> None:
    """A slowdown or a stall: an ``InjectFault`` command the worker obeys, its id its own
    (``fault-<kind>-<worker>-<ms>``, as the controllers' are: two faults of one slot shared
    one)."""
    stamp = now_ms()
    command = InjectFault(
        event_time_ms=stamp, command_id=command_id(f"fault-{fault.kind}", fault.worker_id, stamp),
        issued_by="demo", reason="injected by --fault", worker_id=fault.worker_id,
        fault=fault.kind, factor=fault.value if fault.kind == "slow" else 1.0,
        duration_s=fault.value if fault.kind == "stall" else 0.0)
    await send_once(bootstrap, [(catalog.control, command, fault.worker_id, None)],
                    f"the command {command.command_id}")
