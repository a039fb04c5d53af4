"""The root of Governor's exceptions.

Terminal errors (bad input, bad configuration) are separate from retryable ones (a broker that is
not up yet), so a caller can decide whether trying again can help.
"""

from typing import Any

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
        return "; ".join(_field_error(err) for err in exc.errors(include_url=False))
    if isinstance(exc, KeyError):
        return str(exc.args[0])
    return str(exc)


def _field_error(err: Any) -> str:
    """One error of a validation: where, then what. A validator's own message is given as it
    wrote it (pydantic prefixes it "Value error, "), and a rule of the whole model (no field to
    name: a rule across sections, its message names the settings) by its message alone."""
    where = ".".join(str(part) for part in err["loc"])
    cause = err.get("ctx", {}).get("error")
    what = str(cause) if err["type"] == "value_error" and cause is not None else err["msg"]
    return f"{where}: {what}" if where else what
