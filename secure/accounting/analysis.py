"""The maths of privacy accounting (torch-free): epsilon after identical Gaussian releases.

Every joint inference (training round or evaluation pass) is one release of the Gaussian
mechanism with noise multiplier z (noise std / L2 sensitivity); :func:`epsilon_after` turns
(z, number of releases, delta) into epsilon, :func:`max_releases` back. No state here: the
release decision and the record of a session's releases are in :mod:`secure.accounting.budget`,
the search for z in :mod:`secure.accounting.calibration`. See docs/privacy.md section 4.

- ``accountant="rdp"`` (default): Google's ``dp-accounting`` RDP accountant, converted to
  (epsilon, delta) with the conversion of Balle et al. 2020 (Theorem 21), over a dense grid of
  orders. An upper bound on the true epsilon.
- ``accountant="prv"``: Microsoft's ``prv-accountant`` (Gopi et al. 2021, the reference
  implementation Opacus's PRV accountant is a port of); a numerical upper bound within
  ``PRV_EPS_ERROR`` of the exact value.
- ``sample_rate`` defaults to 1: no amplification by subsampling is claimed (the sampled node
  sets are visible to the service and to every client).

With ``sample_rate == 1`` the composition of R Gaussian releases with multiplier z is exactly one
Gaussian release with multiplier ``z / sqrt(R)`` (the privacy loss distributions coincide), so
the accountants are handed that single release: identical for RDP, and it keeps the PRV
discretisation independent of R (composing R copies, the PRV grid grows with R and needs gigabytes
for R in the thousands). Releases with different multipliers z_i compose the same way, to one
release with ``1 / sqrt(sum 1 / z_i^2)`` (:func:`composed_epsilon`).

Both backends are numpy/scipy only: importing this module never loads torch, so the aggregation
service can account privacy without it. They are imported on first use (scipy.stats and
scipy.signal cost about a second and 50 MB), so a service with no private session never loads
them. At sample rate 1 they give the numbers of the Opacus 1.6 accountants this module used
before (RDP: same RDP, conversion and orders, to 1e-14; PRV: the code Opacus ported, to 1e-10).
With ``sample_rate < 1`` the RDP epsilon is a little larger (under 0.5% measured): dp-accounting
bounds the subsampled RDP at fractional orders from above where Opacus sums the series exactly.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal, get_args

import numpy as np

AccountantName = Literal["rdp", "prv"]

#: The classic RDP orders (TF Privacy's, Opacus's ``RDPAccountant.DEFAULT_ALPHAS``, the default of
#: prv-accountant's RDP bound): 1.1, 1.2, ..., 10.9, 12, 13, ..., 63.
BASE_RDP_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
)
#: RDP orders for sample rate 1, where every order costs nothing: the base orders plus a
#: geometric grid alpha - 1 in [1e-3, 1e5] (ratio 10**(1/24)), so the minimum over the grid is
#: within 0.2% of the minimum over all real orders for z/sqrt(R) in [1.5e-3, 1e4], and within 1%
#: down to 5e-4 (dp-accounting's conversion skips orders <= 1.01, which only matter there, at
#: epsilon above 1e5).
RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(set(BASE_RDP_ORDERS) | {1.0 + 10.0 ** (k / 24) for k in range(-72, 121)})
)
#: RDP orders for sample rate < 1 (each order costs a series evaluation; large integer orders
#: cost a loop over alpha terms): the base orders extended to 256.
RDP_ORDERS_SUBSAMPLED: tuple[float, ...] = tuple(
    sorted(set(BASE_RDP_ORDERS) | {80, 96, 128, 160, 192, 256})
)
#: The PRV accountant's epsilon error (Opacus's default): the reported epsilon is an upper bound
#: at most this far above the estimate.
PRV_EPS_ERROR = 0.01
#: Refuse PRV discretisations larger than this (at the limit prv-accountant, computing in long
#: doubles, needs about 0.8 GB and tens of seconds); it would otherwise allocate until the process
#: is killed. At sample rate 1 the grid has a few thousand points.
MAX_PRV_GRID_POINTS = 5_000_000
ACCOUNTANTS: tuple[str, ...] = get_args(AccountantName)


class AccountingError(ValueError):
    """The accountant could not produce a trustworthy epsilon for these parameters."""


# --------------------------------------------------------------------------------------------
# validation (shared by the calibration and the budget)
# --------------------------------------------------------------------------------------------


def check_noise_multiplier(z: float) -> float:
    z = float(z)
    if not math.isfinite(z) or z < 0.0:
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {z!r}")
    return z


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def check_sample_rate(q: float) -> float:
    q = float(q)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {q!r}")
    return q


def check_releases(releases: int, *, minimum: int = 0) -> int:
    if isinstance(releases, bool) or not isinstance(releases, int | np.integer):
        raise TypeError(f"releases must be an int, got {type(releases).__name__}")
    if releases < minimum:
        raise ValueError(f"releases must be >= {minimum}, got {releases}")
    return int(releases)


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return epsilon


# --------------------------------------------------------------------------------------------
# epsilon
# --------------------------------------------------------------------------------------------


def rdp_epsilon(z: float, q: float, releases: int, delta: float) -> float:
    """dp-accounting's RDP epsilon of R releases (at sample rate 1: of the single equivalent
    release ``z / sqrt(R)``)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    if q == 1.0:
        acc = RdpAccountant(RDP_ORDERS)
        acc.compose(dp_accounting.GaussianDpEvent(z / math.sqrt(releases)))
    else:
        acc = RdpAccountant(RDP_ORDERS_SUBSAMPLED)
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        acc.compose(event, releases)
    return float(acc.get_epsilon(delta))


