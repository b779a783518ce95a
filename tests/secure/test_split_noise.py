"""Tests for secure/split_noise.py: the split of the noise over M >= 3 parties and its epsilon
against each adversary (docs/privacy.md, section 11)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from secure.accounting import AccountingError, epsilon_after
from secure.accounting.analysis import RDP_ORDERS
from secure.aggregation import SHARE_GRID, to_grid
from secure.discrete_gaussian import DiscreteGaussianNoise
from secure.split_noise import (
    AdversaryEpsilons,
    SplitNoise,
    SplitNoiseError,
    adversary_epsilons,
    adversary_lines,
    check_split_clients,
    distributed_rdp,
    grid_sensitivity,
    privatize_on_grid,
    split_noise_std,
    sum_tau,
)

DELTA = 1e-6
#: the private arrangement's release: C = 1, c = 1, h = 1, width 16 (32 coordinates per node)
SENSITIVITY = grid_sensitivity(sensitivity=2.0 * math.sqrt(2.0), coordinates=32)


def split(z: float = 8.97, clients: int = 3, dimension: int = 16_000) -> SplitNoise:
    return SplitNoise(
        noise_multiplier=z, sensitivity=SENSITIVITY, clients=clients, dimension=dimension
    )


# -- the split ------------------------------------------------------------------------------


@pytest.mark.parametrize("clients", [3, 4, 7])
def test_each_party_adds_one_m_minus_first_of_the_variance(clients: int) -> None:
    std = split_noise_std(noise_multiplier=2.0, sensitivity=1.5, clients=clients)
    assert std == pytest.approx(3.0 / math.sqrt(clients - 1), rel=1e-15)
    # the sum less one party's share: M - 1 shares of std^2 each, (z Delta)^2 in all
    assert (clients - 1) * std**2 == pytest.approx(9.0, rel=1e-14)


def test_sum_less_one_share_carries_the_full_variance_when_drawn() -> None:
    """Four parties draw their discrete Gaussian shares; what one peer is left with after
    subtracting its own has variance (z Delta)^2, the victim's share alone (z Delta)^2 / 3."""
    noise = split(z=1.3, clients=4)
    shares = [DiscreteGaussianNoise(seed=s).sample(2**17, std=noise.party_std) for s in range(4)]
    sigma2 = (1.3 * SENSITIVITY) ** 2
    n = shares[0].size
    left = sum(shares[1:])
    assert np.var(left) == pytest.approx(sigma2, rel=5 * math.sqrt(2 / n))
    assert np.var(shares[0]) == pytest.approx(sigma2 / 3, rel=5 * math.sqrt(2 / n))


@pytest.mark.parametrize("clients", [1, 2])
def test_fewer_than_three_parties_are_refused(clients: int) -> None:
    with pytest.raises(SplitNoiseError, match=f"at least 3 parties, got {clients}"):
        split_noise_std(noise_multiplier=1.0, sensitivity=1.0, clients=clients)
    with pytest.raises(SplitNoiseError, match=r"one other party's whole share .*\(unshared"):
        check_split_clients(clients)
    with pytest.raises(SplitNoiseError, match="at least 3"):
        split(clients=clients)
    with pytest.raises(ValueError, match="clients must be >= 1"):
        check_split_clients(0)


def test_grid_sensitivity_bounds_the_rounded_difference() -> None:
    rng = np.random.default_rng(0)
    k, delta_ = 32, 0.01
    bound = grid_sensitivity(sensitivity=delta_, coordinates=k)
    assert bound == delta_ + SHARE_GRID * math.sqrt(k)
    worst = 0.0
    for _ in range(2000):
        a = rng.normal(size=k)
        step = rng.normal(size=k)
        b = a + step * delta_ / np.linalg.norm(step)
        worst = max(worst, float(np.linalg.norm(to_grid(a) - to_grid(b))))
    assert delta_ < worst <= bound


