"""Exact samples of the discrete Gaussian over the integers, and the noise source that puts them
on the share grid (docs/privacy.md, section 11).

The algorithm is Canonne, Kamath & Steinke's ("The discrete Gaussian for differential privacy",
NeurIPS 2020; CKS20): Algorithm 2 draws a discrete Laplace of integer scale t from a uniform on
{0..t-1} accepted with probability exp(-U/t) and a geometric count of Bernoulli(exp(-1))
successes; Algorithm 3 accepts a discrete Laplace Y of scale t = floor(sigma) + 1 with
probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). Every step runs on whole numpy arrays (the
candidates still pending are redrawn together): 2^20 values take 0.3 to 0.4 s of CPU here.

Every Bernoulli(exp(-gamma)) is exact (:func:`bernoulli_exp`): a uniform U is drawn 64 bits at a
time and compared with exp(-gamma). Floating point decides only where a certified margin (2^-30
plus a bound on the rounding error of gamma) separates the two; elsewhere (about one comparison in
10^9) U gets more bits and exp(-gamma) is bracketed by Python's correctly rounded
``decimal.Decimal.exp`` on the exact rational gamma, at growing precision, until the bracket and
U's interval part. So the output is exactly the discrete Gaussian whenever the bits are uniform,
with sigma^2 taken exactly as the float given (a dyadic rational).

The bits come from ChaCha20 (``randomgen.ChaCha``, 20 rounds), keyed per :meth:`sample` call
from the OS CSPRNG, as for :class:`secure.noise.GaussianNoise` (whose seeding, privacy flag and
checkpoint state this source shares). OpenDP (0.16) samples the same distribution exactly but
one value at a time, about 15 us each (docs/privacy.md, section 2.1): 2^20 values would take 16 s.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from secure.aggregation import SHARE_GRID
from secure.dp import check_non_negative
from secure.noise import GaussianNoise

#: Floating point decides a Bernoulli(exp(-gamma)) only where U and exp(-gamma) are further
#: apart than this plus the bound on gamma's rounding error.
FLOAT_MARGIN = 2.0**-30
# u (64 bits) as a float: U lies within 2^-52 of u * 2^-64 rounded.
_U_SLACK = 2.0**-52
# 8 units in the last place of a double: the rounding bounds below are multiples of it.
_ULP8 = 2.0**-50
_WORD = 2**64


def _exp_neg_bracket(gamma: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """``(lo, hi)`` with ``lo <= exp(-gamma) <= hi``, of relative width about 10^-digits.

    gamma is rounded to ``digits + 10`` significant digits (relative error 10^-(digits+9)),
    then ``Decimal.exp`` rounds correctly: the result is within (gamma + 1) 10^-(digits+9) of
    exp(-gamma), relatively; the bracket allows (gamma + 2) 10^-digits."""
    with decimal.localcontext() as context:
        context.prec = digits + 10
        context.Emin, context.Emax = decimal.MIN_EMIN, decimal.MAX_EMAX
        approx = (-(decimal.Decimal(gamma.numerator) / decimal.Decimal(gamma.denominator))).exp()
    value = Fraction(approx)
    slack = value * (gamma + 2) / 10**digits
    return value - slack, value + slack


def exact_uniform_below(gen: np.random.Generator, word: int, gamma: Fraction) -> bool:
    """Whether U < exp(-gamma), for U uniform on [0, 1) whose first 64 bits are ``word``: more
    bits of U are drawn from ``gen`` until the comparison is decided exactly."""
    if gamma == 0:
        return True
    bits, digits = 64, 30
    while True:
        lo, hi = _exp_neg_bracket(gamma, digits)
        if Fraction(word + 1, 2**bits) <= lo:
            return True
        if Fraction(word, 2**bits) >= hi:
            return False
        word = word * _WORD + int(gen.integers(0, _WORD, dtype=np.uint64))
        bits, digits = bits + 64, digits * 2


def bernoulli_exp(
    gen: np.random.Generator,
    gamma: np.ndarray,
    gamma_error: np.ndarray | float,
    exact_gamma: Callable[[int], Fraction],
) -> np.ndarray:
    """Independent Bernoulli(exp(-gamma_i)) draws (a bool array), exactly.

    ``gamma`` holds floating-point values of the exact rationals ``exact_gamma(i)`` (>= 0), each
    within ``gamma_error`` of it. U_i = u_i 2^-64 + (later bits): the draw is U_i < exp(-gamma_i),
    decided from u_i and numpy's exp where they are more than :data:`FLOAT_MARGIN` +
    ``gamma_error`` apart (|exp(-a) - exp(-b)| <= |a - b| for a, b >= 0, and numpy's exp errs
    by a few units in the last place, far below the margin), and by
    :func:`exact_uniform_below` elsewhere."""
    gamma = np.asarray(gamma, dtype=np.float64)
    words = gen.integers(0, _WORD, size=gamma.shape, dtype=np.uint64)
    uniform = words.astype(np.float64) * 2.0**-64
    with np.errstate(over="ignore", under="ignore"):
        p = np.exp(-gamma)
    margin = FLOAT_MARGIN + gamma_error
    out = uniform + _U_SLACK <= p - margin
    undecided = np.flatnonzero(~out & (uniform - _U_SLACK < p + margin))
    for i in undecided:
        out[i] = exact_uniform_below(gen, int(words[i]), exact_gamma(int(i)))
    return out


def _geometric_exp_minus_one(gen: np.random.Generator, count: int) -> np.ndarray:
    """For each of ``count`` entries, the number of Bernoulli(exp(-1)) successes before the
    first failure (CKS20, Algorithm 2, the loop on V)."""
    out = np.zeros(count, dtype=np.int64)
    active = np.arange(count)
    while active.size:
        won = bernoulli_exp(gen, np.ones(active.size), _ULP8, lambda _: Fraction(1))
        active = active[won]
        out[active] += 1
    return out


def discrete_laplace(gen: np.random.Generator, scale: int, count: int) -> np.ndarray:
    """``count`` i.i.d. draws (int64) of the discrete Laplace with P(x) proportional to
    exp(-|x| / scale), for an integer ``scale`` >= 1 (CKS20, Algorithm 2)."""
    t = int(scale)
    if t < 1:
        raise ValueError(f"the discrete Laplace scale must be an integer >= 1, got {scale}")
    out = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        k = pending.size
        u = gen.integers(0, t, size=k, dtype=np.int64)
        ratio = u / t  # correctly rounded: within 2^-53 of u / t <= 1
        keep = bernoulli_exp(gen, ratio, _ULP8, lambda i, u=u: Fraction(int(u[i]), t))
        magnitude = u.copy()
        kept = np.flatnonzero(keep)
        magnitude[kept] += t * _geometric_exp_minus_one(gen, kept.size)
        negative = gen.integers(0, 2, size=k, dtype=np.int8) == 1
        done = keep & ~(negative & (magnitude == 0))  # -0 would count 0 twice
        out[pending[done]] = np.where(negative, -magnitude, magnitude)[done]
        pending = pending[~done]
    return out


def discrete_gaussian(gen: np.random.Generator, sigma2: float, count: int) -> np.ndarray:
    """``count`` i.i.d. draws (int64) of the discrete Gaussian N_Z(0, sigma2): P(x) proportional
    to exp(-x^2 / (2 sigma2)) on the integers (CKS20, Algorithm 3; exact, see the module).

    Its variance is below sigma2, by a relative 8 pi^2 sigma2 exp(-2 pi^2 sigma2) to leading
    order (by Poisson summation; 2.1e-7 at sigma2 = 1, 1e-15 at sigma2 = 2, computed)."""
    sigma2 = check_non_negative("sigma2", sigma2)
    if sigma2 == 0.0:
        return np.zeros(count, dtype=np.int64)
    exact_sigma2 = Fraction(sigma2)
    t = math.floor(math.sqrt(sigma2)) + 1
    centre = sigma2 / t
    out = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        y = discrete_laplace(gen, t, pending.size)
        a = np.abs(y).astype(np.float64)
        gamma = (a - centre) ** 2 / (2.0 * sigma2)
        # rounding in sigma2 / t, a - centre, the square and the division (docs/privacy.md,
        # section 11.1): at most 8 ulp of gamma + (a + centre)^2 / sigma2
        error = _ULP8 * (gamma + (a + centre) ** 2 / sigma2 + 1.0)

        def exact(i: int, y: np.ndarray = y) -> Fraction:
            return (abs(int(y[i])) - exact_sigma2 / t) ** 2 / (2 * exact_sigma2)

        accept = bernoulli_exp(gen, gamma, error, exact)
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out


class DiscreteGaussianNoise(GaussianNoise):
    """Noise on the share grid g = 2^-12 (``secure.aggregation.SHARE_GRID``): every value is
    g * N_Z(0, (std / g)^2), an exact discrete Gaussian in units of the grid, drawn by
    :func:`discrete_gaussian`. ``std`` is the discrete Gaussian's sigma in value units (its
    variance is sigma^2 to within a relative 2.1e-7 for sigma >= g).

    Seeding, :attr:`private` and the checkpoint state are :class:`secure.noise.GaussianNoise`'s:
    unseeded, every :meth:`sample` call keys a fresh ChaCha20 generator from ``secrets``;
    ``seed=<int>`` is for reproducible tests and is not private."""

    grid = SHARE_GRID

    def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
        std = check_non_negative("std", std)
        size = math.prod((shape,) if isinstance(shape, int) else shape)
        units = discrete_gaussian(self._generator(), (std / self.grid) ** 2, size)
        return (units * self.grid).reshape(shape)  # exact: |units| < 2^53

    def __repr__(self) -> str:
        return f"DiscreteGaussianNoise(reproducible={self.reproducible})"