def _prv_mechanism(z: float, q: float, releases: int) -> tuple[float, int]:
    """The (noise multiplier, self-compositions) handed to the PRV accountant for R releases."""
    if q == 1.0:
        return z / math.sqrt(releases), 1
    return z, releases


def _prv_grid_points(z: float, q: float, steps: int, delta: float) -> float:
    """Size of the grid prv-accountant's ``PRVAccountant`` will allocate (mirrors its
    constructor) for ``steps`` self-compositions of one mechanism."""
    from prv_accountant import PoissonSubsampledGaussianMechanism
    from prv_accountant.accountant import compute_safe_domain_size

    delta_error = delta / 1000.0
    with np.errstate(all="ignore"):
        half_width = float(
            compute_safe_domain_size(
                prvs=[
                    PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=z)
                ],
                max_self_compositions=[steps],
                eps_error=PRV_EPS_ERROR,
                delta_error=delta_error,
            )
        )
    mesh = PRV_EPS_ERROR / math.sqrt(steps * math.log(12.0 / delta_error) / 2.0)
    return 2.0 * half_width / mesh


def prv_upper_epsilon(z: float, q: float, steps: int, delta: float, *, where: str) -> float:
    """prv-accountant's upper bound on epsilon after ``steps`` self-compositions (possibly inf).

    Raises :class:`AccountingError` for grids above ``MAX_PRV_GRID_POINTS`` and when the
    accountant fails; ``where`` describes the caller's parameters for the messages."""
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    hint = "use accountant='rdp' (a valid upper bound)"
    failures = (RuntimeError, ValueError, ArithmeticError, MemoryError, AssertionError)

    def failed(exc: BaseException) -> AccountingError:
        return AccountingError(
            f"PRV accountant failed for {where} ({type(exc).__name__}: {exc}). This happens "
            f"when epsilon is in the hundreds (effective multiplier below ~0.03) or delta is "
            f"tiny; {hint}"
        )

    delta_error = delta / 1000.0
    try:
        points = _prv_grid_points(z, q, steps, delta)
    except failures as exc:
        raise failed(exc) from exc
    if not math.isfinite(points) or points > MAX_PRV_GRID_POINTS:
        raise AccountingError(
            f"PRV accountant would need a grid of {points:.3g} points (limit "
            f"{MAX_PRV_GRID_POINTS:.3g}) for {where}; {hint}"
        )
    mechanism = PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=z)
    try:
        with np.errstate(all="ignore"):
            acc = PRVAccountant(
                prvs=[mechanism],
                max_self_compositions=[steps],
                eps_error=PRV_EPS_ERROR,
                delta_error=delta_error,
            )
            _, _, eps_upper = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    except failures as exc:
        raise failed(exc) from exc
    # The upper bound: a guarantee, not just the estimate.
    return float(eps_upper)