def test_release_on_the_grid_rounds_the_signal_before_the_noise() -> None:
    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(50, 16))
    clean = privatize_on_grid(matrix, clip=1.0, noise_std=0.0, noise=DiscreteGaussianNoise(seed=0))
    assert np.array_equal(clean, to_grid(matrix / np.linalg.norm(matrix, axis=1, keepdims=True)))
    noisy = privatize_on_grid(matrix, clip=1.0, noise_std=3.0, noise=DiscreteGaussianNoise(seed=0))
    units = noisy / SHARE_GRID
    assert np.array_equal(units, np.round(units))
    noise = DiscreteGaussianNoise(seed=0).sample((50, 16), std=3.0)
    assert np.array_equal(noisy - clean, noise)


# -- the accounting -------------------------------------------------------------------------


def test_multipliers_per_adversary() -> None:
    noise = split(z=6.0, clients=5)
    assert noise.noise_multiplier_against(1) == 6.0
    assert noise.noise_multiplier_against(2) == pytest.approx(6.0 * math.sqrt(3 / 4))
    assert noise.noise_multiplier_against(4) == pytest.approx(6.0 / 2.0)
    assert noise.noise_multiplier_against(1, group=True) == pytest.approx(6.0 / 4)
    assert noise.noise_multiplier_against(2, group=True) == pytest.approx(
        6.0 * math.sqrt(3 / 4) / 3
    )
    with pytest.raises(ValueError, match="at most clients - 1 = 4"):
        noise.noise_multiplier_against(5)


@pytest.mark.parametrize("clients", [3, 5, 10])
def test_epsilons_equal_the_gaussian_accountant_on_the_grid(clients: int) -> None:
    """On the 2^-12 grid tau underflows to 0, so the bound is the Gaussian mechanism's RDP:
    the peer and the service with a peer get epsilon_after(z), M - 1 colluding peers
    epsilon_after(z / sqrt(M - 1))."""
    z, releases = 8.97, 50
    eps = adversary_epsilons(split(z=z, clients=clients), releases=releases, delta=DELTA)
    peer = epsilon_after(noise_multiplier=z, releases=releases, delta=DELTA)
    colluding = epsilon_after(
        noise_multiplier=z / math.sqrt(clients - 1), releases=releases, delta=DELTA
    )
    assert eps.epsilon("peer") == pytest.approx(peer, rel=1e-9)
    assert eps.epsilon("service_peer") == pytest.approx(peer, rel=1e-9)
    assert eps.epsilon("colluding") == pytest.approx(colluding, rel=1e-9)
    group = epsilon_after(noise_multiplier=z / (clients - 1), releases=releases, delta=DELTA)
    assert eps.epsilon("group") == pytest.approx(group, rel=1e-9)
    assert peer == pytest.approx(4.0, abs=0.01)  # docs/privacy.md, section 4.1


def test_epsilons_move_the_right_way() -> None:
    base = adversary_epsilons(split(z=4.0, clients=4), releases=20, delta=DELTA)
    more_noise = adversary_epsilons(split(z=5.0, clients=4), releases=20, delta=DELTA)
    more_releases = adversary_epsilons(split(z=4.0, clients=4), releases=40, delta=DELTA)
    more_parties = adversary_epsilons(split(z=4.0, clients=8), releases=20, delta=DELTA)
    for key in ("peer", "service_peer", "colluding", "group"):
        assert more_noise.epsilon(key) < base.epsilon(key) < more_releases.epsilon(key)
    assert base.epsilon("peer") < base.epsilon("colluding")
    assert base.epsilon("peer") < base.epsilon("group") < more_parties.epsilon("group")
    # a peer's protection does not depend on M; M - 1 colluding peers leave less noise as M grows
    assert more_parties.epsilon("peer") == pytest.approx(base.epsilon("peer"), rel=1e-12)
    assert more_parties.epsilon("colluding") > base.epsilon("colluding")
    noise = split(z=4.0, clients=6)
    by_coalition = [noise.epsilon(colluding=j, releases=20, delta=DELTA) for j in range(1, 6)]
    assert by_coalition == sorted(by_coalition) and len(set(by_coalition)) == 5


