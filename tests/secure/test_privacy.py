"""The one session-privacy plan (secure/privacy.py) that the trainer, the worker and the service
share."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from secure.accounting import calibrate_noise_multiplier, epsilon_after
from secure.privacy import PrivacyPlanError, SessionPrivacy, release_sensitivity

BASE = dict(delta=1e-6, clip=1.0, occurrence_cap=1, clients=3, passes_total=330, encrypted=True)


def test_sensitivity_is_derived_from_clip_and_cap() -> None:
    assert release_sensitivity(clip=1.0, occurrence_cap=1) == pytest.approx(2 * math.sqrt(2))
    assert release_sensitivity(clip=0.5, occurrence_cap=3) == pytest.approx(2 * 0.5 * 2)
    privacy = SessionPrivacy.plan(epsilon=4.0, **BASE)
    assert privacy.sensitivity == release_sensitivity(clip=1.0, occurrence_cap=1)
    assert privacy.noise_multiplier * privacy.sensitivity == pytest.approx(
        privacy.report(releases=0)["noise_std"]
    )


def test_calibrated_z_spends_the_target_and_no_more() -> None:
    privacy = SessionPrivacy.plan(epsilon=4.0, **BASE)
    assert privacy.noise_multiplier_source == "calibrated"
    assert privacy.epsilon_planned <= 4.0
    assert privacy.epsilon_planned == pytest.approx(4.0, abs=0.01)
    # unshared noise: the ledger composes z itself, the z a single accountant would choose
    assert privacy.ledger_noise_multiplier == privacy.noise_multiplier
    reference = calibrate_noise_multiplier(epsilon=4.0, delta=1e-6, releases=330)
    assert privacy.noise_multiplier == pytest.approx(reference, rel=1e-6)


def test_shared_noise_scales_z_so_one_curious_peer_sees_the_target() -> None:
    privacy = SessionPrivacy.plan(epsilon=4.0, shared_noise=True, **BASE)
    assert privacy.ledger_noise_multiplier == pytest.approx(
        privacy.noise_multiplier * math.sqrt(2 / 3)
    )
    assert privacy.client_noise_std == pytest.approx(
        privacy.noise_multiplier * privacy.sensitivity / math.sqrt(3)
    )
    spent = epsilon_after(
        noise_multiplier=privacy.ledger_noise_multiplier, releases=330, delta=1e-6
    )
    assert spent == pytest.approx(privacy.epsilon_planned) and spent <= 4.0


def test_release_gate_follows_the_target_and_the_cap() -> None:
    privacy = SessionPrivacy.plan(epsilon=4.0, **{**BASE, "passes_total": 10})
    assert privacy.release_allowed(0) and privacy.release_allowed(9)
    capped = SessionPrivacy.plan(epsilon=None, noise_multiplier=5.0, max_releases=2, **BASE)
    assert capped.planned_releases == 2
    assert capped.release_allowed(1) and not capped.release_allowed(2)
    given = SessionPrivacy.plan(epsilon=1.0, noise_multiplier=50.0, **BASE)
    allowed = [n for n in range(330) if given.release_allowed(n)]
    assert given.epsilon_after(len(allowed)) <= 1.0 < given.epsilon_after(len(allowed) + 1)


@pytest.mark.parametrize(
    ("overrides", "mentions"),
    [
        (dict(epsilon=None), "give noise_multiplier"),
        (dict(epsilon=4.0, shared_noise=True, encrypted=False), "needs encryption"),
        (dict(epsilon=1e-3, noise_multiplier=0.5), "below the epsilon of a single release"),
        (dict(epsilon=None, noise_multiplier=1e-300), "cannot evaluate"),
        (dict(epsilon=4.0, delta=2.0), "delta"),
        (dict(epsilon=4.0, clip=0.0), "clip"),
        (dict(epsilon=4.0, occurrence_cap=-1), "occurrence_cap"),
        (dict(epsilon=4.0, accountant="moments"), "accountant"),
    ],
)
def test_bad_parameters_are_one_clear_error(overrides: dict, mentions: str) -> None:
    with pytest.raises(PrivacyPlanError, match=mentions):
        SessionPrivacy.plan(**{**BASE, **overrides})


def test_restore_reproduces_the_plan_without_recalibrating() -> None:
    planned = SessionPrivacy.plan(epsilon=4.0, shared_noise=True, **BASE)
    settings = planned.settings()
    assert "sensitivity" not in settings and settings["noise_multiplier"] > 0
    restored = SessionPrivacy.restore(settings, clients=3, passes_total=330, encrypted=True)
    assert restored == planned
    with pytest.raises(PrivacyPlanError, match="unknown privacy settings"):
        SessionPrivacy.restore(
            {**settings, "sensitivity": 1.0}, clients=3, passes_total=330, encrypted=True
        )


def test_report_has_the_service_fields() -> None:
    report = SessionPrivacy.plan(epsilon=4.0, **BASE).report(releases=10)
    assert report["enabled"] is True and report["releases"] == 10
    assert report["epsilon"] == pytest.approx(
        epsilon_after(noise_multiplier=report["ledger_noise_multiplier"], releases=10, delta=1e-6)
    )
    from secure.wire.status import PrivacyReport

    assert set(report) == set(PrivacyReport.model_fields)


def test_the_plan_loads_no_torch() -> None:
    code = "import sys, secure.privacy; print('torch' in sys.modules, 'opacus' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "False"]


def _rdp_reference(z: float, releases: int, delta: float) -> float:
    """R Gaussian releases with multiplier z: RDP R alpha / (2 z^2), converted to (epsilon,
    delta) (Balle et al. 2020, Thm 21) and minimised over real orders, without the backend."""
    from scipy.optimize import minimize_scalar

    rho = releases / (2.0 * z * z)

    def eps(log_am1: float) -> float:
        a = 1.0 + math.exp(log_am1)
        return rho * a + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)

    return float(minimize_scalar(eps, bounds=(-14.0, 16.0), method="bounded").fun)


def test_epsilon_against_each_adversary_matches_the_audit() -> None:
    """The audit of the default run before shared noise became opt-in: epsilon 4 against one
    curious peer, 5.91 against two colluding peers, 8.82 for a node across all three clients."""
    shared = SessionPrivacy.plan(epsilon=4.0, shared_noise=True, **BASE)
    report = shared.report(releases=330)
    by_name = {a["adversary"].split(",")[0]: a for a in report["adversaries"]}
    assert by_name["the service alone"]["epsilon"] is None  # ciphertexts only
    assert by_name["one curious peer"]["epsilon"] == pytest.approx(3.998, abs=1e-3)
    colluding = by_name["all other peers colluding"]
    assert colluding["epsilon"] == pytest.approx(5.91, abs=5e-3)
    # independently: the coalition isolates the victim's share, which carries z Delta / sqrt(M)
    z_coalition = shared.noise_multiplier / math.sqrt(3)
    assert colluding["epsilon"] == pytest.approx(_rdp_reference(z_coalition, 330, 1e-6), rel=2e-3)
    node_everywhere = next(a for a in report["adversaries"] if "all 3 clients" in a["adversary"])
    assert node_everywhere["epsilon"] == pytest.approx(8.82, abs=5e-3)
    assert "edges" in " ".join(report["not_protected"]) and "feature row" in report["privacy_unit"]


def test_without_shared_noise_the_target_holds_against_all_peers_colluding() -> None:
    report = SessionPrivacy.plan(epsilon=4.0, **BASE).report(releases=330)
    colluding = next(a for a in report["adversaries"] if "colluding" in a["adversary"])
    assert colluding["epsilon"] == pytest.approx(report["epsilon"]) and report["epsilon"] <= 4.0
    plaintext = SessionPrivacy.plan(epsilon=4.0, **{**BASE, "encrypted": False})
    service = plaintext.report(releases=330)["adversaries"][0]
    assert service["adversary"] == "the service alone" and service["epsilon"] <= 4.0
