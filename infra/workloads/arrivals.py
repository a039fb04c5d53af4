"""Arrival processes for workload builders: renewal processes with a fitted inter-arrival shape.

ServeGen publishes, per tenant and 600 s window, the request rate and the best-fitting
inter-arrival distribution (Gamma or Weibull) with its two parameters. A builder keeps the fitted
*shape* (which sets the burstiness: Gamma's CV is 1/sqrt(shape); a Weibull of shape < 1 is
burstier still) and sets the *scale* so the mean gap is 1/rate for the rate it wants, which is
how a window is replayed at another rate without changing its burstiness.
"""

import math

import numpy as np


def gap_sampler(dist: str, shape: float, rate_rps: float, rng: np.random.Generator):
    """A function drawing ``n`` inter-arrival gaps (seconds) with mean ``1 / rate_rps``.

    ``dist``: ``Gamma`` or ``Weibull`` (ServeGen's names), anything else a Poisson process.
    """
    mean_gap = 1.0 / rate_rps
    if dist == "Gamma" and shape > 0:
        return lambda n: rng.gamma(shape, mean_gap / shape, size=n)
    if dist == "Weibull" and shape > 0:
        scale = mean_gap / math.gamma(1.0 + 1.0 / shape)
        return lambda n: scale * rng.weibull(shape, size=n)
    return lambda n: rng.exponential(mean_gap, size=n)


def renewal_arrivals(start_s: float, end_s: float, dist: str, shape: float, rate_rps: float,
                     rng: np.random.Generator, chunk: int = 256) -> list[float]:
    """Arrival times in ``[start_s, end_s)`` of a renewal process in its steady state: as if it
    had been running long before ``start_s``, the window cuts into a gap picked in proportion to
    its length (one of ``chunk`` drawn), and the first arrival comes a uniform share of it later.
    (A plain gap would put the first arrival of a bursty process, whose gaps are mostly short,
    right at ``start_s``: every tenant of every window at once.)"""
    if rate_rps <= 0 or end_s <= start_s:
        return []
    draw = gap_sampler(dist, shape, rate_rps, rng)
    gaps = draw(chunk)
    cut = float(gaps[rng.choice(chunk, p=gaps / gaps.sum())])
    t = start_s + cut * float(rng.uniform())
    out: list[float] = []
    while t < end_s:
        for gap in draw(chunk):
            if t >= end_s:
                break
            out.append(t)
            t += float(gap)
    return out
