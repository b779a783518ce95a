"""Tests for secure/discrete_gaussian.py: the exact discrete Gaussian sampler (CKS20) and the
noise source on the share grid. Every statistic here is of a seeded draw, so it is fixed."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from randomgen import ChaCha
from scipy import stats

from secure import discrete_gaussian as dg
from secure.aggregation import SHARE_GRID
from secure.discrete_gaussian import (
    DiscreteGaussianNoise,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    exact_uniform_below,
)


def chacha(seed: int) -> np.random.Generator:
    return np.random.Generator(ChaCha(key=seed, counter=0, rounds=20))


def chi_square_p(draws: np.ndarray, log_weight, support: int) -> float:
    """p-value of a chi-square test of ``draws`` against P(x) proportional to
    exp(log_weight(x)) on the integers, |x| <= support; the tails beyond in one cell each."""
    xs = np.arange(-support, support + 1)
    far = np.arange(support + 1, 40 * support)
    weights = np.exp(log_weight(xs))
    tail = np.exp(log_weight(far)).sum()
    total = weights.sum() + 2 * tail
    expected = np.concatenate([[tail], weights, [tail]]) / total * draws.size
    clipped = np.clip(draws, -support - 1, support + 1) + support + 1
    observed = np.bincount(clipped, minlength=xs.size + 2)
    keep = expected >= 5  # the chi-square approximation needs >= 5 per cell
    expected_kept = np.append(expected[keep], expected[~keep].sum())
    observed_kept = np.append(observed[keep], observed[~keep].sum())
    if expected_kept[-1] < 5:
        expected_kept[-2] += expected_kept[-1]
        observed_kept[-2] += observed_kept[-1]
        expected_kept, observed_kept = expected_kept[:-1], observed_kept[:-1]
    return float(stats.chisquare(observed_kept, expected_kept).pvalue)


@pytest.mark.parametrize("sigma2", [0.3, 2.5, 40.0])
def test_discrete_gaussian_matches_its_pmf(sigma2: float) -> None:
    draws = discrete_gaussian(chacha(1), sigma2, 200_000)
    assert draws.dtype == np.int64
    support = math.ceil(5 * math.sqrt(sigma2)) + 1
    p = chi_square_p(draws, lambda x: -(x.astype(float) ** 2) / (2 * sigma2), support)
    assert p > 1e-3


def test_discrete_gaussian_pmf_is_not_the_rounded_gaussian() -> None:
    """The chi-square test can fail: the rounded continuous Gaussian of the same sigma, whose
    pmf differs by a few percent at sigma^2 = 0.3, is rejected."""
    rounded = np.round(chacha(2).normal(0.0, math.sqrt(0.3), 200_000)).astype(np.int64)
    assert chi_square_p(rounded, lambda x: -(x.astype(float) ** 2) / 0.6, 4) < 1e-6


def test_discrete_gaussian_mean_and_variance_at_a_large_sigma() -> None:
    sigma2, n = 7.3e7, 2**18  # sigma ~ 8544 grid units, the scale of a real release
    draws = discrete_gaussian(chacha(3), sigma2, n).astype(np.float64)
    assert abs(draws.mean()) < 5 * math.sqrt(sigma2 / n)
    # the sample variance has std sigma^2 sqrt(2 / n)
    assert abs(draws.var() - sigma2) < 5 * sigma2 * math.sqrt(2 / n)
    assert abs(stats.skew(draws)) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(draws)) < 5 * math.sqrt(24 / n)


def test_discrete_laplace_matches_its_pmf() -> None:
    draws = discrete_laplace(chacha(4), 3, 100_000)
    assert chi_square_p(draws, lambda x: -np.abs(x) / 3.0, 25) > 1e-3


def test_exact_path_alone_gives_the_same_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a margin of 1 floating point decides nothing: every Bernoulli goes through
    :func:`exact_uniform_below`, and the draws still follow the pmf."""
    calls = []
    real = dg.exact_uniform_below

    def counted(gen: np.random.Generator, word: int, gamma: Fraction) -> bool:
        calls.append(gamma)
        return real(gen, word, gamma)

    monkeypatch.setattr(dg, "FLOAT_MARGIN", 1.0)
    monkeypatch.setattr(dg, "exact_uniform_below", counted)
    draws = discrete_gaussian(chacha(5), 1.7, 4000)
    assert len(calls) > 3 * 4000
    assert chi_square_p(draws, lambda x: -(x.astype(float) ** 2) / 3.4, 5) > 1e-3


class _Words:
    """A stand-in generator that hands out the given 64-bit words."""

    def __init__(self, *words: int) -> None:
        self.words = list(words)

    def integers(self, *args: object, **kwargs: object) -> int:
        return self.words.pop(0)


def _exp_minus_one_bits(bits: int) -> int:
    with localcontext() as context:
        context.prec = 100
        return int(Decimal(-1).exp() * (Decimal(2) ** bits))


def test_exact_comparison_reads_more_bits_only_when_it_must() -> None:
    word = _exp_minus_one_bits(64)  # U's first 64 bits equal exp(-1)'s: undecided
    follow = _exp_minus_one_bits(128) - word * 2**64  # exp(-1)'s next 64 bits
    assert exact_uniform_below(_Words(follow - 1), word, Fraction(1)) is True
    assert exact_uniform_below(_Words(follow + 1), word, Fraction(1)) is False
    assert exact_uniform_below(_Words(), word - 1, Fraction(1)) is True  # decided at 64 bits
    assert exact_uniform_below(_Words(), word + 1, Fraction(1)) is False
    assert exact_uniform_below(_Words(), 2**64 - 1, Fraction(0)) is True


def test_bernoulli_exp_frequencies() -> None:
    gamma = np.repeat([0.0, 0.1, 1.0, 3.0, 800.0], 40_000)
    won = bernoulli_exp(chacha(6), gamma, 2.0**-50, lambda i: Fraction(gamma[i]))
    for g in (0.0, 0.1, 1.0, 3.0):
        rate = won[gamma == g].mean()
        p = math.exp(-g)
        assert abs(rate - p) <= 5 * math.sqrt(p * (1 - p) / 40_000) + 1e-12
    assert not won[gamma == 800.0].any()


def test_noise_source_is_on_the_grid_reproducible_and_private_only_unseeded() -> None:
    noise = DiscreteGaussianNoise(seed=7)
    first = noise.sample((300, 16), std=0.5)
    assert first.shape == (300, 16) and first.dtype == np.float64
    units = first / SHARE_GRID
    assert np.array_equal(units, np.round(units))
    assert np.array_equal(first, DiscreteGaussianNoise(seed=7).sample((300, 16), std=0.5))
    assert not noise.private and DiscreteGaussianNoise().private
    assert abs(DiscreteGaussianNoise(seed=8).sample(2**16, std=0.5).std() - 0.5) < 0.01
    fresh = DiscreteGaussianNoise().sample(2**16, std=0.5)  # a fresh key per call
    assert np.array_equal(fresh / SHARE_GRID, np.round(fresh / SHARE_GRID))
    assert not np.array_equal(fresh, DiscreteGaussianNoise().sample(2**16, std=0.5))
    assert np.array_equal(noise.sample(5, std=0.0), np.zeros(5))
    assert repr(noise) == "DiscreteGaussianNoise(reproducible=True)"


def test_refusals() -> None:
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(chacha(0), -1.0, 3)
    with pytest.raises(ValueError, match="scale"):
        discrete_laplace(chacha(0), 0, 3)
    with pytest.raises(ValueError, match="std"):
        DiscreteGaussianNoise(seed=0).sample(3, std=math.nan)
