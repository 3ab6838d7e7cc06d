"""The interval code against published values: Newcombe's (1998) worked examples of the Wilson score interval and the
textbook table of Student's t quantiles, not against itself."""

from __future__ import annotations

import math

import pytest

from mme_sizing.intervals import (
    BATCH_MEANS,
    WILSON,
    batch_means,
    lag1_autocorrelation,
    student_t_cdf,
    student_t_quantile,
    wilson,
)


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    # Newcombe, Statistics in Medicine 17 (1998) 857-872, Table I, method 3 (score method without continuity
    # correction), 95%: the examples 81/263, 15/148, 0/20 and 1/29.
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_interval_matches_newcombes_examples(successes: int, trials: int, low: float, high: float) -> None:
    interval = wilson(successes, trials)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)
    assert interval.estimate == successes / trials and interval.method == WILSON


def test_wilson_interval_mirrors_and_ends_at_one_for_all_successes() -> None:
    all_hits, no_hits = wilson(20, 20), wilson(0, 20)
    assert all_hits.high == 1.0 and all_hits.low == pytest.approx(1 - no_hits.high)


def test_wilson_interval_narrows_with_more_requests_as_one_over_root_n() -> None:
    few, many = wilson(30, 60), wilson(300, 600)
    assert many.half_width == pytest.approx(few.half_width / math.sqrt(10), rel=0.05)


def test_wilson_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes <= trials"):
        wilson(5, 4)
    with pytest.raises(ValueError, match="trials >= 1"):
        wilson(0, 0)


@pytest.mark.parametrize(
    ("probability", "df", "quantile"),
    # The t table (e.g. NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2, upper critical values).
    [(0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.975, 29, 2.045), (0.95, 10, 1.812),
     (0.995, 5, 4.032), (0.975, 100, 1.984)],
)  # fmt: skip
def test_student_t_quantiles_match_the_table(probability: float, df: int, quantile: float) -> None:
    assert student_t_quantile(probability, df) == pytest.approx(quantile, abs=6e-4)
    assert student_t_quantile(1 - probability, df) == pytest.approx(-quantile, abs=6e-4)


def test_student_t_with_one_degree_of_freedom_is_cauchy() -> None:
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


def test_batch_means_interval_is_the_t_interval_of_the_batch_rates() -> None:
    # Mean 3, sample standard deviation sqrt(2.5), standard error 0.7071; t(0.975, 4) = 2.7764.
    interval = batch_means([1.0, 2.0, 3.0, 4.0, 5.0])
    assert interval.estimate == 3.0 and interval.method == BATCH_MEANS
    assert interval.half_width == pytest.approx(2.7764 * math.sqrt(2.5 / 5), abs=1e-3)
    assert interval.relative_half_width == pytest.approx(interval.half_width / 3)
    assert interval.contains(4.9) and not interval.contains(5.0)


def test_batch_means_need_two_batches() -> None:
    with pytest.raises(ValueError, match="at least two batches"):
        batch_means([1.0])


def test_lag1_autocorrelation_of_alternating_and_trending_series() -> None:
    assert lag1_autocorrelation([1.0, -1.0] * 10) == pytest.approx(-0.95)  # (n - 1) / n of -1
    assert lag1_autocorrelation([float(i) for i in range(10)]) > 0.6
    assert math.isnan(lag1_autocorrelation([2.0, 2.0, 2.0]))
