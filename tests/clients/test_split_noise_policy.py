"""Split noise at the data owner's worker (clients/policy.py, clients/owner_ledger.py,
clients/privacy_report.py; docs/privacy.md section 11): the refusals, the ledger rows with each
adversary's noise, and the compliance report's lines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from clients.cli.budget_cmd import describe
from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy, ReleaseGate, admit_session, session_about
from clients.privacy_report import organisation_content
from secure.accounting import composed_epsilon
from secure.privacy import SessionPrivacy
from secure.release_noise import ReleaseMechanism
from secure.report import WHO, session_content

PASSES = 40
OPEN = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)


def session(*, clients: int = 3, masks: bool = True, **config: Any) -> dict[str, Any]:
    """``GET /v1/sessions/{id}`` of a split-noise session, as the service plans it."""
    planned = SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, split_noise=True,
        clients=clients, passes_total=PASSES, encrypted=True,
    )  # fmt: skip
    settings = {k: v for k, v in planned.settings().items() if k != "noise_multiplier_source"}
    return {
        "session_id": "s1",
        "passes_total": PASSES,
        "config": {
            "clients": clients,
            "agg_layers": [{"layer": 1, "width": 16}],
            "privacy": settings,
            "secure_aggregation": "masks" if masks else "none",
            **config,
        },
        "privacy": planned.report(releases=0),
    }


@pytest.fixture
def ledger(tmp_path: Path) -> OwnerLedger:
    with OwnerLedger.beside(tmp_path) as opened:
        yield opened


def admit(policy: PrivacyPolicy, body: dict[str, Any], ledger: OwnerLedger) -> SessionPrivacy:
    privacy = admit_session(policy, body, session_id="s1", encrypted=True, ledger=ledger)
    assert privacy is not None
    return privacy


def test_split_noise_under_masks_is_admitted_without_the_shared_noise_consent(
    ledger: OwnerLedger,
) -> None:
    assert admit(PrivacyPolicy(), session(), ledger).split_noise


@pytest.mark.parametrize(
    ("policy", "body", "says"),
    [
        (PrivacyPolicy(), session(masks=False), "allow-shared-noise"),
        (PrivacyPolicy(allow_shared_noise=True), session(nodes="union"), "union"),
        (PrivacyPolicy(), session(nodes="union"), "union"),
        (
            PrivacyPolicy(allow_shared_noise=True),
            session(masks=False, stragglers="continue"),
            "stragglers",
        ),
        (PrivacyPolicy(accountant="prv"), session(), "PRV"),
        (PrivacyPolicy(), session(stragglers="continue"), "stragglers"),
    ],
    ids=[
        "no-masks",
        "union-consented",
        "union-masks",
        "continue-no-masks",
        "prv-policy",
        "continue-masks",
    ],
)
def test_split_noise_refusals(
    ledger: OwnerLedger, policy: PrivacyPolicy, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(PolicyRefusal, match=says):
        admit(policy, body, ledger)


def test_what_the_refusals_leave_is_admitted(ledger: OwnerLedger) -> None:
    assert admit(PrivacyPolicy(allow_shared_noise=True), session(masks=False), ledger)


def test_two_parties_cannot_split(ledger: OwnerLedger) -> None:
    body = session()
    body["config"]["clients"] = 2
    with pytest.raises(PolicyRefusal, match="at least 3 parties"):
        admit(PrivacyPolicy(), body, ledger)


def gate_of(privacy: SessionPrivacy, ledger: OwnerLedger) -> ReleaseGate:
    mechanism = ReleaseMechanism.of(privacy, width=16, encoding="bfv-masked")
    return ReleaseGate(OPEN, privacy, ledger, "s1", mechanism)


def test_each_row_keeps_what_each_adversary_faced(ledger: OwnerLedger) -> None:
    body = session(clients=4)
    privacy = admit(OPEN, body, ledger)
    z = privacy.noise_multiplier
    gate = gate_of(privacy, ledger)
    assert gate.admit(0, release="aa") and gate.admit(1, release="bb")
    rows = ledger.snapshot().releases
    assert rows[0]["adversaries"] == {
        "service": None, "peer": z, "service_peer": z,
        "colluding": pytest.approx(z / math.sqrt(3)), "group": pytest.approx(z / 3),
    }  # fmt: skip


def test_rows_without_split_noise_look_as_before(ledger: OwnerLedger) -> None:
    ledger.record(session_id="old", pass_index=0, noise_multiplier=2.0)
    assert "adversaries" not in ledger.snapshot().releases[0]


def test_the_compliance_report_shows_each_adversary_of_a_split_session(
    ledger: OwnerLedger,
) -> None:
    body = session(clients=4)
    privacy = admit(OPEN, body, ledger)
    ledger.note_session("s1", session_about(body, privacy))
    gate = gate_of(privacy, ledger)
    for p in range(3):
        gate.admit(p, release=f"r{p}")
    content = organisation_content([ledger.snapshot()], policy=OPEN, generated_at=0.0)
    [figures] = [s["adversaries"] for s in content["sessions"]]
    by_key = {a["key"]: a for a in figures}
    assert list(by_key) == ["service", "peer", "service_peer", "colluding", "group"]
    split = privacy.split()
    # three passes of all four shares, composed release by release (RDP adds up)
    peer_inverse = 3 / split.noise_multiplier_against(1) ** 2
    peer = composed_epsilon(inverse_square_sum=peer_inverse, delta=1e-6, accountant="rdp")
    assert by_key["peer"]["epsilon"] == pytest.approx(peer, rel=1e-9)
    assert by_key["service_peer"]["epsilon"] == pytest.approx(peer, rel=1e-9)
    colluding = composed_epsilon(
        inverse_square_sum=3 / split.noise_multiplier_against(3) ** 2, delta=1e-6, accountant="rdp"
    )
    assert by_key["colluding"]["epsilon"] == pytest.approx(colluding, rel=1e-9)
    assert by_key["service"]["epsilon"] is None
    assert WHO["service_peer"] in by_key["service_peer"]["sentence"]
    lifetime = {a["key"] for a in content["adversaries"]}
    assert "service_peer" in lifetime
    assert any("split the noise" in w for w in content["warnings"])


def test_a_report_without_split_noise_has_no_service_peer_line(tmp_path: Path) -> None:
    with OwnerLedger.beside(tmp_path) as ledger:
        planned = SessionPrivacy.plan(
            epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, clients=3, passes_total=PASSES,
            encrypted=True,
        )  # fmt: skip
        body = session()
        ledger.note_session("s2", session_about(body | {"config": body["config"]}, planned))
        ledger.record(session_id="s2", pass_index=0, noise_multiplier=planned.noise_multiplier)
        content = organisation_content([ledger.snapshot()], policy=OPEN, generated_at=0.0)
    keys = [a["key"] for a in content["adversaries"]]
    assert "service_peer" not in keys and not content["warnings"]


def test_the_operator_s_report_and_the_run_summary_name_the_service_with_a_peer() -> None:
    privacy = SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, split_noise=True,
        clients=3, passes_total=PASSES, encrypted=True,
    )  # fmt: skip
    report = privacy.report(releases=5)
    status = {"session_id": "s1", "config": {"clients": 3}, "privacy": report}
    content = session_content(status, pass_kinds=["train"] * PASSES, generated_at=0.0)
    assert "split noise" in content["total"]["holds_against"]
    lines = {a["key"]: a for a in content["adversaries"]}
    assert WHO["service_peer"] in lines["service_peer"]["sentence"]
    text = describe(report)
    assert "discrete Gaussian split" in text
    assert "the service with one colluding peer" in text
    assert "split noise over 3 parties, 5 releases" in text
