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


#: The field errors one message lists, at most, the rest counted (``listed``): a map of 1,000
#: bad tenants was a message of 80 kB, every tenant's error.
LISTED_ERRORS = 5


def listed(errors: list[str], total: int) -> str:
    """The first ``LISTED_ERRORS`` of ``errors`` (one of each of ``total``) joined by "; ",
    then "and N more" where there are more."""
    more = total - min(len(errors), LISTED_ERRORS)
    return "; ".join(errors[:LISTED_ERRORS] + ([f"and {more} more"] if more > 0 else []))


def one_line(exc: Exception) -> str:
    """An error as one line: a validation error as ``field: what is wrong`` for each field (the
    first ``LISTED_ERRORS``, then how many more)."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        return listed([_field_error(err) for err in errors[:LISTED_ERRORS]], len(errors))
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
