"""How far a streams worker's recovery of its tables has come, and a bound on one that is stuck.

A worker that takes over partitions reads the tables' changelogs back (Faust's recovery) before
it processes anything: no signal is published meanwhile. Faust logs its progress at INFO only
(the worker's default level is WARNING), each of its steps waits up to
``broker_request_timeout`` (90 s), and its wait for the changelogs to be read to their
highwaters has no bound: a changelog partition that never reaches its highwater (one ending in
a transaction's marker, which no consumer is handed) held the worker "recovering" for ever.

``RecoveryWatch`` is the pure part: given a look at the recovery now and then (records left per
changelog partition), it says how long the recovery has gone on, what to log, and whether it
has stalled. A recovery is bounded by its progress, not by its length: a large changelog that
is read steadily takes as long as it takes, and one that has read nothing for ``stall_s`` is
stuck. A recovery has ended once Faust has made its tables ready, not when its ``in_recovery``
drops: Faust drops it whenever it knows of nothing left to read, also while the broker's answer
to its request for the changelogs' highwaters is awaited (5 to 90 s when the broker is slow),
and raises it again once they come. ``watch_recovery`` looks at Faust's recovery every second,
sets the gauges, logs, and crashes the worker on a stall (it exits non-zero, for its supervisor
to start it again).

A step of the recovery that has no answer within ``broker_request_timeout`` (the changelogs'
highwaters, their earliest offsets, a seek, the producer's flush) ended Faust's recovery for good:
mode's ``wait_first`` answers a timeout as "stopped", so Faust's recovery task leaves its loop as
if the worker stopped, silently (at its DEBUG level). The worker then ran on, its streams paused,
the tables never recovered, and no later rebalance recovered either. ``GuardedRecovery`` tells a
timeout from a stop (``step_timed_out``) and crashes the worker at once with an ERROR naming the
step and the changelog partitions it was recovering.
"""

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery, ServiceStopped

from streams.crash import LoggedCrash

logger = logging.getLogger(__name__)

#: A changelog partition: (topic, partition).
Changelog = tuple[str, int]
#: A recovery that has gone on this long is logged at WARNING, a shorter one at INFO.
SLOW_S = 30.0
#: How many partitions a line names; the others are counted.
NAMED = 5


class RecoveryStalled(LoggedCrash):
    """The tables' recovery read nothing for longer than its bound."""


class RecoveryStepTimedOut(LoggedCrash):
    """A step of the tables' recovery had no answer within ``broker_request_timeout``."""


@dataclass(frozen=True)
class Look:
    """What the watch makes of one look at the recovery."""

    recovering_s: float  #: how long the recovery has gone on; 0 when there is none
    remaining: int  #: records left to read (of the partitions whose highwater is known)
    line: str | None = None  #: to log now, at ``level``
    level: int = logging.INFO
    stalled: str | None = None  #: the recovery is stuck: why, naming what it waits on


class RecoveryWatch:
    def __init__(self, progress_every_s: float = 5.0, stall_s: float = 300.0) -> None:
        if progress_every_s <= 0:
            raise ValueError(f"progress_every_s must be above 0, not {progress_every_s}")
        if stall_s <= 0:
            raise ValueError(f"recovery stall_s must be above 0, not {stall_s}")
        self.progress_every_s = progress_every_s
        self.stall_s = stall_s
        self._started_s: float | None = None  # None: not recovering
        self._moved_s = 0.0  # when a record was last read (or a highwater learnt)
        self._said_s = 0.0  # when a progress line was last given
        self._left: dict[Changelog, int | None] = {}
        #: Records left when first seen: a recovery shorter than a look reads some before it.
        self._total: dict[Changelog, int] = {}

    def look(self, now_s: float, recovering: bool,
             remaining: Mapping[Changelog, int | None], finished: bool) -> Look:
        """``recovering``: Faust's recovery is on (its ``in_recovery``); ``finished``: it has
        ended, the tables ready (its tables' ``actives_ready``); ``remaining``: records left per
        changelog partition being recovered, None where its highwater or starting offset is not
        known yet.

        A recovery starts with ``recovering`` and ends only once it is ``finished`` too: Faust
        drops ``in_recovery`` whenever nothing it knows is left to read, also while the
        changelogs' highwaters are awaited (a slow answer), and raises it again once they come.
        """
        if self._started_s is not None and finished and not recovering:
            return self._ended(now_s)
        if self._started_s is None:
            if not recovering:
                return Look(0.0, 0)
            self._started_s = self._moved_s = now_s
            self._said_s = now_s - self.progress_every_s  # the first look says it started
        if self._moved(remaining):
            self._moved_s = now_s
        self._left = dict(remaining)
        for changelog, left in remaining.items():
            if left is not None:
                self._total.setdefault(changelog, left)
        recovering_s = now_s - self._started_s
        left_total = sum(left or 0 for left in remaining.values())
        if now_s - self._moved_s >= self.stall_s:
            return Look(recovering_s, left_total, stalled=self._stalled(now_s))
        if now_s - self._said_s < self.progress_every_s:
            return Look(recovering_s, left_total)
        self._said_s = now_s
        level = logging.WARNING if recovering_s >= SLOW_S else logging.INFO
        return Look(recovering_s, left_total, self._progress(recovering_s), level)

    def _moved(self, remaining: Mapping[Changelog, int | None]) -> bool:
        """A record read or a highwater learnt since the last look."""
        for changelog, left in remaining.items():
            before = self._left.get(changelog)
            if left is not None and (before is None or left < before):
                return True
        return False

    def _ended(self, now_s: float) -> Look:
        line = (f"recovered the tables in {now_s - self._started_s:.1f} s: "
                f"{sum(self._total.values()):,} records of {len(self._left)} changelog "
                "partitions")
        self._started_s, self._left, self._total = None, {}, {}
        return Look(0.0, 0, line)

    def _progress(self, recovering_s: float) -> str:
        if self._left and all(left is None for left in self._left.values()):
            return (f"recovering the tables for {recovering_s:.0f} s: waiting for the "
                    f"changelogs' end offsets ({len(self._left)} changelog partitions)")
        total = sum(self._total.values())
        done = total - sum(left or 0 for left in self._left.values())
        return (f"recovering the tables for {recovering_s:.0f} s: {done:,} of {total:,} records "
                f"read; waiting on {self._waited_on()}")

    def _stalled(self, now_s: float) -> str:
        return (f"the tables' recovery read nothing for {now_s - self._moved_s:.0f} s (the "
                f"bound, recovery_stall_s, is {self.stall_s:g} s): waiting on {self._waited_on()}")

    def _waited_on(self) -> str:
        """The partitions with records left (or not known yet), the most left first."""
        waited = sorted((c for c, left in self._left.items() if left is None or left > 0),
                        key=lambda c: (-(self._left[c] or 0), c))
        if not waited:
            return "Faust to end the recovery (no records left)"
        named = [f"{topic}[{partition}] " + ("highwater not known yet" if left is None else
                                             f"{left:,} left")
                 for (topic, partition), left in ((c, self._left[c]) for c in waited[:NAMED])]
        more = f" and {len(waited) - NAMED} more" if len(waited) > NAMED else ""
        return ", ".join(named) + more


