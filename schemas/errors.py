"""The root of Governor's exceptions.

Terminal errors (bad input, bad configuration) are separate from retryable ones (a broker that is
not up yet), so a caller can decide whether trying again can help.
"""


class GovernorError(Exception):
    """Base class of every error Governor raises on purpose."""


class TerminalError(GovernorError):
    """Retrying cannot help: the input or the setup is wrong and must be changed."""


class RetryableError(GovernorError):
    """A transient condition (a broker starting, a store busy); the same call may succeed later."""
