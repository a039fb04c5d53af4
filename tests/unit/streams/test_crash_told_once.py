"""A crash's reason is logged once (``streams.crash``): mode's "Crashed reason=..." line is
dropped for a crash the worker has logged already, kept for any other; without a broker."""

import logging

from streams.crash import LoggedCrashes
from streams.recovery import RecoveryStalled, RecoveryStepTimedOut


def _crash_line(reason: BaseException) -> logging.LogRecord:
    """The record mode's ``Service.crash`` logs on Faust's app logger."""
    return logging.LogRecord("faust.app.base", logging.ERROR, __file__, 1,
                             "[^-App]: Crashed reason=%r", (reason,), None)


def test_a_crash_the_worker_logged_is_not_told_again():
    for reason in (RecoveryStalled("read nothing for 10 s"), RecoveryStepTimedOut("no answer")):
        assert not LoggedCrashes().filter(_crash_line(reason))


def test_any_other_crash_and_line_is_kept():
    assert LoggedCrashes().filter(_crash_line(RuntimeError("a commit failed")))
    other = logging.LogRecord("faust.app.base", logging.ERROR, __file__, 1,
                              "[^-App]: %r", (RecoveryStalled("x"),), None)
    assert LoggedCrashes().filter(other)
