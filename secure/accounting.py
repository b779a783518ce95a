"""Privacy accounting for a sequence of identical Gaussian releases (torch-free).

Every joint inference (training round or evaluation pass) is one release of the Gaussian
mechanism with noise multiplier z (noise std / L2 sensitivity). The functions here turn
(z, number of releases, delta) into epsilon and back; :class:`PrivacyLedger` is the stateful,
serialisable record the service keeps per session. See docs/privacy.md.

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
for R in the thousands).

Both backends are numpy/scipy only: importing this module never loads torch, so the aggregation
service can account privacy without it. They are imported on first use (scipy.stats and
scipy.signal cost about a second and 50 MB), so a service with no private session never loads
them. At sample rate 1 they give the numbers of the Opacus 1.6
accountants this module used before (RDP: same RDP, conversion and orders, to 1e-14; PRV: the code
Opacus ported, to 1e-10). With ``sample_rate < 1`` the RDP epsilon is a little larger (under 0.5%
measured): dp-accounting bounds the subsampled RDP at fractional orders from above where Opacus
sums the series exactly.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Literal, cast, get_args

import numpy as np

from secure.dp import effective_noise_multiplier

AccountantName = Literal["rdp", "prv"]

__all__ = [
    "ACCOUNTANTS",
    "MAX_PRV_GRID_POINTS",
    "PRV_EPS_ERROR",
    "RDP_ORDERS",
    "AccountantName",
    "AccountingError",
    "BudgetExhausted",
    "PrivacyLedger",
    "calibrate_noise_multiplier",
    "calibrate_session_noise_multiplier",
    "epsilon_after",
    "gaussian_dp_mu",
    "max_releases",
]

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
#: Calibration gives up above this noise multiplier (Opacus's ``MAX_SIGMA``).
_MAX_CALIBRATED_NOISE_MULTIPLIER = 1e6

ACCOUNTANTS: tuple[str, ...] = get_args(AccountantName)


class AccountingError(ValueError):
    """The accountant could not produce a trustworthy epsilon for these parameters."""


class BudgetExhausted(RuntimeError):
    """One more release would take epsilon above the session's target."""


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _check_noise_multiplier(z: float) -> float:
    z = float(z)
    if not math.isfinite(z) or z < 0.0:
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {z!r}")
    return z


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def _check_sample_rate(q: float) -> float:
    q = float(q)
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {q!r}")
    return q


def _check_releases(releases: int, *, minimum: int = 0) -> int:
    if isinstance(releases, bool) or not isinstance(releases, int | np.integer):
        raise TypeError(f"releases must be an int, got {type(releases).__name__}")
    if releases < minimum:
        raise ValueError(f"releases must be >= {minimum}, got {releases}")
    return int(releases)


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def _check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return epsilon


# --------------------------------------------------------------------------------------------
# epsilon
# --------------------------------------------------------------------------------------------


def _rdp_epsilon(z: float, q: float, releases: int, delta: float) -> float:
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


def _prv_upper_epsilon(z: float, q: float, steps: int, delta: float, *, where: str) -> float:
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
    eps = _prv_upper_epsilon(mz, q, steps, delta, where=where)
    if not math.isfinite(eps):
        raise AccountingError(
            f"PRV accountant returned {eps} for {where} (numerical overflow); "
            "use accountant='rdp' (a valid upper bound)"
        )
    return eps


