"""Mergeable quantile sketches: DDSketch bins kept in a JSON-friendly dict. Pure.

A sketch is a plain ``dict`` from a DDSketch bin key (as a string, so that it survives a JSON
round trip through a table's changelog unchanged) to a count, plus ``"z"`` for zeros. Adding a
value is one dict increment; merging two sketches adds their counts bin by bin, so the sketches of
one-second buckets merge into the sketch of any window. Quantiles are answered by the ``ddsketch``
library itself from the merged bins.

Accuracy: DDSketch with relative accuracy ``RELATIVE_ACCURACY`` (1 %) returns, for quantile ``q``
of ``n`` values, a value within 1 % of the value at rank ``q * (n - 1)`` of the sorted input
(tests/unit/streams/test_sketch.py checks this bound against numpy on skewed data).
"""

from collections.abc import Iterable, Mapping

from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

RELATIVE_ACCURACY = 0.01
_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_ZERO = "z"

Sketch = dict[str, float]


def initialize() -> Sketch:
    return {}


def add(sketch: Sketch, value: float, weight: float = 1.0) -> Sketch:
    """Count ``value`` (a non-negative latency; negative values count as zero)."""
    key = str(_MAPPING.key(value)) if value > _MAPPING.min_possible else _ZERO
    sketch[key] = sketch.get(key, 0.0) + weight
    return sketch


def merge(into: Sketch, other: Mapping[str, float]) -> Sketch:
    for key, count in other.items():
        into[key] = into.get(key, 0.0) + count
    return into


def count(sketch: Mapping[str, float]) -> float:
    return sum(sketch.values())


def quantiles(sketch: Mapping[str, float], qs: Iterable[float]) -> list[float | None]:
    """The values at quantiles ``qs`` (each in [0, 1]); ``None`` for an empty sketch."""
    store, zeros = DenseStore(), 0.0
    for key, weight in sketch.items():
        if key == _ZERO:
            zeros += weight
        elif weight > 0:
            store.add(int(key), weight)
    ddsketch = BaseDDSketch(_MAPPING, store, DenseStore(), zeros)
    return [ddsketch.get_quantile_value(q) for q in qs]


def from_values(values: Iterable[float]) -> Sketch:
    sketch = initialize()
    for value in values:
        add(sketch, value)
    return sketch
