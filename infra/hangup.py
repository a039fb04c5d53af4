"""A terminal that closes (its window, an ssh session) sends the commands running in it SIGHUP,
and from then on a write to it fails (EIO). Every Governor command that runs until stopped
(``up``, ``demo``, and the components started by hand: ``router``, ``worker``, ``controllers``,
``streams``, ``sink``, ``sim-server``) takes SIGHUP as it takes SIGTERM: its graceful stop.
Before 7 Dec a component started by hand died at once on it, with no cleanup: a worker did not
hand back its requests, a sink did not flush.

A pipe whose reader has gone (``... | head -1``) fails a write too (EPIPE):
``exit_quietly_if_stdout_closes`` ends a script there as click ends a ``governor`` command."""

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial

#: The output a hung-up terminal can fail: stdout and stderr.
OUTPUT_FDS = (1, 2)


def terminal_output_guard() -> Callable[[], None]:
    """A call for the SIGHUP handler: ``off_a_hung_up_terminal`` for those of stdout and stderr
    that are a terminal now (taken before the terminal can hang up: ``isatty`` fails after)."""
    return partial(off_a_hung_up_terminal, [fd for fd in OUTPUT_FDS if os.isatty(fd)])


def off_a_hung_up_terminal(fds: list[int]) -> None:
    """Point those of ``fds`` whose terminal has hung up (its window closed: the ``isatty`` they
    had fails now) at /dev/null. A write to a hung-up terminal fails (EIO), and the cleanup
    that SIGHUP starts says what it does: before 7 Dec its first line ("stopping Kafka ...",
    ``stopped``, ``interrupted after``) ended ``up`` before it stopped its embedded broker, left
    running, and ``demo`` before it wrote its report."""
    hung_up = [fd for fd in fds if not os.isatty(fd)]
    if hung_up:
        _point_at_devnull(hung_up)


@contextlib.contextmanager
def exit_quietly_if_stdout_closes() -> Iterator[None]:
    """A print in the block to a stdout whose reader has gone ends the script with exit 1 and
    no traceback, as click ends a ``governor`` command there (and as Python's documentation on
    SIGPIPE advises). stdout is flushed at the block's end, so that no write is left for the
    interpreter's exit, which would fail it with an ``Exception ignored`` and exit 120; after a
    failed write it points at /dev/null, for the same reason."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        _point_at_devnull([sys.stdout.fileno()])
        raise SystemExit(1) from None


def _point_at_devnull(fds: list[int]) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)