def test_a_sum_of_coarse_discrete_gaussians_costs_more_than_a_gaussian() -> None:
    """Shares of a few grid steps: Kairouz et al.'s tau is positive and raises epsilon, the
    more the larger the release; one share alone (M - 1 colluding) has tau = 0."""
    coarse = dict(noise_multiplier=1.0, sensitivity=2.0 * SHARE_GRID, clients=5)
    party_sigma = SplitNoise(**coarse, dimension=1).party_std / SHARE_GRID
    assert party_sigma == pytest.approx(1.0)
    assert sum_tau(party_sigma=party_sigma, shares=1) == 0.0
    tau = sum_tau(party_sigma=party_sigma, shares=4)
    expected = 10 * sum(math.exp(-2 * math.pi**2 * k / (k + 1)) for k in (1, 2, 3))
    assert tau == pytest.approx(expected)
    gaussian = epsilon_after(noise_multiplier=1.0, releases=10, delta=DELTA)
    small, large = (
        SplitNoise(**coarse, dimension=d).epsilon(colluding=1, releases=10, delta=DELTA)
        for d in (10, 10_000)
    )
    assert gaussian < small < large
    alone = SplitNoise(**coarse, dimension=10_000).epsilon(colluding=4, releases=10, delta=DELTA)
    assert alone == pytest.approx(
        epsilon_after(noise_multiplier=0.5, releases=10, delta=DELTA), rel=1e-9
    )


def test_distributed_rdp_is_the_smaller_of_the_two_bounds() -> None:
    alpha = np.asarray(RDP_ORDERS)
    assert np.allclose(distributed_rdp(alpha, l2_scale=0.5, tau=0.0, dimension=7), alpha / 8)
    rdp = distributed_rdp(alpha, l2_scale=0.5, tau=1e-3, dimension=100)
    first, second = alpha / 8 + 0.1, alpha * (0.5 + 1e-2) ** 2 / 2
    assert np.array_equal(rdp, np.minimum(first, second))
    assert (rdp == first).any() and (rdp == second).any()


def test_refusals_and_edges() -> None:
    noise = split()
    with pytest.raises(AccountingError, match="use accountant 'rdp'"):
        adversary_epsilons(noise, releases=5, delta=DELTA, accountant="prv")
    with pytest.raises(ValueError, match="accountant"):
        noise.epsilon(colluding=1, releases=5, delta=DELTA, accountant="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta"):
        noise.epsilon(colluding=1, releases=5, delta=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        split(z=0.0)
    assert noise.epsilon(colluding=1, releases=0, delta=DELTA) == 0.0


# -- the plain data and its lines -------------------------------------------------------------


def test_adversary_epsilons_round_trip_and_lines() -> None:
    eps = adversary_epsilons(split(z=8.97, clients=3), releases=50, delta=DELTA)
    data = eps.to_dict()
    keys = ["peer", "service_peer", "colluding", "group"]
    assert [a["key"] for a in data["adversaries"]] == keys
    assert AdversaryEpsilons.from_dict(data) == eps
    with pytest.raises(KeyError):
        eps.epsilon("service")
    lines = adversary_lines(eps)
    assert lines[0] == "split noise over 3 parties, 50 releases, delta 1e-06 (rdp):"
    assert lines[1] == "  one curious peer: noise multiplier 8.97, epsilon 3.997"
    assert lines[2] == "  the service with one colluding peer: noise multiplier 8.97, epsilon 3.997"
    assert lines[3] == "  all 2 other peers colluding: noise multiplier 6.343, epsilon 5.907"
    assert lines[4].startswith("  one node's features at all 3 parties, against one curious")