def changelogs_left(recovery) -> dict[Changelog, int | None]:
    """Records left per active changelog partition of Faust's ``Recovery``: its highwater (the
    last offset) less the offset it has read to; None until both are known."""
    left: dict[Changelog, int | None] = {}
    for tp in recovery.active_tps:
        highwater, offset = recovery.active_highwaters.get(tp), recovery.active_offsets.get(tp)
        left[(tp.topic, tp.partition)] = (None if highwater is None or offset is None
                                          else max(0, highwater - offset))
    return left


async def watch_recovery(recovery, watch: RecoveryWatch, show: Callable[[Look], None], app,
                         every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
                         ) -> None:
    """Look at Faust's ``recovery`` every ``every_s`` until ``app`` (the Faust app, a mode
    service) stops: ``show`` each look (the gauges), log its line, and on a stall log it as an
    ERROR and crash ``app``. It ends with the app (stopped or crashed otherwise), which also
    cuts the wait between two looks short."""
    while not app.should_stop:
        seen = watch.look(clock(), recovery.in_recovery, changelogs_left(recovery),
                          recovery.tables.actives_ready)
        show(seen)
        if seen.line:
            logger.log(seen.level, "%s", seen.line)
        if seen.stalled:
            logger.error("the streams worker stops: %s", seen.stalled)
            await app.crash(RecoveryStalled(seen.stalled))
            return
        await app.sleep(every_s)


def step_timed_out(timeout_s: float | None, stopping: bool) -> bool:
    """Whether Faust's recovery, told its wait for a step was "stopped", in fact timed out: a
    step waited on with a timeout while the worker is not stopping (nor crashed)."""
    return timeout_s is not None and not stopping


def step_timed_out_line(step: str, timeout_s: float, changelogs: Collection[Changelog]) -> str:
    """Why the worker stops: the step, its bound and the changelog partitions being recovered."""
    named = ", ".join(f"{topic}[{partition}]" for topic, partition in sorted(changelogs)[:NAMED])
    more = f" and {len(changelogs) - NAMED} more" if len(changelogs) > NAMED else ""
    return (f"the tables' recovery step {step} had no answer in {timeout_s:g} s (the bound, "
            f"broker_request_timeout): the changelog partitions "
            f"{named + more if named else '(none assigned)'} are not recovered")


class GuardedRecovery(Recovery):
    """Faust's recovery, which crashes the worker when one of its steps times out rather than
    ending its recovery task silently, which left the worker running unrecovered."""

    async def _wait(self, coro, timeout=None) -> None:
        try:
            await super()._wait(coro, timeout=timeout)
        except ServiceStopped:
            if not step_timed_out(timeout, self.should_stop):
                raise
            step = getattr(coro, "__name__", type(coro).__name__)
            line = step_timed_out_line(step, timeout, [(tp.topic, tp.partition)
                                                       for tp in self.active_tps])
            logger.error("the streams worker stops: %s", line)
            await self.app.crash(RecoveryStepTimedOut(line))
            raise  # Faust's recovery task ends, as it did on the timeout before


class GuardedTableManager(TableManager):
    """Faust's table manager with a ``GuardedRecovery`` (``app.conf.TableManager``)."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = GuardedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
