"""A pseudo-terminal for the tests of commands whose terminal closes, and a Ctrl-C at one."""

import os
import select
import signal
import threading


class Terminal:
    """A pseudo-terminal a command writes to, read as it goes, that can be closed (hung up)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.said = b""
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.said += os.read(self.master, 65_536)
                except OSError:  # (the command closed its end)
                    return

    def close_slave(self) -> None:
        """Once the command holds the terminal: only the command keeps it open."""
        os.close(self.slave)

    def close(self) -> None:
        """The window closes: the terminal hangs up (writes to it fail). Once."""
        if not self._closing.is_set():
            self._closing.set()
            self._reader.join()
            os.close(self.master)


def ctrl_c_after(rows: int, read, sent: signal.Signals = signal.SIGINT):
    """``read`` (``rows_with_progress`` of ``sim`` and ``replay``) with a SIGINT sent to this
    process, as by a Ctrl-C at the terminal, once ``rows`` rows have passed (or ``sent``: a
    SIGTERM, as by ``kill``)."""
    def interrupted(what, items, command="sim"):
        for passed, item in enumerate(read(what, items, command)):
            if passed == rows:
                os.kill(os.getpid(), sent)
            yield item
    return interrupted
