"""Tests for secure/accounting/ (analysis, calibration, budget) against independent computations
from first principles."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq, minimize_scalar
from scipy.special import log_ndtr, logsumexp, ndtr

from secure.accounting import (
    RDP_ORDERS,
    RDP_ORDERS_SUBSAMPLED,
    AccountingError,
    PrivacyBudget,
    ReleaseRefused,
    calibrate_noise_multiplier,
    decide_release,
    epsilon_after,
    gaussian_dp_mu,
    max_releases,
)

# ------------------------------------------------------------------------------------------
# independent references
# ------------------------------------------------------------------------------------------


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """The RDP -> (epsilon, delta) conversion of Balle et al. 2020 (Thm 21), minimised over the
    given orders, floored at 0."""
    eps = rdp + np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    return max(float(np.nanmin(eps)), 0.0)


def subsampled_gaussian_rdp(q: float, z: float, orders: np.ndarray) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian release (Mironov, Talwar & Zhang 2019) by direct
    numerical integration: log(A_alpha) / (alpha - 1) with
        A_alpha = E_{x ~ N(0, z^2)} [((1 - q) + q exp((2x - 1) / (2 z^2)))^alpha],
    a fine Riemann sum in log space (the integrand is smooth and decays like a Gaussian)."""
    out = np.empty(len(orders))
    for i, a in enumerate(orders):
        x = np.arange(-40.0 * z, a * z * z + 40.0 * z, z / 200.0)
        log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * z * z))
        log_pdf = -0.5 * (x / z) ** 2 - math.log(z * math.sqrt(2 * math.pi))
        log_a = logsumexp(log_pdf + a * log_ratio) + math.log(z / 200.0)
        out[i] = log_a / (a - 1)
    return out


def rdp_epsilon_reference(z: float, releases: int, delta: float) -> float:
    """RDP of the Gaussian mechanism, eps_RDP(alpha) = R * alpha / (2 z^2), converted with the
    conversion of Balle et al. 2020 (Thm 21; Canonne-Kamath-Steinke):
        eps = eps_RDP(alpha) + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)
    minimised over all real alpha > 1 (not over a grid)."""
    rho = releases / (2.0 * z * z)

    def eps(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return rho * a + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)

    res = minimize_scalar(eps, bounds=(-14.0, 16.0), method="bounded", options={"xatol": 1e-10})
    return float(res.fun)


def exact_gaussian_epsilon(z: float, releases: int, delta: float) -> float:
    """The exact (epsilon, delta) of R Gaussian releases with multiplier z at sample rate 1:
    one Gaussian release with s = z / sqrt(R), whose privacy profile is (Balle & Wang 2018)
        delta(eps) = Phi(-eps * s + 1 / (2 s)) - e^eps * Phi(-eps * s - 1 / (2 s))."""
    s = z / math.sqrt(releases)

    def excess(e: float) -> float:
        return (
            float(ndtr(-e * s + 1 / (2 * s))) - math.exp(e + float(log_ndtr(-e * s - 1 / (2 * s))))
        ) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return brentq(excess, 0.0, hi, xtol=1e-12)


