"""A degree-normalised session at the data owner's worker (clients/policy.py; docs/privacy.md
3.7): the worker derives the sensitivity from the session's release settings and refuses a
service that reports another one; its ledger keys the session by a mechanism that names the
release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clients.cli.budget_cmd import describe
from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy, admit_session
from models.config import TrainConfig
from secure.privacy import SessionPrivacy
from secure.release_noise import ReleaseMechanism

PASSES = 40


def session(*, reported: SessionPrivacy | None = None, **release: Any) -> dict[str, Any]:
    """``GET /v1/sessions/{id}`` of a session planned with ``release`` (the service reports
    ``reported``'s accounting, by default its own)."""
    planned = SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, clients=3, passes_total=PASSES,
        encrypted=True, **release,
    )  # fmt: skip
    settings = {k: v for k, v in planned.settings().items() if k != "noise_multiplier_source"}
    return {
        "session_id": "s1",
        "passes_total": PASSES,
        "config": {"clients": 3, "agg_layers": [{"layer": 1, "width": 16}], "privacy": settings},
        "privacy": (reported or planned).report(releases=0),
    }


@pytest.fixture
def ledger(tmp_path: Path) -> OwnerLedger:
    with OwnerLedger.beside(tmp_path) as opened:
        yield opened


def admit(body: dict[str, Any], ledger: OwnerLedger) -> SessionPrivacy | None:
    policy = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
    return admit_session(policy, body, session_id="s1", encrypted=True, ledger=ledger)


def test_the_worker_derives_the_degree_normalised_sensitivity(ledger: OwnerLedger) -> None:
    privacy = admit(session(release="degree-normalised", degree_floor=8), ledger)
    assert privacy is not None
    assert privacy.release == "degree-normalised" and privacy.degree_floor == 8
    assert privacy.sensitivity == pytest.approx(2 * 2**0.5 / 8)
    mechanism = ReleaseMechanism.of(privacy, width=16, encoding="ckks")
    assert (mechanism.release, mechanism.degree_floor) == ("degree-normalised", 8)
    # the run's summary names it beside Delta
    assert "degree-normalised release (degree floor 8)" in describe(privacy.report(releases=0))


def test_a_service_reporting_another_release_is_refused(ledger: OwnerLedger) -> None:
    """The session says degree-normalised; the service accounts it as clip-after (or with
    another floor): the worker's own Delta differs, and it refuses."""
    clip_after = SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, clients=3, passes_total=PASSES,
        encrypted=True,
    )  # fmt: skip
    with pytest.raises(PolicyRefusal, match="sensitivity"):
        admit(session(reported=clip_after, release="degree-normalised"), ledger)


def test_train_config_asks_for_the_release_only_when_degree_normalised() -> None:
    default = TrainConfig(encryption="none").privacy_request()
    assert default is not None and "release" not in default and "degree_floor" not in default
    asked = TrainConfig(encryption="none", release="degree-normalised", degree_floor=6)
    request = asked.privacy_request()
    assert request is not None
    assert (request["release"], request["degree_floor"]) == ("degree-normalised", 6)
    planned = asked.session_privacy(clients=3, passes_total=10)
    assert planned is not None and planned.sensitivity == pytest.approx(2 * 2**0.5 / 6)