@lru_cache(maxsize=8192)
def _epsilon_cached(z: float, q: float, releases: int, delta: float, accountant: str) -> float:
    if accountant == "rdp":
        eps = _rdp_epsilon(z, q, releases, delta)
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
    Results are cached, so a ledger can ask again for free.
    """
    z = _check_noise_multiplier(noise_multiplier)
    r = _check_releases(releases)
    d = _check_delta(delta)
    acc = _check_accountant(accountant)
    q = _check_sample_rate(sample_rate)
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
    z = _check_noise_multiplier(noise_multiplier)
    r = _check_releases(releases)
    if r == 0:
        return 0.0
    return math.inf if z == 0.0 else math.sqrt(r) / z


# --------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------


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
    eps_target = _check_epsilon(epsilon)
    d = _check_delta(delta)
    r = _check_releases(releases, minimum=1)
    acc = _check_accountant(accountant)
    q = _check_sample_rate(sample_rate)

    steps = 1 if q == 1.0 else r

    def epsilon_of(z: float) -> float:  # raw: PRV may give inf, the search treats it as "more"
        if acc == "rdp":
            return _rdp_epsilon(z, q, steps, d)
        where = f"noise_multiplier={z}, sample_rate={q}, steps={steps}, delta={d}"
        return _prv_upper_epsilon(z, q, steps, d, where=where)

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
    z = _check_noise_multiplier(noise_multiplier)
    eps_target = _check_epsilon(epsilon)
    limit = _check_releases(limit, minimum=1)

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


# --------------------------------------------------------------------------------------------
# ledger
# --------------------------------------------------------------------------------------------


class PrivacyLedger:
    """The privacy record of one session: (z, delta, accountant, sample rate) fixed, a count of
    releases, an optional epsilon target that :meth:`record_release` enforces.

    Store :meth:`to_dict` durably *after* :meth:`record_release` returns and *before* the
    release is served; a crash in between over-counts, which is the safe direction. Every
    epsilon evaluation is cached. Accounting failures (:class:`AccountingError`) propagate:
    callers must treat them as "refuse the release".

    When the noise is shared between clients, construct the ledger with
    ``secure.dp.effective_noise_multiplier(...)``, not with the per-sum multiplier.
    """

    SCHEMA_VERSION = 1
    _KEYS_REQUIRED = ("noise_multiplier", "delta", "accountant", "releases")
    _KEYS_OPTIONAL = ("epsilon_target", "sample_rate", "schema", "epsilon", "mechanism")

    def __init__(
        self,
        *,
        noise_multiplier: float,
        delta: float,
        accountant: AccountantName = "rdp",
        epsilon_target: float | None = None,
        sample_rate: float = 1.0,
        releases: int = 0,
    ) -> None:
        self._z = _check_noise_multiplier(noise_multiplier)
        self._delta = _check_delta(delta)
        self._accountant = cast(AccountantName, _check_accountant(accountant))
        self._target = (
            None if epsilon_target is None else _check_epsilon(epsilon_target, "epsilon_target")
        )
        self._q = _check_sample_rate(sample_rate)
        self._releases = _check_releases(releases)
        self._lock = threading.Lock()

    # -- read-only configuration -------------------------------------------------------------
    @property
    def noise_multiplier(self) -> float:
        return self._z

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def accountant(self) -> AccountantName:
        return self._accountant

    @property
    def epsilon_target(self) -> float | None:
        return self._target

    @property
    def sample_rate(self) -> float:
        return self._q

    @property
    def releases(self) -> int:
        """Releases recorded so far."""
        return self._releases

    # -- accounting --------------------------------------------------------------------------
    def epsilon_at(self, releases: int) -> float:
        """Epsilon after ``releases`` releases under this ledger's parameters."""
        return epsilon_after(
            noise_multiplier=self._z,
            releases=releases,
            delta=self._delta,
            accountant=self._accountant,
            sample_rate=self._q,
        )

    @property
    def epsilon(self) -> float:
        """Epsilon spent by the recorded releases (at this ledger's delta)."""
        return self.epsilon_at(self._releases)

    def would_exceed(self) -> bool:
        """True if one more release would take epsilon above the target (never without one)."""
        if self._target is None:
            return False
        return self.epsilon_at(self._releases + 1) > self._target

    def remaining_releases(self) -> int | None:
        """How many more releases fit in the target (None without a target)."""
        if self._target is None:
            return None
        total = max_releases(
            noise_multiplier=self._z,
            delta=self._delta,
            epsilon=self._target,
            accountant=self._accountant,
            sample_rate=self._q,
        )
        return max(0, total - self._releases)

    def record_release(self) -> float:
        """Count one release and return the new epsilon.

        Raises :class:`BudgetExhausted` (and records nothing) if the release would take epsilon
        above the target.
        """
        with self._lock:
            eps_next = self.epsilon_at(self._releases + 1)
            if self._target is not None and eps_next > self._target:
                raise BudgetExhausted(
                    f"privacy budget exhausted: release {self._releases + 1} would bring "
                    f"epsilon to {eps_next:.4g} > target {self._target:.4g} at "
                    f"delta={self._delta:g} (noise multiplier {self._z:.4g}, "
                    f"{self._accountant} accountant); {self._releases} releases so far spent "
                    f"epsilon {self.epsilon_at(self._releases):.4g}"
                )
            self._releases += 1
            return eps_next

    # -- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible record. ``epsilon`` is informational (None if infinite);
        :meth:`from_dict` recomputes it from the parameters."""
        eps = self.epsilon
        return {
            "schema": self.SCHEMA_VERSION,
            "mechanism": "gaussian",
            "noise_multiplier": self._z,
            "delta": self._delta,
            "accountant": self._accountant,
            "sample_rate": self._q,
            "epsilon_target": self._target,
            "releases": self._releases,
            "epsilon": eps if math.isfinite(eps) else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output (or from the bare parameters)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping, got {type(data).__name__}")
        missing = [k for k in cls._KEYS_REQUIRED if k not in data]
        if missing:
            raise ValueError(f"privacy ledger record is missing {missing}")
        unknown = sorted(set(data) - set(cls._KEYS_REQUIRED) - set(cls._KEYS_OPTIONAL))
        if unknown:
            raise ValueError(f"privacy ledger record has unknown keys {unknown}")
        schema = data.get("schema", cls.SCHEMA_VERSION)
        if schema != cls.SCHEMA_VERSION:
            raise ValueError(f"unsupported privacy ledger schema {schema!r}")
        if data.get("mechanism", "gaussian") != "gaussian":
            raise ValueError(f"unsupported mechanism {data['mechanism']!r}")
        for key in ("noise_multiplier", "delta", "sample_rate", "epsilon_target"):
            value = data.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise TypeError(f"{key} must be a number, got {type(value).__name__}")
        return cls(
            noise_multiplier=data["noise_multiplier"],
            delta=data["delta"],
            accountant=data["accountant"],
            epsilon_target=data.get("epsilon_target"),
            sample_rate=data.get("sample_rate", 1.0),
            releases=data["releases"],
        )

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(noise_multiplier={self._z!r}, delta={self._delta!r}, "
            f"accountant={self._accountant!r}, epsilon_target={self._target!r}, "
            f"sample_rate={self._q!r}, releases={self._releases!r})"
        )