def composed_gaussian_delta(z: float, releases: int, eps: float) -> float:
    """delta(eps) of R Gaussian releases composed through their privacy loss distribution: one
    release's privacy loss is N(1 / (2 z^2), 1 / z^2), R of them sum to N(R / (2 z^2), R / z^2),
    and delta(eps) = E[(1 - e^(eps - L))_+] (integrated numerically)."""
    mean, sd = releases / (2 * z * z), math.sqrt(releases) / z

    def integrand(loss: float) -> float:
        density = math.exp(-0.5 * ((loss - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        return density * -math.expm1(eps - loss)

    value, _ = quad(integrand, eps, mean + 40 * sd, epsabs=1e-14, epsrel=1e-10, limit=200)
    return value


CASES = [
    (1.0, 100, 1e-5),
    (1.0, 1, 1e-5),
    (2.0, 50, 1e-5),
    (4.5, 50, 1e-6),
    (10.0, 1, 1e-5),
    (0.7, 10, 1e-6),
    (5.0, 1000, 1e-5),
    (30.0, 50, 1e-8),
    (100.0, 3, 1e-6),
]


# ------------------------------------------------------------------------------------------
# epsilon
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("z", "releases", "delta"), CASES)
def test_rdp_matches_independent_computation(z: float, releases: int, delta: float) -> None:
    ours = epsilon_after(noise_multiplier=z, releases=releases, delta=delta)
    ref = rdp_epsilon_reference(z, releases, delta)
    assert ours >= ref * (1 - 1e-9)  # a grid minimum is never below the true minimum
    assert ours == pytest.approx(ref, rel=0.01)


@pytest.mark.parametrize(("z", "releases", "delta"), CASES)
def test_prv_matches_exact_gaussian_and_rdp_bounds_it(
    z: float, releases: int, delta: float
) -> None:
    exact = exact_gaussian_epsilon(z, releases, delta)
    prv = epsilon_after(noise_multiplier=z, releases=releases, delta=delta, accountant="prv")
    rdp = epsilon_after(noise_multiplier=z, releases=releases, delta=delta, accountant="rdp")
    # PRV reports an upper bound within eps_error = 0.01 of its estimate
    assert exact - 1e-3 <= prv <= exact + 0.02
    assert rdp >= exact
    assert rdp <= exact * 1.25 + 0.1  # RDP is loose, not absurdly so


def test_rdp_at_sample_rate_one_is_the_plain_gaussian_rdp_on_our_grid() -> None:
    """Our RDP epsilon is the closed-form Gaussian RDP R alpha / (2 z^2), converted and minimised
    over RDP_ORDERS (the optimum here is far above the orders <= 1.01 dp-accounting skips)."""
    orders = np.array(RDP_ORDERS)
    for z, r, d in [(0.5, 1, 1e-5), (1.0, 100, 1e-5), (3.7, 42, 1e-6), (30.0, 50, 1e-8)]:
        ref = rdp_to_epsilon(orders, r * orders / (2 * z * z), d)
        assert epsilon_after(noise_multiplier=z, releases=r, delta=d) == pytest.approx(
            ref, rel=1e-12
        )


def test_single_equivalent_release_is_the_composition() -> None:
    """At sample rate 1 we hand the accountants one release with z / sqrt(R) instead of R
    releases with z: the composed privacy loss distribution has the same privacy profile."""
    for z, r in [(2.0, 50), (1.0, 100), (8.0, 7)]:
        for eps in (0.5, 2.0, 8.0):
            s = z / math.sqrt(r)
            single = float(ndtr(-eps * s + 1 / (2 * s))) - math.exp(
                eps + float(log_ndtr(-eps * s - 1 / (2 * s)))
            )
            assert composed_gaussian_delta(z, r, eps) == pytest.approx(single, rel=1e-6, abs=1e-15)
    # and the PRV accountant, run on the single release, brackets the composed profile's epsilon
    exact = brentq(lambda e: composed_gaussian_delta(2.0, 50, e) - 1e-5, 0.0, 100.0, xtol=1e-12)
    ours = epsilon_after(noise_multiplier=2.0, releases=50, delta=1e-5, accountant="prv")
    assert exact - 1e-3 <= ours <= exact + 0.02


def test_special_cases_and_monotonicity() -> None:
    for acc in ("rdp", "prv"):
        assert epsilon_after(noise_multiplier=1.0, releases=0, delta=1e-5, accountant=acc) == 0.0
        assert epsilon_after(noise_multiplier=0.0, releases=3, delta=1e-5, accountant=acc) == (
            math.inf
        )
        assert epsilon_after(noise_multiplier=0.0, releases=0, delta=1e-5, accountant=acc) == 0.0
    eps_r = [epsilon_after(noise_multiplier=3.0, releases=r, delta=1e-5) for r in (1, 2, 10, 100)]
    assert eps_r == sorted(eps_r)
    eps_z = [epsilon_after(noise_multiplier=z, releases=10, delta=1e-5) for z in (1, 2, 5, 20)]
    assert eps_z == sorted(eps_z, reverse=True)
    assert epsilon_after(noise_multiplier=3.0, releases=10, delta=1e-6) > epsilon_after(
        noise_multiplier=3.0, releases=10, delta=1e-5
    )


@pytest.mark.parametrize(("z", "releases", "q"), [(1.0, 1000, 0.01), (2.0, 100, 0.3)])
def test_subsampled_rdp_matches_direct_numerical_integration(
    z: float, releases: int, q: float
) -> None:
    eps = epsilon_after(noise_multiplier=z, releases=releases, delta=1e-5, sample_rate=q)
    orders = np.array(RDP_ORDERS_SUBSAMPLED)
    ref = rdp_to_epsilon(orders, releases * subsampled_gaussian_rdp(q, z, orders), 1e-5)
    # dp-accounting bounds the RDP at fractional orders from above (and drops orders whose
    # series does not converge): never below the exact value, and close to it
    assert eps >= ref * (1 - 1e-6)
    assert eps == pytest.approx(ref, rel=0.01)
    assert eps < epsilon_after(noise_multiplier=z, releases=releases, delta=1e-5)


def test_subsampled_rdp_matches_opacus() -> None:
    from opacus.accountants import RDPAccountant  # here, not above: it loads torch

    for z, releases, q in [(1.0, 1000, 0.01), (0.8, 200, 0.05)]:
        eps = epsilon_after(noise_multiplier=z, releases=releases, delta=1e-5, sample_rate=q)
        acc = RDPAccountant()
        acc.history = [(z, q, releases)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opacus_eps = acc.get_epsilon(delta=1e-5, alphas=list(RDP_ORDERS_SUBSAMPLED))
        assert eps >= opacus_eps * (1 - 1e-9)  # Opacus sums the exact series
        assert eps == pytest.approx(opacus_eps, rel=0.01)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        epsilon_after(noise_multiplier=-1.0, releases=1, delta=1e-5)
    with pytest.raises(ValueError):
        epsilon_after(noise_multiplier=1.0, releases=-1, delta=1e-5)
    with pytest.raises(TypeError):
        epsilon_after(noise_multiplier=1.0, releases=1.5, delta=1e-5)  # type: ignore[arg-type]
    for bad_delta in (0.0, 1.0, -1e-5):
        with pytest.raises(ValueError):
            epsilon_after(noise_multiplier=1.0, releases=1, delta=bad_delta)
    with pytest.raises(ValueError):
        epsilon_after(noise_multiplier=1.0, releases=1, delta=1e-5, accountant="gdp")  # type: ignore[arg-type]
    for q in (0.0, 1.5):
        with pytest.raises(ValueError):
            epsilon_after(noise_multiplier=1.0, releases=1, delta=1e-5, sample_rate=q)
    with pytest.raises(TypeError):
        epsilon_after(1.0, 1, 1e-5)  # type: ignore[misc]  # keyword-only


def test_prv_failures_are_clear_errors() -> None:
    # effective multiplier 0.1 / sqrt(100) = 0.01: the PRV discretisation breaks down
    with pytest.raises(AccountingError, match="rdp"):
        epsilon_after(noise_multiplier=0.1, releases=100, delta=1e-5, accountant="prv")
    # RDP still answers (epsilon in the thousands: no privacy to speak of)
    assert epsilon_after(noise_multiplier=0.1, releases=100, delta=1e-5) > 1000
    # a subsampled history whose PRV grid would need gigabytes is refused before allocating
    with pytest.raises(AccountingError, match="grid"):
        epsilon_after(
            noise_multiplier=1.0, releases=20000, delta=1e-5, accountant="prv", sample_rate=0.5
        )


def test_gaussian_dp_mu() -> None:
    assert gaussian_dp_mu(noise_multiplier=2.0, releases=16) == pytest.approx(2.0)
    assert gaussian_dp_mu(noise_multiplier=0.0, releases=1) == math.inf
    assert gaussian_dp_mu(noise_multiplier=2.0, releases=0) == 0.0


# ------------------------------------------------------------------------------------------
# calibration
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize("target", [8.0, 4.0, 1.0])
def test_calibrate_then_recompute(accountant: str, target: float) -> None:
    z = calibrate_noise_multiplier(epsilon=target, delta=1e-5, releases=50, accountant=accountant)
    eps = epsilon_after(noise_multiplier=z, releases=50, delta=1e-5, accountant=accountant)
    assert eps <= target
    tol = min(0.01, 1e-3 * target) if accountant == "rdp" else 0.0105
    assert eps >= target - tol
    # a slightly smaller multiplier would overshoot (z is close to minimal)
    eps_less = epsilon_after(
        noise_multiplier=z * 0.99, releases=50, delta=1e-5, accountant=accountant
    )
    assert eps_less > target - tol


def test_calibrate_matches_exact_gaussian_inverse() -> None:
    # PRV calibration lands within ~1% of the exact multiplier; RDP needs a bit more noise
    z_prv = calibrate_noise_multiplier(epsilon=4.0, delta=1e-5, releases=50, accountant="prv")
    z_rdp = calibrate_noise_multiplier(epsilon=4.0, delta=1e-5, releases=50)
    z_exact = brentq(lambda z: exact_gaussian_epsilon(z, 50, 1e-5) - 4.0, 1.0, 100.0)
    assert z_prv == pytest.approx(z_exact, rel=0.01)
    assert z_rdp > z_exact


def test_calibrate_subsampled_and_errors() -> None:
    z = calibrate_noise_multiplier(epsilon=2.0, delta=1e-5, releases=200, sample_rate=0.05)
    eps = epsilon_after(noise_multiplier=z, releases=200, delta=1e-5, sample_rate=0.05)
    assert 2.0 - 0.01 <= eps <= 2.0
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, releases=0)
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(epsilon=0.0, delta=1e-5, releases=10)
    # PRV's reported epsilon never drops below ~eps_error = 0.01: the search gives up
    with pytest.raises(AccountingError, match="too low"):
        calibrate_noise_multiplier(epsilon=0.005, delta=1e-5, releases=10, accountant="prv")
    # RDP can certify it (for huge z the conversion reaches (0, delta)-DP)
    z_tiny = calibrate_noise_multiplier(epsilon=0.005, delta=1e-5, releases=10)
    assert 0.0 <= epsilon_after(noise_multiplier=z_tiny, releases=10, delta=1e-5) <= 0.005
    assert epsilon_after(noise_multiplier=1e6, releases=1, delta=1e-5) == 0.0  # clamped


def test_bisection_on_a_closed_form_epsilon() -> None:
    from secure.accounting.calibration import _bisect_noise_multiplier

    calls: list[float] = []

    def eps_of(z: float) -> float:  # decreasing in z, inverse 3 / target
        calls.append(z)
        return 3.0 / z

    z = _bisect_noise_multiplier(eps_of, 0.1, 1e-4)
    assert 0.1 - 1e-4 <= eps_of(z) <= 0.1
    assert z == pytest.approx(30.0, rel=1e-3)
    assert calls[:2] == [20.0, 40.0]  # doubling from 10, then bisection from 0
    # a budget no z up to 1e6 meets
    with pytest.raises(AccountingError, match="too low"):
        _bisect_noise_multiplier(eps_of, 1e-7, 1e-9)


def test_max_releases_is_the_boundary() -> None:
    z, d, target = 5.0, 1e-5, 4.0
    n = max_releases(noise_multiplier=z, delta=d, epsilon=target)
    assert n > 0
    assert epsilon_after(noise_multiplier=z, releases=n, delta=d) <= target
    assert epsilon_after(noise_multiplier=z, releases=n + 1, delta=d) > target
    assert max_releases(noise_multiplier=0.1, delta=d, epsilon=target) == 0
    assert max_releases(noise_multiplier=1e6, delta=d, epsilon=target, limit=1000) == 1000


# ------------------------------------------------------------------------------------------
# budget
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_budget_refuses_the_release_that_would_exceed(accountant: str) -> None:
    rounds = 10
    z = calibrate_noise_multiplier(epsilon=4.0, delta=1e-5, releases=rounds, accountant=accountant)
    budget = PrivacyBudget(noise_multiplier=z, delta=1e-5, accountant=accountant, epsilon_target=4)
    assert budget.releases == 0
    assert budget.epsilon == 0.0
    assert budget.remaining_releases() == rounds
    last = 0.0
    for i in range(rounds):
        assert not budget.would_exceed()
        eps = budget.record_release()
        assert eps > last
        last = eps
        assert budget.releases == i + 1
        assert budget.epsilon == eps
    assert budget.epsilon <= 4.0
    assert budget.would_exceed()
    assert budget.remaining_releases() == 0
    with pytest.raises(ReleaseRefused, match="exhausted") as info:
        budget.record_release()
    assert isinstance(info.value, RuntimeError)
    assert budget.releases == rounds  # nothing recorded
    assert budget.epsilon == last


def test_budget_without_target_never_refuses() -> None:
    budget = PrivacyBudget(noise_multiplier=0.5, delta=1e-5)
    for _ in range(5):
        assert not budget.would_exceed()
        budget.record_release()
    assert budget.remaining_releases() is None
    assert budget.epsilon == epsilon_after(noise_multiplier=0.5, releases=5, delta=1e-5)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_budget_round_trip(accountant: str) -> None:
    budget = PrivacyBudget(
        noise_multiplier=6.0, delta=1e-6, accountant=accountant, epsilon_target=5.0, releases=7
    )
    budget.record_release()
    record = json.loads(json.dumps(budget.to_dict(), allow_nan=False))  # strict JSON
    again = PrivacyBudget.from_dict(record)
    assert again.to_dict() == budget.to_dict()
    assert again.releases == 8
    assert again.epsilon == budget.epsilon
    assert record["epsilon"] == pytest.approx(budget.epsilon)
    # the bare parameters are enough
    bare = {k: record[k] for k in ("noise_multiplier", "delta", "accountant", "releases")}
    bare["epsilon_target"] = 5.0
    assert PrivacyBudget.from_dict(bare).to_dict() == budget.to_dict()
    # both continue identically
    assert again.record_release() == budget.record_release()


def test_budget_from_dict_rejects_bad_records() -> None:
    good = PrivacyBudget(noise_multiplier=2.0, delta=1e-5).to_dict()
    for key in ("noise_multiplier", "delta", "accountant", "releases"):
        with pytest.raises(ValueError, match="missing"):
            PrivacyBudget.from_dict({k: v for k, v in good.items() if k != key})
    with pytest.raises(ValueError, match="unknown"):
        PrivacyBudget.from_dict({**good, "sigma": 1.0})
    with pytest.raises(ValueError, match="schema"):
        PrivacyBudget.from_dict({**good, "schema": 99})
    with pytest.raises(TypeError):
        PrivacyBudget.from_dict({**good, "noise_multiplier": "2.0"})
    with pytest.raises(ValueError):
        PrivacyBudget.from_dict({**good, "releases": -1})
    with pytest.raises(TypeError):
        PrivacyBudget.from_dict([("releases", 1)])  # type: ignore[arg-type]


def test_budget_infinite_epsilon_is_strict_json() -> None:
    budget = PrivacyBudget(noise_multiplier=0.0, delta=1e-5, releases=1)
    assert budget.epsilon == math.inf
    record = budget.to_dict()
    assert record["epsilon"] is None
    json.dumps(record, allow_nan=False)
    refusing = PrivacyBudget(noise_multiplier=0.0, delta=1e-5, epsilon_target=10.0)
    assert refusing.would_exceed()
    with pytest.raises(ReleaseRefused):
        refusing.record_release()


def test_budget_counts_hundreds_of_releases_and_restores_in_one_evaluation() -> None:
    """(How long this takes is measured by bench/, never by a timed test.)"""
    budget = PrivacyBudget(noise_multiplier=20.0, delta=1e-6, epsilon_target=8.0)
    for _ in range(2000):
        if budget.would_exceed():
            break
        budget.record_release()
        _ = budget.epsilon
    assert budget.releases == max_releases(noise_multiplier=20.0, delta=1e-6, epsilon=8.0)
    # reconstructing a budget with many releases is one evaluation
    eps = PrivacyBudget(noise_multiplier=9.0, delta=1e-6, accountant="prv", releases=900).epsilon
    assert eps == pytest.approx(exact_gaussian_epsilon(9.0, 900, 1e-6), abs=0.02)


def test_the_release_decision_refuses_past_either_cap_and_what_it_cannot_evaluate() -> None:
    z, d = 5.0, 1e-5
    n = max_releases(noise_multiplier=z, delta=d, epsilon=4.0)
    fits = decide_release(noise_multiplier=z, releases=n, delta=d, epsilon_cap=4.0)
    assert fits.allowed and fits.epsilon == epsilon_after(noise_multiplier=z, releases=n, delta=d)
    over = decide_release(noise_multiplier=z, releases=n + 1, delta=d, epsilon_cap=4.0)
    assert not over.allowed and over.refusal == "epsilon" and over.epsilon > 4.0
    capped = decide_release(
        noise_multiplier=z, releases=3, delta=d, epsilon_cap=None, max_releases=2
    )
    assert capped.refusal == "max_releases"
    # the PRV accountant cannot evaluate an epsilon in the hundreds: refused, never an error
    unknown = dict(noise_multiplier=0.1, releases=100, delta=d, accountant="prv")
    refused = decide_release(**unknown, epsilon_cap=1e6)
    assert refused.refusal == "epsilon" and refused.epsilon == math.inf
    assert decide_release(**unknown, epsilon_cap=None).allowed  # no cap: nothing to refuse
    with pytest.raises(ValueError, match="delta"):
        decide_release(noise_multiplier=z, releases=1, delta=2.0, epsilon_cap=None)
    budget = PrivacyBudget(noise_multiplier=z, delta=d, max_releases=2)
    budget.record_release()
    budget.record_release()
    assert budget.remaining_releases() == 0 and budget.would_exceed()
    with pytest.raises(ReleaseRefused, match="cap of 2 releases"):
        budget.record_release()


def test_session_calibration_spends_the_target_through_the_ledger_multiplier() -> None:
    from secure.accounting import calibrate_session_noise_multiplier
    from secure.dp import effective_noise_multiplier

    for shared in (False, True):
        z = calibrate_session_noise_multiplier(
            epsilon=4.0, delta=1e-6, releases=50, clients=3, shared=shared
        )
        ledger_z = effective_noise_multiplier(noise_multiplier=z, clients=3, shared=shared)
        spent = epsilon_after(noise_multiplier=ledger_z, releases=50, delta=1e-6)
        assert 4.0 * 0.99 <= spent <= 4.0


# ------------------------------------------------------------------------------------------
# dependencies
# ------------------------------------------------------------------------------------------


def test_import_loads_neither_torch_nor_opacus() -> None:
    """The aggregation service accounts privacy with this module and must stay torch-free."""
    code = (
        "import sys, secure.accounting\n"
        "heavy = ('torch', 'opacus')\n"
        "print(','.join(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=root,
    )
    assert result.stdout.strip() == ""
