"""Calibration (torch-free): the smallest noise multiplier z that keeps a number of Gaussian
releases within an epsilon target, by the bisection of Opacus's ``get_noise_multiplier`` on the
backends of :mod:`secure.accounting.analysis`. See docs/privacy.md section 4.2.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from secure.accounting.analysis import (
    AccountantName,
    AccountingError,
    check_accountant,
    check_delta,
    check_epsilon,
    check_releases,
    check_sample_rate,
    epsilon_after,
    prv_upper_epsilon,
    rdp_epsilon,
)
from secure.dp import effective_noise_multiplier

#: Calibration gives up above this noise multiplier (Opacus's ``MAX_SIGMA``).
_MAX_CALIBRATED_NOISE_MULTIPLIER = 1e6


def _bisect_noise_multiplier(
    epsilon_of: Callable[[float], float], target: float, tolerance: float
) -> float:
    """Opacus's ``get_noise_multiplier`` search, on any decreasing ``epsilon_of(z)``.

    Double z from 10 until ``epsilon_of(z) <= target`` (giving up above 1e6), then bisect
    between 0 and that z until the upper end's epsilon is within ``tolerance`` below the target;
    return the upper end (so its epsilon never exceeds the target).
    """
    z_low, z_high = 0.0, 10.0
    eps_high = math.inf
    while eps_high > target:
        z_high *= 2.0
        eps_high = epsilon_of(z_high)
        if z_high > _MAX_CALIBRATED_NOISE_MULTIPLIER:
            raise AccountingError("The privacy budget is too low.")
    while target - eps_high > tolerance:
        z = (z_low + z_high) / 2.0
        eps = epsilon_of(z)
        if eps < target:
            z_high, eps_high = z, eps
        else:
            z_low = z
    return z_high


def _nudge_up(z: float, spent: Callable[[float], float], target: float) -> float:
    """The first of z, z (1 + 1e-9), z (1 + 1e-9)^2, ... whose ``spent(z)`` is at most
    ``target``: rounding (z * sqrt(R) / sqrt(R) != z) can land a hair above the target."""
    for _ in range(64):
        if spent(z) <= target:
            return z
        z *= 1.0 + 1e-9
    raise AccountingError(  # pragma: no cover - defensive
        f"calibrated noise multiplier {z} does not meet epsilon={target}"
    )


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    releases: int,
    accountant: AccountantName = "rdp",
    sample_rate: float = 1.0,
) -> float:
    """The smallest noise multiplier (to the search tolerance) whose epsilon after ``releases``
    releases is at most ``epsilon`` at ``delta``, by the bisection of Opacus's
    ``get_noise_multiplier`` (:func:`_bisect_noise_multiplier`).

    At sample rate 1 the search runs on the single equivalent release (steps=1) and the result
    is scaled by sqrt(releases), which is exact. Tolerance: RDP within min(0.01, 0.001 * eps)
    below the target; PRV within 0.01 (Opacus's default). The returned z is checked with
    :func:`epsilon_after` and never exceeds the target.
    """
    eps_target = check_epsilon(epsilon)
    d = check_delta(delta)
    r = check_releases(releases, minimum=1)
    acc = check_accountant(accountant)
    q = check_sample_rate(sample_rate)

    steps = 1 if q == 1.0 else r

    def epsilon_of(z: float) -> float:  # raw: PRV may give inf, the search treats it as "more"
        if acc == "rdp":
            return rdp_epsilon(z, q, steps, d)
        where = f"noise_multiplier={z}, sample_rate={q}, steps={steps}, delta={d}"
        return prv_upper_epsilon(z, q, steps, d, where=where)

    tolerance = min(0.01, 1e-3 * eps_target) if acc == "rdp" else 0.01
    try:
        with np.errstate(all="ignore"):
            z = _bisect_noise_multiplier(epsilon_of, eps_target, tolerance)
    except (RuntimeError, ValueError, ArithmeticError, MemoryError) as exc:
        raise AccountingError(
            f"cannot calibrate a noise multiplier for epsilon={eps_target}, delta={d}, "
            f"releases={r}, accountant={acc!r}, sample_rate={q}: {exc}"
        ) from exc
    if q == 1.0:
        z *= math.sqrt(r)
    return _nudge_up(
        z,
        lambda z: epsilon_after(
            noise_multiplier=z, releases=r, delta=d, accountant=acc, sample_rate=q
        ),
        eps_target,
    )


def calibrate_session_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    releases: int,
    clients: int,
    shared: bool,
    accountant: AccountantName = "rdp",
) -> float:
    """A session's z (noise std of the sum / sensitivity) such that the multiplier the ledger
    accounts, ``secure.dp.effective_noise_multiplier`` (z itself, or z sqrt((M-1)/M) with shared
    noise), spends at most ``epsilon`` over ``releases`` releases."""

    def ledger_z(z: float) -> float:
        return effective_noise_multiplier(noise_multiplier=z, clients=clients, shared=shared)

    z = calibrate_noise_multiplier(
        epsilon=epsilon, delta=delta, releases=releases, accountant=accountant
    ) / ledger_z(1.0)
    # rounding in the division may land a hair above the target
    return _nudge_up(
        z,
        lambda z: epsilon_after(
            noise_multiplier=ledger_z(z), releases=releases, delta=delta, accountant=accountant
        ),
        epsilon,
    )
