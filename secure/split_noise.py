"""Split (distributed) discrete Gaussian noise under pairwise masks, and its epsilon against each
adversary (docs/privacy.md, section 11). Pure functions and plain data; nothing here is wired
into a session yet.

With M >= 3 parties whose shares nobody reads one by one (pairwise masks: only the sum of all
live shares decodes), each party adds a discrete Gaussian of variance sigma^2 / (M - 1),
sigma = z * Delta, on the share grid g. A coalition of j peers (with or without the service:
the masks show it nothing more than the sum) subtracts its own j shares from the sum; the victim's
row then sits in the sum of the other n = M - j shares, whose noise is a sum of n discrete
Gaussians of variance sigma^2 / (M - 1) each:

- one curious peer, and the service with one colluding peer: j = 1, n = M - 1, variance sigma^2,
  noise multiplier z;
- M - 1 colluding peers: j = M - 1, n = 1, only the victim's own share: z / sqrt(M - 1).

In general the multiplier faced is z_j = z sqrt((M - j) / (M - 1)).

A sum of discrete Gaussians is not a discrete Gaussian. Kairouz, Liu & Steinke (ICML 2021,
"The distributed discrete Gaussian mechanism", Proposition 14 and Theorem 1) bound its Renyi
divergence at every order alpha, for an integer query of L2 sensitivity Delta_Z (grid units) in
dimension d, n shares of sigma_Z^2 each (grid units):

    D_alpha <= min(alpha s^2 / 2 + tau d,  alpha (s + tau sqrt(d))^2 / 2),
    s = Delta_Z / (sqrt(n) sigma_Z) = 1 / z_j,
    tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_Z^2 k / (k + 1)).

R releases compose by adding these; dp-accounting's RDP-to-(epsilon, delta) conversion (the one
``secure.accounting.epsilon_after`` uses, on the same orders) gives epsilon. With tau = 0 (one
share, or sigma_Z large: on the 2^-12 grid sigma_Z is 10^4 or more and tau underflows to 0) the
bound is exactly the Gaussian mechanism's RDP, so the epsilon equals ``epsilon_after`` for z_j.
The PRV accountant is refused: its privacy loss distribution is the continuous Gaussian's, which
no theorem here shows to dominate a sum of discrete Gaussians.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from secure.accounting.analysis import (
    RDP_ORDERS,
    AccountantName,
    AccountingError,
    check_accountant,
    check_delta,
    check_releases,
)
from secure.aggregation import SHARE_GRID, to_grid
from secure.dp import check_int, check_non_negative, check_positive, clip_rows
from secure.noise import NoiseSource

#: Split noise needs this many parties: with two, the sum less one's own share is the other's.
MIN_SPLIT_CLIENTS = 3


class SplitNoiseError(ValueError):
    """Split noise that cannot protect anyone (fewer than 3 parties) or cannot be accounted."""


def check_split_clients(clients: int) -> int:
    """``clients`` if split noise can work with that many parties, else :class:`SplitNoiseError`
    saying why."""
    m = check_int("clients", clients, minimum=1)
    if m < MIN_SPLIT_CLIENTS:
        raise SplitNoiseError(
            f"split noise needs at least {MIN_SPLIT_CLIENTS} parties, got {m}: with fewer, the"
            " sum less a party's own share is at most one other party's whole share (masks"
            " hide nothing), so each party must add the full noise itself (unshared noise, the"
            " default)"
        )
    return m


def split_noise_std(*, noise_multiplier: float, sensitivity: float, clients: int) -> float:
    """The std each of M >= 3 parties adds: ``z * Delta / sqrt(M - 1)``, so that the sum less
    any one party's share carries variance (M - 1) (z Delta)^2 / (M - 1) = (z Delta)^2.
    Pass the sensitivity on the grid (:func:`grid_sensitivity`) when the signal is rounded to
    the grid before the noise."""
    z = check_non_negative("noise_multiplier", noise_multiplier)
    delta_ = check_positive("sensitivity", sensitivity)
    m = check_split_clients(clients)
    return z * delta_ / math.sqrt(m - 1)


def grid_sensitivity(*, sensitivity: float, coordinates: int, grid: float = SHARE_GRID) -> float:
    """The L2 sensitivity after rounding every coordinate to the grid: ``Delta + g sqrt(k)``.

    Rounding to the nearest multiple of g moves each coordinate by at most g/2, so two rounded
    releases differ by at most ``Delta + g sqrt(k)`` in L2 norm, k being the number of
    coordinates one node can change (rows it reaches times the release width; 32 in the private
    arrangement). The discrete Gaussian's guarantee is about the integer query, so this, not
    Delta, is its sensitivity (in grid units divide by g)."""
    delta_ = check_positive("sensitivity", sensitivity)
    k = check_int("coordinates", coordinates, minimum=1)
    return delta_ + check_positive("grid", grid) * math.sqrt(k)


def privatize_on_grid(
    matrix: np.ndarray, *, clip: float, noise_std: float, noise: NoiseSource
) -> np.ndarray:
    """A party's release under split noise: rows clipped to ``clip``, rounded to the grid, then
    the noise (a ``secure.discrete_gaussian.DiscreteGaussianNoise``, itself on the grid) added,
    so the release is exactly on the grid and the guarantee is the integer query's
    (:func:`grid_sensitivity`). ``noise_std`` is :func:`split_noise_std`."""
    noise_std = check_non_negative("noise_std", noise_std)
    signal = to_grid(clip_rows(matrix, clip=clip))
    return signal + noise.sample(signal.shape, std=noise_std)


def sum_tau(*, party_sigma: float, shares: int) -> float:
    """Kairouz et al.'s tau for a sum of ``shares`` discrete Gaussians of sigma ``party_sigma``
    each (grid units): ``10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``; 0 for one share."""
    sigma2 = check_non_negative("party_sigma", party_sigma) ** 2
    n = check_int("shares", shares, minimum=1)
    return 10.0 * sum(math.exp(-2.0 * math.pi**2 * sigma2 * k / (k + 1)) for k in range(1, n))


def distributed_rdp(
    orders: np.ndarray, *, l2_scale: float, tau: float, dimension: int
) -> np.ndarray:
    """Kairouz et al.'s bound on the RDP of one release at each order:
    ``min(alpha s^2 / 2 + tau d, alpha (s + tau sqrt(d))^2 / 2)``, s = ``l2_scale``."""
    alpha = np.asarray(orders, dtype=np.float64)
    d = check_int("dimension", dimension, minimum=1)
    first = alpha * l2_scale**2 / 2.0 + tau * d
    second = alpha * (l2_scale + tau * math.sqrt(d)) ** 2 / 2.0
    return np.minimum(first, second)


@dataclass(frozen=True, kw_only=True)
class SplitNoise:
    """One release's split noise: M parties each add N_Z of sigma z Delta / sqrt(M - 1) on the
    grid. ``sensitivity`` is Delta on the grid (:func:`grid_sensitivity`), ``dimension`` the
    number of coordinates of one release (rows x width), for tau's term."""

    noise_multiplier: float
    sensitivity: float
    clients: int
    dimension: int
    grid: float = SHARE_GRID

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        check_positive("sensitivity", self.sensitivity)
        check_split_clients(self.clients)
        check_int("dimension", self.dimension, minimum=1)
        check_positive("grid", self.grid)

    @property
    def party_std(self) -> float:
        """The std each party adds, in value units."""
        z, delta_, m = self.noise_multiplier, self.sensitivity, self.clients
        return split_noise_std(noise_multiplier=z, sensitivity=delta_, clients=m)

    def noise_multiplier_against(self, colluding: int, *, group: bool = False) -> float:
        """z_j = z sqrt((M - j) / (M - 1)): the multiplier ``colluding`` = j peers face once
        they subtract their own shares (the service with them sees nothing more).

        ``group``: about a node whose rows sit at every party, so its rows in all M - j shares
        left move the sum together (sensitivity (M - j) Delta): z_j / (M - j), z / (M - 1) for
        one curious peer."""
        j = check_int("colluding", colluding, minimum=1)
        if j > self.clients - 1:
            raise ValueError(f"at most clients - 1 = {self.clients - 1} peers collude, got {j}")
        left = self.clients - j
        faced = self.noise_multiplier * math.sqrt(left / (self.clients - 1))
        return faced / left if group else faced

    def rdp(self, orders: np.ndarray, *, colluding: int, group: bool = False) -> np.ndarray:
        """The RDP of one release against ``colluding`` peers (Kairouz et al.'s bound)."""
        shares = self.clients - colluding
        tau = sum_tau(party_sigma=self.party_std / self.grid, shares=shares)
        return distributed_rdp(
            orders,
            l2_scale=1.0 / self.noise_multiplier_against(colluding, group=group),
            tau=tau,
            dimension=self.dimension,
        )

    def epsilon(
        self,
        *,
        colluding: int,
        releases: int,
        delta: float,
        accountant: AccountantName = "rdp",
        group: bool = False,
    ) -> float:
        """Epsilon at ``delta`` after ``releases`` such releases, against ``colluding`` peers
        (``group``: see :meth:`noise_multiplier_against`): R times :meth:`rdp`, converted by
        dp-accounting on ``RDP_ORDERS``."""
        if check_accountant(accountant) != "rdp":
            raise AccountingError(
                "split discrete Gaussian noise is accounted by its Renyi bound (Kairouz et al."
                " 2021); the PRV accountant models continuous Gaussian noise: use accountant"
                " 'rdp'"
            )
        r = check_releases(releases)
        d = check_delta(delta)
        if r == 0:
            return 0.0
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        rdp = r * self.rdp(np.asarray(RDP_ORDERS), colluding=colluding, group=group)
        return max(float(compute_epsilon(RDP_ORDERS, rdp, d)[0]), 0.0)


