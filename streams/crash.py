"""A crashed streams worker's stop logs the crash's ERROR only, not a second, false fault.

When the worker crashes (a stuck recovery, a recovery step without an answer:
``streams.recovery``), mode marks every service of the app crashed, the consumer's thread among
them. The thread takes the crash for a stop: it stops its children, ends, and closes its event
loop. The app's stop then reaches the thread, and mode's ``ServiceThread`` tells the thread it
is stopped by scheduling that on the thread's loop, now closed: ``RuntimeError('Event loop is
closed')``, logged as an ERROR with its traceback ("Error while stopping child
<AIOKafkaConsumerThread…>"), which an operator reads as a second fault. The thread had in fact
stopped cleanly. ``ThreadEndedOnCrash`` gives the consumer a thread that, ended, is marked
stopped where it is rather than on its closed loop.

mode also logs each crash's reason as an ERROR ("[^-App]: Crashed reason=..."), with the
traceback of whatever exception was being handled (for a recovery step, Faust's own
``ServiceStopped``, which reads as yet another fault). Where the worker has already logged why
it stops (a ``LoggedCrash``), that line says it again, worse: ``LoggedCrashes`` drops it. Any
other crash's line is kept: it is the only account of that crash. A send or a changelog write
that failed, or a batch, is logged CRITICAL by the app, which then crashes with it ``told``
(before 7 Dec with the failure itself, whose "Crashed reason=..." line, traceback and all,
repeated the CRITICAL one).
"""

import logging

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

#: The logger of Faust's app, which logs its crash.
APP_LOGGER = "faust.app.base"


class LoggedCrash(Exception):
    """A crash whose reason the worker has logged already (ERROR or CRITICAL)."""


def told(failure: BaseException) -> LoggedCrash:
    """``failure``, logged already, as the reason of a crash (its ``__cause__``)."""
    crash = LoggedCrash(f"{type(failure).__name__}: {failure}")
    crash.__cause__ = failure
    return crash


class LoggedCrashes(logging.Filter):
    """Drops mode's "Crashed reason=..." line for a ``LoggedCrash``: its second telling."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.endswith("Crashed reason=%r")
                    and isinstance(record.args, tuple) and len(record.args) == 1
                    and isinstance(record.args[0], LoggedCrash))


def tell_crashes_once() -> None:
    """Each crash's reason is logged once (``LoggedCrashes`` on Faust's app logger)."""
    logging.getLogger(APP_LOGGER).addFilter(LoggedCrashes())


class EndedThreadStops(AIOKafkaConsumerThread):
    """Faust's consumer thread, whose stop after the thread has ended (its loop closed, as on a
    crash) only marks it stopped: nothing on that loop waits to be told any more."""

    def _stopped_set(self) -> None:
        if self.thread_loop.is_closed():
            self._stopped.set()
        else:
            super()._stopped_set()


class ThreadEndedOnCrash:
    """A mixin for Faust's aiokafka consumer: its thread is an ``EndedThreadStops``."""

    def _new_consumer_thread(self) -> EndedThreadStops:
        return EndedThreadStops(self, loop=self.loop, beacon=self.beacon)
