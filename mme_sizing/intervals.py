"""Confidence intervals for what the multi-model benchmarks measure (standard library only).

* A hit ratio is a share of requests: the Wilson score interval for a binomial proportion (Wilson 1927; Newcombe,
  "Two-sided confidence intervals for the single proportion", Statistics in Medicine 17, 1998, method 3). It keeps
  inside [0, 1] and stays honest near 0 and 1, where the normal ("Wald") interval collapses.
* A throughput is a mean over time: batch means (Law & Kelton, "Simulation Modeling and Analysis", ch. 9.5.3). The
  measured window is cut into equal batches, each batch's rate is one observation, and the interval is Student's t
  over the batch rates. It assumes the batches are roughly independent: ``lag1_autocorrelation`` says how far
  they are from it (near 0 is good; clearly positive means the batches are too short and the interval too narrow).

Both are two-sided 95% intervals unless told otherwise.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
WILSON = "Wilson score interval (binomial over requests)"
BATCH_MEANS = "batch means (Student t over per-batch rates)"


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    method: str
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the estimate (inf when the estimate is 0)."""
        return self.half_width / abs(self.estimate) if self.estimate else math.inf

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_dict(self) -> dict[str, float | str]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "method": self.method,
                "confidence": self.confidence}  # fmt: skip


def wilson(successes: int, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """Wilson score interval of ``successes`` out of ``trials``."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    share = successes / trials
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    # At 0 or all successes the bound is exactly 0 or 1 (rounding would leave it a hair away).
    low = 0.0 if successes == 0 else max(0.0, centre - spread)
    high = 1.0 if successes == trials else min(1.0, centre + spread)
    return Interval(share, low, high, WILSON, confidence)


def batch_means(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student t interval of the mean of ``values`` (one observation per batch; at least two)."""
    if len(values) < 2:
        raise ValueError(f"batch means need at least two batches, got {len(values)}")
    mean = statistics.fmean(values)
    error = statistics.stdev(values) / math.sqrt(len(values))
    spread = student_t_quantile(0.5 + confidence / 2, len(values) - 1) * error
    return Interval(mean, mean - spread, mean + spread, BATCH_MEANS, confidence)


def lag1_autocorrelation(values: Sequence[float]) -> float:
    """Lag-1 autocorrelation of a series (nan for fewer than three values or a constant series)."""
    if len(values) < 3:
        return math.nan
    mean = statistics.fmean(values)
    deviations = [value - mean for value in values]
    variance = sum(d * d for d in deviations)
    if variance == 0:
        return math.nan
    return sum(a * b for a, b in itertools.pairwise(deviations)) / variance


def student_t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """The ``probability`` quantile of Student's t with the given degrees of freedom (bisection on the CDF)."""
    if not 0 < probability < 1 or degrees_of_freedom < 1:
        raise ValueError(f"need 0 < probability < 1 and degrees_of_freedom >= 1, got {probability}, "
                         f"{degrees_of_freedom}")  # fmt: skip
    if probability < 0.5:
        return -student_t_quantile(1 - probability, degrees_of_freedom)
    low, high = 0.0, 1.0
    while student_t_cdf(high, degrees_of_freedom) < probability:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, degrees_of_freedom) < probability:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def student_t_cdf(t: float, degrees_of_freedom: int) -> float:
    """P(T <= t) for Student's t: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2), for t >= 0."""
    df = degrees_of_freedom
    tail = _regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5) / 2
    return 1 - tail if t >= 0 else tail


def _regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz; Numerical Recipes, 3rd ed., section 6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point: use the symmetry
        return 1 - front * _beta_fraction(1 - x, b, a) / b
    return front * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result
