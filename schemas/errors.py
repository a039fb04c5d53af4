"""The root of Governor's exceptions.

Terminal errors (bad input, bad configuration) are separate from retryable ones (a broker that is
not up yet), so a caller can decide whether trying again can help.
"""

from pydantic import ValidationError


class GovernorError(Exception):
    """Base class of every error Governor raises on purpose."""


class TerminalError(GovernorError):
    """Retrying cannot help: the input or the setup is wrong and must be changed."""


class RetryableError(GovernorError):
    """A transient condition (a broker starting, a store busy); the same call may succeed later."""


def one_line(exc: Exception) -> str:
    """An error as one line: a validation error as ``field: what is wrong`` for each field."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
    if isinstance(exc, KeyError):
        return str(exc.args[0])
    return str(exc)
