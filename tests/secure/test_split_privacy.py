"""A session's plan with split noise (secure/privacy.py, secure/split_session.py; docs/privacy.md
section 11): z calibrated directly, the ledger composing z, each party's std on the grid, the
refusals, and the epsilon against each adversary."""

from __future__ import annotations

import math

import pytest

from secure.privacy import PrivacyPlanError, SessionPrivacy
from secure.split_noise import SplitNoise, adversary_epsilons, grid_sensitivity
from secure.wire.sessions import PrivacySettings

BASE = dict(delta=1e-6, clip=1.0, occurrence_cap=1, passes_total=50, encrypted=True)


def split(clients: int = 3, **overrides: object) -> SessionPrivacy:
    """A split session under masks (split noise's default home) unless overridden."""
    return SessionPrivacy.plan(
        **{"epsilon": 4.0, **BASE, "masked": True, **overrides}, clients=clients, split_noise=True
    )


def test_z_is_calibrated_directly_and_the_ledger_composes_it() -> None:
    plain = SessionPrivacy.plan(epsilon=4.0, **BASE, clients=3)
    shared = SessionPrivacy.plan(epsilon=4.0, **BASE, clients=3, shared_noise=True)
    planned = split()
    # no sqrt(M / (M - 1)) factor: the z of unshared noise, composed as it is
    assert planned.noise_multiplier == pytest.approx(plain.noise_multiplier, rel=1e-12)
    assert planned.noise_multiplier < shared.noise_multiplier
    assert planned.ledger_noise_multiplier == planned.noise_multiplier
    assert planned.epsilon_planned == pytest.approx(4.0, abs=0.01)
    # each party: z Delta_g / sqrt(M - 1), Delta_g the sensitivity on the grid (k = 2 * 16)
    delta_g = grid_sensitivity(sensitivity=planned.sensitivity, coordinates=2 * 16)
    assert planned.grid_sensitivity(16) == pytest.approx(delta_g, rel=1e-15)
    std = planned.release_noise_std(16)
    assert std == pytest.approx(planned.noise_multiplier * delta_g / math.sqrt(2), rel=1e-12)
    assert std == pytest.approx(17.945, abs=0.01)  # docs/privacy.md section 11.2
    with pytest.raises(ValueError, match="release width"):
        _ = planned.client_noise_std
    assert plain.release_noise_std(16) == plain.client_noise_std


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"clients": 2}, "at least 3 parties"),
        ({"accountant": "prv"}, "PRV"),
        ({"shared_noise": True}, "choose one"),
        ({"encrypted": False}, "needs encryption"),
        ({"epsilon": None, "noise_multiplier": 1e-4, "clip": 1e-3}, "tau"),
    ],
)
def test_a_split_that_cannot_run_or_be_accounted_is_refused(overrides: dict, says: str) -> None:
    clients = int(overrides.pop("clients", 3))  # type: ignore[call-overload]
    with pytest.raises(PrivacyPlanError, match=says):
        split(clients, **overrides)


def test_restore_keeps_the_split_and_refuses_what_plan_refuses() -> None:
    planned = split()
    settings = planned.settings()
    assert settings["split_noise"] is True
    restored = SessionPrivacy.restore(
        settings, clients=3, passes_total=50, encrypted=True, masked=True
    )
    assert restored == planned
    with pytest.raises(PrivacyPlanError, match="at least 3"):
        SessionPrivacy.restore(settings, clients=2, passes_total=50, encrypted=True)
    # the service's body takes it, and plans the same session from it
    body = PrivacySettings(epsilon=4.0, delta=1e-6, clip=1.0, split_noise=True)
    again = SessionPrivacy.plan(
        **body.model_dump(), clients=3, passes_total=50, encrypted=True, masked=True
    )
    assert again == planned
    assert PrivacySettings(epsilon=4.0, delta=1e-6, clip=1.0).split_noise is False


@pytest.mark.parametrize("clients", [3, 5])
def test_each_adversary_faces_its_share_of_the_split(clients: int) -> None:
    planned = split(clients)
    z, m = planned.noise_multiplier, clients
    faced = {a.key: a.noise_multiplier for a in planned.adversaries()}
    assert list(faced) == ["service", "peer", "service_peer", "colluding", "group"]
    assert faced["service"] is None
    assert faced["peer"] == pytest.approx(z) and faced["service_peer"] == pytest.approx(z)
    assert faced["colluding"] == pytest.approx(z / math.sqrt(m - 1))
    assert faced["group"] == pytest.approx(z / (m - 1))
    report = planned.report(releases=50)
    assert report["split_noise"] is True
    reference = adversary_epsilons(
        SplitNoise(noise_multiplier=z, sensitivity=planned.sensitivity, clients=m, dimension=4096),
        releases=50,
        delta=1e-6,
    )
    assert report["split"] == planned.split_epsilons(50).to_dict()
    for line in report["adversaries"][1:]:
        assert line["epsilon"] == pytest.approx(reference.epsilon(line["key"]), rel=1e-9)
    assert any("the service with one colluding peer" in x for x in report["adversary_lines"])
    # unsplit sessions: no service_peer line, no split accounting
    plain = SessionPrivacy.plan(epsilon=4.0, **BASE, clients=m).report(releases=50)
    assert "service_peer" not in {a["key"] for a in plain["adversaries"]}
    assert plain["split"] is None and plain["adversary_lines"] == []


@pytest.mark.parametrize("clients", [3, 5])
def test_without_masks_the_service_with_one_peer_faces_one_share(clients: int) -> None:
    """A split session on CKKS (the owners' --allow-shared-noise): the colluding peer's key
    decrypts the victim's share, so the service with it faces what M - 1 colluders face."""
    masked, unmasked = split(clients), split(clients, masked=False)
    faced = {a.key: a.noise_multiplier for a in unmasked.adversaries()}
    assert faced["service_peer"] == pytest.approx(faced["colluding"])
    assert faced["service_peer"] < faced["peer"]
    epsilons = unmasked.split_epsilons(50)
    assert epsilons.epsilon("service_peer") == pytest.approx(epsilons.epsilon("colluding"))
    assert epsilons.epsilon("service_peer") > masked.split_epsilons(50).epsilon("service_peer")
    lines = unmasked.report(releases=50)["adversaries"]
    service_peer = next(line for line in lines if line["key"] == "service_peer")
    assert service_peer["epsilon"] == pytest.approx(epsilons.epsilon("service_peer"), rel=1e-9)
