"""A terminal that closes (its window, an ssh session) sends the commands running in it SIGHUP,
and from then on a write to it fails (EIO). Every Governor command that runs until stopped
(``up``, ``demo``, and the components started by hand: ``router``, ``worker``, ``controllers``,
``streams``, ``sink``, ``sim-server``) takes SIGHUP as it takes SIGTERM: its graceful stop.
Before 7 Dec a component started by hand died at once on it, with no cleanup: a worker did not
hand back its requests, a sink did not flush."""

import os
from collections.abc import Callable
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
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in hung_up:
            os.dup2(devnull, fd)
        os.close(devnull)
