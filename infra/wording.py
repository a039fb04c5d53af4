"""Counts as a reader says them: ``1 worker``, ``2 workers``, ``1,024 requests``. A message a
user sees on a common path (a demo of one worker, a trace cut one task short) reads "1 worker
up", not "1 workers up"."""


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun plural (``plural``, or the noun and an 's') unless
    the count is one; the count with thousands separators."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def of_total(done: int, total: int) -> str:
    """``done/total`` with thousands separators, as ``counted`` writes a count: a progress
    line (``sent 1,234/12,345``)."""
    return f"{done:,}/{total:,}"


#: A rich progress bar's ``done/total`` column, written as ``of_total`` writes it.
OF_TOTAL_COLUMN = "{task.completed:,.0f}/{task.total:,.0f}"


#: ``extra`` of a log record that tells a user something of their own input (a trace's unknown
#: field): the command line prints it as it prints its other warnings (``warning: ...``), not as
#: a timestamped log line; a library caller's logging shows it as any other record.
TO_USER = {"to_user": True}