@dataclass(frozen=True)
class AdversaryEpsilon:
    """What one adversary faces: its noise multiplier and epsilon over the run."""

    key: str  # stable name: "peer", "service_peer", "colluding", "group"
    adversary: str
    colluding_peers: int
    noise_multiplier: float
    epsilon: float
    group: bool = False  # about a node whose rows sit at every party


@dataclass(frozen=True, kw_only=True)
class AdversaryEpsilons:
    """Epsilon against each adversary of a run with split noise: plain data that a ledger row,
    a run summary or a compliance report can carry (:meth:`to_dict` / :meth:`from_dict`)."""

    clients: int
    releases: int
    delta: float
    accountant: str
    adversaries: tuple[AdversaryEpsilon, ...]

    def epsilon(self, key: str) -> float:
        """The epsilon against the adversary ``key``; KeyError for an unknown key."""
        for a in self.adversaries:
            if a.key == key:
                return a.epsilon
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"adversaries": [asdict(a) for a in self.adversaries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdversaryEpsilons:
        fields = dict(data)
        fields["adversaries"] = tuple(AdversaryEpsilon(**a) for a in data["adversaries"])
        return cls(**fields)


def adversary_epsilons(
    noise: SplitNoise,
    *,
    releases: int,
    delta: float,
    accountant: AccountantName = "rdp",
    masked: bool = True,
) -> AdversaryEpsilons:
    """Epsilon after ``releases`` releases of ``noise`` against one curious peer (z), the
    service with one colluding peer (z: the masks show it only the sum; without ``masked``
    shares it decrypts the victim's share, as M - 1 colluding peers do), M - 1 colluding peers
    (z / sqrt(M - 1): only the victim's own share is left) and, the line ``secure.privacy``
    reports as "group", one curious peer about a node whose rows sit at all M parties
    (z / (M - 1))."""
    m = noise.clients
    cast = (
        ("peer", "one curious peer", 1, False),
        ("service_peer", "the service with one colluding peer", 1 if masked else m - 1, False),
        ("colluding", f"all {m - 1} other peers colluding", m - 1, False),
        ("group", f"one node's features at all {m} parties, against one curious peer", 1, True),
    )
    return AdversaryEpsilons(
        clients=m,
        releases=releases,
        delta=delta,
        accountant=accountant,
        adversaries=tuple(
            AdversaryEpsilon(
                key=key,
                adversary=name,
                colluding_peers=j,
                noise_multiplier=noise.noise_multiplier_against(j, group=group),
                epsilon=noise.epsilon(
                    colluding=j,
                    releases=releases,
                    delta=delta,
                    accountant=accountant,
                    group=group,
                ),
                group=group,
            )
            for key, name, j, group in cast
        ),
    )


def adversary_lines(epsilons: AdversaryEpsilons) -> list[str]:
    """One line per adversary for a report: who, the noise multiplier it faces, its epsilon."""
    head = (
        f"split noise over {epsilons.clients} parties, {epsilons.releases} releases,"
        f" delta {epsilons.delta:g} ({epsilons.accountant}):"
    )
    return [head] + [
        f"  {a.adversary}: noise multiplier {a.noise_multiplier:.4g}, epsilon {a.epsilon:.4g}"
        for a in epsilons.adversaries
    ]
