"""The degree-normalised release's plan (secure/dp.py, secure/privacy.py, secure/release_noise.py;
docs/privacy.md 3.7): its sensitivity, the noise std it feeds (unshared, shared and split), its
settings on the wire, and its place in the release mechanism's identity."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from secure.dp import DEFAULT_DEGREE_FLOOR, degree_normalised_sensitivity, node_sensitivity
from secure.privacy import PrivacyPlanError, SessionPrivacy
from secure.release_noise import ReleaseMechanism
from secure.split_noise import grid_sensitivity
from secure.wire.sessions import PrivacySettings

BASE = dict(delta=1e-6, clip=1.0, occurrence_cap=1, passes_total=50, encrypted=True)


def plan(release: str = "degree-normalised", **overrides: object) -> SessionPrivacy:
    return SessionPrivacy.plan(
        **{"epsilon": 4.0, **BASE, "clients": 3, "release": release, **overrides}
    )


def test_sensitivity_is_2c_sqrt_of_the_rows_reached_over_the_floor() -> None:
    assert degree_normalised_sensitivity(
        clip=1.0, occurrence_cap=1, degree_floor=4
    ) == pytest.approx(2 * math.sqrt(2) / 4)
    assert degree_normalised_sensitivity(
        clip=0.5, occurrence_cap=3, degree_floor=2
    ) == pytest.approx(2 * 0.5 * 2 / 2)
    # floor 1: the clip-after bound of one layer (every row moves by at most 2C)
    for cap in range(5):
        assert degree_normalised_sensitivity(
            clip=1.0, occurrence_cap=cap, degree_floor=1
        ) == pytest.approx(node_sensitivity(clip=1.0, occurrence_cap=cap, depth=1))
    with pytest.raises(ValueError):
        degree_normalised_sensitivity(clip=1.0, occurrence_cap=1, degree_floor=0)
    with pytest.raises(TypeError):
        degree_normalised_sensitivity(clip=1.0, occurrence_cap=1, degree_floor=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        degree_normalised_sensitivity(1.0, 1, 4)  # type: ignore[misc]  # keyword-only


def test_the_plan_derives_it_and_the_noise_std_is_it_times_z() -> None:
    clip_after, normalised = plan("clip-after"), plan()
    assert clip_after.sensitivity == pytest.approx(2 * math.sqrt(2))
    assert normalised.sensitivity == pytest.approx(2 * math.sqrt(2) / DEFAULT_DEGREE_FLOOR)
    # z depends on epsilon and the releases only: the noise std shrinks with Delta
    assert normalised.noise_multiplier == clip_after.noise_multiplier
    z = normalised.noise_multiplier
    assert normalised.client_noise_std == pytest.approx(z * normalised.sensitivity, rel=1e-12)
    assert clip_after.client_noise_std / normalised.client_noise_std == pytest.approx(4.0)
    shared = plan(shared_noise=True)
    assert shared.client_noise_std == pytest.approx(
        shared.noise_multiplier * shared.sensitivity / math.sqrt(3), rel=1e-12
    )
    report = normalised.report(releases=0)
    assert report["release"] == "degree-normalised" and report["degree_floor"] == 4
    assert report["noise_std"] == pytest.approx(z * normalised.sensitivity)
    assert clip_after.report(releases=0)["degree_floor"] is None


@pytest.mark.parametrize("clients", [3, 5])
def test_split_noise_feeds_the_new_sensitivity_to_the_same_std(clients: int) -> None:
    planned = plan(clients=clients, split_noise=True, degree_floor=8)
    delta_ = 2 * math.sqrt(2) / 8
    assert planned.sensitivity == pytest.approx(delta_)
    # on the grid: Delta + g sqrt(k), k = (c + 1) * width coordinates, as for clip-after
    delta_g = grid_sensitivity(sensitivity=delta_, coordinates=2 * 16)
    assert planned.grid_sensitivity(16) == pytest.approx(delta_g, rel=1e-15)
    std = planned.release_noise_std(16)
    assert std == pytest.approx(planned.noise_multiplier * delta_g / math.sqrt(clients - 1))
    assert ReleaseMechanism.of(planned, width=16, encoding="bfv-masked").noise_std == std


def test_bad_release_settings_are_refused() -> None:
    with pytest.raises(PrivacyPlanError, match="release must be"):
        plan("clip-before")
    with pytest.raises(PrivacyPlanError, match="degree_floor"):
        plan(degree_floor=0)
    with pytest.raises(PrivacyPlanError, match="degree_floor"):
        plan(degree_floor=True)
    with pytest.raises(ValidationError):
        PrivacySettings(delta=1e-6, clip=1.0, epsilon=4.0, release="median")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        PrivacySettings(delta=1e-6, clip=1.0, epsilon=4.0, degree_floor=0)


def test_the_wire_settings_round_trip_and_default_to_clip_after() -> None:
    default = PrivacySettings(delta=1e-6, clip=1.0, epsilon=4.0)
    assert default.release == "clip-after"
    restored = SessionPrivacy.restore(
        {**plan(degree_floor=6).settings(), "noise_multiplier_source": "calibrated"},
        clients=3, passes_total=50, encrypted=True,
    )  # fmt: skip
    assert restored.release == "degree-normalised" and restored.degree_floor == 6
    wire = PrivacySettings.model_validate(
        {k: v for k, v in plan().settings().items() if k != "noise_multiplier_source"}
    )
    assert wire.release == "degree-normalised" and wire.degree_floor == 4


def test_the_release_kind_and_floor_are_part_of_the_mechanism_and_clip_after_is_unchanged() -> None:
    clip_after = ReleaseMechanism.of(plan("clip-after"), width=16, encoding="ckks")
    # written only for a degree-normalised release: every earlier digest stays as it was
    assert "release" not in clip_after.canonical() and "degree_floor" not in clip_after.canonical()
    normalised = ReleaseMechanism.of(plan(), width=16, encoding="ckks")
    assert '"release":"degree-normalised"' in normalised.canonical()
    assert '"degree_floor":4' in normalised.canonical()
    assert ReleaseMechanism.from_canonical(normalised.canonical()) == normalised
    assert ReleaseMechanism.from_canonical(clip_after.canonical()) == clip_after
    other_floor = ReleaseMechanism.of(plan(degree_floor=8), width=16, encoding="ckks")
    assert len({clip_after.digest, normalised.digest, other_floor.digest}) == 3
    assert any(d.startswith("degree_floor") for d in normalised.differences(other_floor))
    assert any(d.startswith("release") for d in normalised.differences(clip_after))
