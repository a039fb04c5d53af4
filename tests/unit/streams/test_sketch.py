"""DDSketch-backed quantiles: the documented error bound, merging, and the JSON round trip."""

import json

import numpy as np
import pytest

from streams.signals import sketch

DISTRIBUTIONS = {
    "lognormal": lambda rng, n: rng.lognormal(-1.0, 1.2, n),
    "exponential": lambda rng, n: rng.exponential(0.3, n),
    "uniform": lambda rng, n: rng.uniform(0.001, 30.0, n),
    "bimodal": lambda rng, n: np.concatenate([rng.normal(0.05, 0.005, n // 2).clip(1e-4),
                                              rng.normal(4.0, 0.5, n - n // 2).clip(1e-4)]),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantile_within_relative_accuracy_of_numpys(name, q):
    values = DISTRIBUTIONS[name](np.random.default_rng(7), 20_000)
    estimate = sketch.quantiles(sketch.from_values(values), [q])[0]
    assert estimate == pytest.approx(float(np.quantile(values, q)), rel=sketch.RELATIVE_ACCURACY)


def test_merged_buckets_answer_like_one_sketch_of_all_values():
    rng = np.random.default_rng(3)
    parts = [rng.lognormal(0, 1, 1000) for _ in range(10)]
    merged = sketch.initialize()
    for part in parts:
        sketch.merge(merged, sketch.from_values(part))
    whole = sketch.from_values(np.concatenate(parts))
    assert merged == whole
    assert sketch.count(merged) == 10_000


def test_survives_a_json_round_trip_as_a_changelog_does():
    bins = sketch.from_values([0.0, 0.1, 0.2, 5.0])
    back = json.loads(json.dumps(bins))
    assert sketch.quantiles(back, [0.0, 0.5, 1.0]) == sketch.quantiles(bins, [0.0, 0.5, 1.0])
    assert sketch.quantiles(back, [0.0])[0] == 0  # zeros are kept apart


def test_hand_computed_small_sets():
    bins = sketch.from_values([0.1, 0.2, 0.3, 0.4, 10.0])
    p50, p100 = sketch.quantiles(bins, [0.5, 1.0])
    assert p50 == pytest.approx(0.3, rel=0.01)
    assert p100 == pytest.approx(10.0, rel=0.01)
    assert sketch.quantiles({}, [0.5]) == [None]


@pytest.mark.parametrize("values", [
    [0.5, 0.5, 0.5, 3.0],  # a tenant's four TTFTs, one of a request that waited
    [0.1] * 103 + [1.07, 2.385, 2.99],  # a demo's 106, its tail resumed after a kill
    [0.2, 0.3],
    [0.0, 0.0, 4.0],
])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_a_few_values_give_numpys_interpolated_quantile(values, q):
    """As the report and the demo take a percentile (between the two ranks around q * (n - 1)),
    not the lower rank alone: the p99 of the 106 was 1.07 s live, 2.32 s by numpy."""
    estimate = sketch.quantiles(sketch.from_values(values), [q])[0]
    assert estimate == pytest.approx(float(np.quantile(values, q)), rel=sketch.RELATIVE_ACCURACY)
