"""How ``governor up`` and ``demo`` take SIGTERM and SIGHUP (an orchestrator's or ``kill``'s
stop, the terminal they run in closing): as Ctrl-C, through their cleanup, which stops every
process they started. The default would end them at once and leave those running."""

import asyncio
import signal
from collections.abc import Callable, Coroutine

from infra.hangup import terminal_output_guard


class StopSignals:
    """The first stop signal interrupts the command; one that follows (a second ``kill``, a
    Ctrl-C after one), while its cleanup stops what it started, is ignored: before 7 Dec it
    raised again in asyncio's cleanup and cut the stop short, or kept it from starting. (A first
    Ctrl-C is asyncio's, which cancels the command's task; a second raises, and asyncio waits for
    the stop's thread all the same: ``infra.up``.) On SIGHUP, ``off_a_hung_up_terminal`` first.

    Where the command runs a task under ``cancelling`` (``up``'s stack), the first signal
    cancels that task from its loop, at its next ``await``, as asyncio's Ctrl-C does; elsewhere
    (a broker starting) it raises ``KeyboardInterrupt`` where the main thread is. Before 7 Dec
    it raised in ``up``'s task too, anywhere: once ``subprocess.Popen`` had forked a component
    but before the stack recorded it, and the stack's stop left that component running."""

    def __init__(self) -> None:
        self.interrupted = False
        self.off_a_hung_up_terminal: Callable[[], None] = lambda: None
        self._task: asyncio.Task | None = None
        self._installed = False  # (``finishing`` takes the signals only where it was)

    def install(self) -> Callable[[], None]:
        """Handle SIGTERM and SIGHUP from now on; ``off_a_hung_up_terminal`` returned, for a
        handler of the command's own (``demo``'s, in its loop)."""
        self.interrupted, self._installed = False, True
        self.off_a_hung_up_terminal = terminal_output_guard()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        return self.off_a_hung_up_terminal

    async def cancelling(self, coroutine: Coroutine):
        """Run ``coroutine`` as the task a stop signal cancels. Cancelled so, it ends as a
        Ctrl-C ends ``asyncio.run``: with ``KeyboardInterrupt``."""
        self._task = asyncio.current_task()
        try:
            return await coroutine
        except asyncio.CancelledError:
            if self.interrupted:
                raise KeyboardInterrupt from None
            raise  # (asyncio's Ctrl-C: it raises KeyboardInterrupt itself)
        finally:
            self._task = None

    def finishing(self) -> None:
        """From now on every stop signal is ignored (Ctrl-C too): the command finishes what it
        has left, stopping its embedded broker and writing its report. ``demo`` calls it once
        its loop has closed, which set the signals the loop handled back to their defaults:
        before 7 Dec a SIGTERM or SIGHUP then ended it at once, its broker left running. ``up``
        calls it once its stack has stopped: a first stop by Ctrl-C (asyncio's, not counted
        here) left a SIGTERM, SIGHUP or second Ctrl-C to raise while it stopped its broker.
        Nothing where ``install`` was not called: a caller running ``up`` in its own process (a
        test) keeps its handlers; and once per ``install``: a command run in the same process
        after it (a test's) installs its own, else ``finishing`` leaves that one's handlers
        alone too."""
        if not self._installed:
            return
        self.interrupted, self._installed = True, False
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGHUP:
            self.off_a_hung_up_terminal()
        if self.interrupted:
            return
        self.interrupted = True
        signal.signal(signal.SIGINT, self._on_signal)  # (asyncio's own would raise in its cleanup)
        if self._task is None:
            raise KeyboardInterrupt
        self._task.get_loop().call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:
        """In the task's loop. (Not again where Ctrl-C cancelled it: its stop goes on.)"""
        if self._task is not None and not self._task.cancelling():
            self._task.cancel()
