"""A component that ``governor up`` or ``demo`` started stops once its supervisor is gone.

The stack starts each component in a process group of its own (``infra.stack``), which no
Ctrl-C and no hung-up terminal reaches: ``up`` stops them itself. Killed outright (SIGKILL, an
out-of-memory kill) it cannot, and before 7 Dec its components ran on unsupervised: a worker
kept its slot's requests, and the next ``up`` met a router id in use and ports taken. Now each
watches its parent: once ``up`` is gone (the component is handed to another parent), it stops
as on SIGTERM, through its own graceful stop (the sink flushes), and a second SIGTERM a few
seconds on has a worker still finishing what it runs hand the rest back, as ``up``'s own stop
does (``Stack.stop``). A component started by hand has no supervisor and is not watched."""

import asyncio
import logging
import os
import signal

logger = logging.getLogger(__name__)

#: The supervisor's pid, in the environment of each component the stack starts.
SUPERVISOR_PID_ENV = "GOVERNOR_SUPERVISOR_PID"
#: How often a component looks whether its supervisor is still its parent.
WATCH_S = 1.0


def supervisor_env() -> dict[str, str]:
    """The environment entry that makes a component the stack starts (a child of this process)
    stop once this process is gone."""
    return {SUPERVISOR_PID_ENV: str(os.getpid())}


async def stop_when_unsupervised(watch_s: float = WATCH_S,
                                 hurry_after_s: float | None = None) -> None:
    """Where this process was started by a stack (``SUPERVISOR_PID_ENV``), wait until its
    supervisor is no longer its parent, then send this process SIGTERM: the component's own
    stop; and, ``hurry_after_s`` later (None: not), SIGTERM again (a worker still finishing
    what it runs hands the rest back: ``Stack.finish_s``; before 7 Dec it finished for up to
    its ``--drain-timeout-s``, 30 s). Returns at once where it was started by hand."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    if not (supervisor.isascii() and supervisor.isdigit()):  # (not "١٢": int() takes it)
        return
    while os.getppid() == int(supervisor):
        await asyncio.sleep(watch_s)  # (polled: what tells of a parent's exit is Linux's own)
    logger.warning("its supervisor (pid %s, governor up or demo) is gone: stopping", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)
    if hurry_after_s is not None:
        await asyncio.sleep(hurry_after_s)  # (the time it has to finish: a deadline, as up's)
        logger.warning("still stopping %g s on: what it runs is handed back", hurry_after_s)
        os.kill(os.getpid(), signal.SIGTERM)
