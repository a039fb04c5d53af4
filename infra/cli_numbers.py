"""Number options of the command line: one parser for every float option, so that ``nan`` is
refused as what it is, naming the option and its range.

typer's own range check compares the value with its bounds: ``--rate-scale nan`` fails both
comparisons and was refused as "should be less than or equal to 1000000", and an option with
no bound would have taken ``nan`` as given. Declare each float option with ``number_option``
instead of ``typer.Option``: typer still shows the range in ``--help``, and this parser checks
it (typer skips its own check for an option that has a parser).
"""

import math
from dataclasses import dataclass
from typing import Any

import typer


def _bound(value: float) -> str:
    """``1,209,600``, ``0.05``, ``1e-06``: a bound as a reader of ``--help`` would write it."""
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


@dataclass(frozen=True)
class _Number:
    """Parses an option's text (or its default) to a float within ``[low, high]``; ``nan`` is in
    no range, and ``inf`` only in one with no upper bound."""

    low: float | None
    high: float | None

    @property
    def wanted(self) -> str:
        if self.low is not None and self.high is not None:
            return f"a number from {_bound(self.low)} to {_bound(self.high)}"
        if self.low is not None:
            return f"a number >= {_bound(self.low)}"
        return "a number" if self.high is None else f"a number <= {_bound(self.high)}"

    def __call__(self, value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if not low <= number <= high:  # (false for nan, whatever the bounds)
            shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            # click names the option: "Invalid value for '--rate-scale': must be ..."
            raise typer.BadParameter(f"must be {self.wanted}, got {shown}")
        return number


def number_option(*names: str, min: float | None = None, max: float | None = None,
                  **kwargs: Any) -> Any:
    """``typer.Option(*names, min=min, max=max, **kwargs)`` for a float, parsed by ``_Number``
    (the bounds go to typer too, for ``--help``)."""
    return typer.Option(*names, min=min, max=max, parser=_Number(min, max), **kwargs)
