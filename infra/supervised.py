"""A component that ``governor up`` or ``demo`` started stops once its supervisor is gone.

The stack starts each component in a process group of its own (``infra.stack``), which no
Ctrl-C and no hung-up terminal reaches: ``up`` stops them itself. Killed outright (SIGKILL, an
out-of-memory kill) it cannot, and before 7 Dec its components ran on unsupervised: a worker
kept its slot's requests, and the next ``up`` met a router id in use and ports taken. Now each
watches its parent: once ``up`` is gone (the component is handed to another parent), it stops
as on SIGTERM, through its own graceful stop (a worker hands back what it runs, the sink
flushes). A component started by hand has no supervisor and is not watched."""

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


async def stop_when_unsupervised(watch_s: float = WATCH_S) -> None:
    """Where this process was started by a stack (``SUPERVISOR_PID_ENV``), wait until its
    supervisor is no longer its parent, then send this process SIGTERM: the component's own
    stop. Returns at once where it was started by hand."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    if not supervisor.isdigit():
        return
    while os.getppid() == int(supervisor):
        await asyncio.sleep(watch_s)  # (polled: what tells of a parent's exit is Linux's own)
    logger.warning("its supervisor (pid %s, governor up or demo) is gone: stopping", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)