def _prv_epsilon(z: float, q: float, releases: int, delta: float) -> float:
    where = f"noise_multiplier={z}, sample_rate={q}, releases={releases}, delta={delta}"
    mz, steps = _prv_mechanism(z, q, releases)
    eps = prv_upper_epsilon(mz, q, steps, delta, where=where)
    if not math.isfinite(eps):
        raise AccountingError(
            f"PRV accountant returned {eps} for {where} (numerical overflow); "
            "use accountant='rdp' (a valid upper bound)"
        )
    return eps


@lru_cache(maxsize=8192)
def _epsilon_cached(z: float, q: float, releases: int, delta: float, accountant: str) -> float:
    if accountant == "rdp":
        eps = rdp_epsilon(z, q, releases, delta)
    else:
        eps = _prv_epsilon(z, q, releases, delta)
    # For very large z the RDP conversion dips below 0 ((0, delta)-DP holds); 0 is the floor
    # (dp-accounting applies it already).
    return max(eps, 0.0)


def epsilon_after(
    *,
    noise_multiplier: float,
    releases: int,
    delta: float,
    accountant: AccountantName = "rdp",
    sample_rate: float = 1.0,
) -> float:
    """Epsilon at ``delta`` after ``releases`` Gaussian releases with multiplier z.

    ``releases == 0`` gives 0.0; ``noise_multiplier == 0`` (and releases > 0) gives inf.
    Raises :class:`AccountingError` if the PRV accountant cannot evaluate the parameters.
    Results are cached, so a budget can ask again for free.
    """
    z = check_noise_multiplier(noise_multiplier)
    r = check_releases(releases)
    d = check_delta(delta)
    acc = check_accountant(accountant)
    q = check_sample_rate(sample_rate)
    if r == 0:
        return 0.0
    if z == 0.0:
        return math.inf
    return _epsilon_cached(z, q, r, d, acc)


def gaussian_dp_mu(*, noise_multiplier: float, releases: int) -> float:
    """``sqrt(releases) / z``: the exact mu-GDP of R Gaussian releases at sample rate 1.

    The whole (epsilon, delta) curve follows from it (Dong, Roth & Su 2019); a membership
    attacker's advantage (TPR - FPR) is at most ``2 * Phi(mu / 2) - 1``.
    """
    z = check_noise_multiplier(noise_multiplier)
    r = check_releases(releases)
    if r == 0:
        return 0.0
    return math.inf if z == 0.0 else math.sqrt(r) / z


def composed_noise_multiplier(inverse_square_sum: float) -> float:
    """The multiplier of the one Gaussian release (sample rate 1) that Gaussian releases whose
    1 / z_i^2 add up to ``inverse_square_sum > 0`` compose to: ``1 / sqrt(sum)``."""
    return 1.0 / math.sqrt(inverse_square_sum)


def composed_epsilon(
    *, inverse_square_sum: float, delta: float, accountant: AccountantName
) -> float:
    """Epsilon of Gaussian releases (sample rate 1) whose 1 / z_i^2 add up to
    ``inverse_square_sum`` (0.0 for none)."""
    if inverse_square_sum <= 0.0:
        return 0.0
    return epsilon_after(
        noise_multiplier=composed_noise_multiplier(inverse_square_sum),
        releases=1,
        delta=delta,
        accountant=accountant,
    )


def max_releases(
    *,
    noise_multiplier: float,
    delta: float,
    epsilon: float,
    accountant: AccountantName = "rdp",
    sample_rate: float = 1.0,
    limit: int = 10**7,
) -> int:
    """The largest number of releases whose epsilon is at most ``epsilon`` (capped at
    ``limit``; ``limit`` means "at least that many")."""
    z = check_noise_multiplier(noise_multiplier)
    eps_target = check_epsilon(epsilon)
    limit = check_releases(limit, minimum=1)

    def ok(r: int) -> bool:
        return (
            epsilon_after(
                noise_multiplier=z,
                releases=r,
                delta=delta,
                accountant=accountant,
                sample_rate=sample_rate,
            )
            <= eps_target
        )

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):  # epsilon grows with the number of releases
        lo, hi = hi, hi * 2
    if hi > limit:
        if ok(limit):
            return limit
        hi = limit
    while hi - lo > 1:  # invariant: ok(lo) and not ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
