"""When a report's window ends: query parameters, never the engine's clock.

A report covers the ``--days`` before ``{now}``: ``--until TIME``, else the wall clock as it
runs (``now64(3)`` before 7 Dec, which left no way to ask for a past window, nor for a test to
fix the time: time is a parameter). Records stamped at or after ``{until}`` are left out: TIME
where ``--until`` is given; else nothing is, so that a record stamped ahead of the clock (an
operator's command an hour fast, which its readers refused) still shows, as before.

Times are bound as text in UTC to the millisecond (``sql_time``), so that they travel as JSON
to a sink's SQL endpoint and as ``governor sql --param``, and mean the same instant to a server
in another zone.
"""

import datetime as dt
import time

from schemas.errors import TerminalError

DAY_MS = 86_400_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class ReportError(TerminalError):
    """A report asked for what it cannot answer: a window's end that is no time, or is ahead of
    the clock, or more days than its tables keep."""


#: Where the window's days count back from: ``--until``, else the wall clock.
NOW = "{now:DateTime64(3, 'UTC')}"
#: Where the window ends: ``--until``, else ``NO_END``.
UNTIL = "{until:DateTime64(3, 'UTC')}"
#: The latest time a ``DateTime64(3)`` holds: no end.
NO_END = "2299-12-31 23:59:59.999"


def wall_clock_ms() -> int:
    """The wall clock, in ms: where a report's window ends unless told (as ``infra.bus.now_ms``,
    without the Kafka client that module loads)."""
    return time.time_ns() // 1_000_000


def sql_time(ms: int) -> str:
    """The time ``ms`` (since the epoch) as ``NOW`` takes it: ``2026-12-06 00:00:00.000``."""
    at = dt.datetime.fromtimestamp(ms // 1000, dt.UTC)
    return f"{at:%Y-%m-%d %H:%M:%S}.{ms % 1000:03d}"


def window_parameters(now_ms: int, until_ms: int | None = None) -> dict[str, str]:
    """``now`` and ``until`` of a window that ends at ``until_ms``; None: one whose days count
    back from ``now_ms`` (the wall clock), with no end."""
    if until_ms is None:
        return {"now": sql_time(now_ms), "until": NO_END}
    return {"now": sql_time(until_ms), "until": sql_time(until_ms)}


def in_window(column: str, since: str) -> str:
    """The condition that ``column`` is at or after ``since`` and before the window's end."""
    return f"{column} >= {since} AND {column} < {UNTIL}"


def parse_until(text: str, now_ms: int) -> int:
    """``--until TIME`` in ms since the epoch: ISO-8601 with its zone (``2026-12-06T00:00:00Z``)
    or a date (its midnight UTC: the reports' days are UTC days). A time without a zone is
    refused, not guessed, and so is one ahead of ``now_ms``: a window that ends later holds
    nothing more, and a year typed wrong would give a thinner report without a word; and one
    before 1970, where no event time is (the engine could not read one before 1900)."""
    at = _utc_time(text)
    if at is None:
        raise ReportError(f"--until {text!r} is no ISO-8601 time with a zone (e.g. "
                          "2026-12-06T00:00:00Z) nor a date (2026-12-06: its midnight UTC)")
    until = (at - _EPOCH) // dt.timedelta(milliseconds=1)
    if until < 0:
        raise ReportError(f"--until {text} is before 1970-01-01T00:00:00Z, when event times "
                          "begin: a window that ends then holds nothing")
    if until > now_ms:
        raise ReportError(f"--until {text} is ahead of this clock ({sql_time(now_ms)} UTC): a "
                          "report covers what has happened (leave --until out for a window "
                          "that ends now)")
    return until


def _utc_time(text: str) -> dt.datetime | None:
    """``text`` as an aware time (a date: its midnight UTC), or None if it is none."""
    try:
        return dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.UTC)
    except ValueError:
        pass
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
