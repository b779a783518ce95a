"""Who could read a share, in the privacy reports (secure/report.py, clients/privacy_report.py,
secure/report_html.py): a masked session's report says no one could read one partner's share
and keeps its per-adversary lines under split noise; a CKKS session's says the service with one
partner could; the ledger records the session's share encoding without changing older ledgers'
digests. No HTTP: the session bodies are ``GET /v1/sessions/{id}`` as the service plans them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clients.cli.budget_cmd import describe
from clients.owner_ledger import OwnerLedger
from clients.policy import PrivacyPolicy, admit_session, session_about
from clients.privacy_report import organisation_content
from secure.privacy import SessionPrivacy
from secure.report import SHARES, WHO, session_content
from secure.report_html import render_html

PASSES = 20
OPEN = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
MASKED, CKKS = "bfv-masked", "ckks"


def planned(*, split_noise: bool) -> SessionPrivacy:
    return SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, split_noise=split_noise,
        clients=3, passes_total=PASSES, encrypted=True,
    )  # fmt: skip


def session(session_id: str, *, encoding: str, split_noise: bool) -> dict[str, Any]:
    """The service's description of a 3-party session whose shares travel as ``encoding``."""
    privacy = planned(split_noise=split_noise)
    settings = {k: v for k, v in privacy.settings().items() if k != "noise_multiplier_source"}
    return {
        "session_id": session_id,
        "passes_total": PASSES,
        "config": {
            "clients": 3,
            "agg_layers": [{"layer": 1, "width": 16}],
            "privacy": settings,
            "encryption": "ckks",
            "secure_aggregation": "masks" if encoding == MASKED else "none",
            "encoding": encoding,
        },
        "privacy": privacy.report(releases=2),
    }


def noted(ledger: OwnerLedger, body: dict[str, Any]) -> None:
    """The worker's admission of ``body``: its session record and two releases."""
    sid = body["session_id"]
    privacy = admit_session(
        PrivacyPolicy(allow_shared_noise=True), body, session_id=sid, encrypted=True, ledger=ledger
    )
    assert privacy is not None
    ledger.note_session(sid, session_about(body, privacy))
    for index in range(2):
        ledger.record(session_id=sid, pass_index=index, noise_multiplier=privacy.noise_multiplier)


def test_the_compliance_report_says_who_could_read_a_share_masked_or_not(tmp_path: Path) -> None:
    with OwnerLedger.beside(tmp_path) as ledger:
        noted(ledger, session("masked", encoding=MASKED, split_noise=True))
        noted(ledger, session("ckks", encoding=CKKS, split_noise=False))
        snapshot = ledger.snapshot()
    assert snapshot.sessions["masked"]["encoding"] == MASKED
    content = organisation_content([snapshot], policy=OPEN, generated_at=0.0)
    by_id = {s["session_id"]: s for s in content["sessions"]}
    masked, ckks = by_id["masked"], by_id["ckks"]
    assert masked["shares"] == SHARES[MASKED]
    assert "no one, not even the service with one partner" in masked["shares"]
    assert ckks["shares"] == SHARES[CKKS]
    assert "the service with one partner" in ckks["shares"] and "could read" in ckks["shares"]
    # under split noise the masked session keeps a line per adversary, the service with a peer
    # at the peer's figure (the masks show them only the sum less that peer's share)
    lines = {a["key"]: a for a in masked["adversaries"]}
    assert list(lines) == ["service", "peer", "service_peer", "colluding", "group"]
    assert lines["service_peer"]["epsilon"] == pytest.approx(lines["peer"]["epsilon"])
    assert lines["colluding"]["epsilon"] > lines["peer"]["epsilon"]
    assert WHO["service_peer"] in lines["service_peer"]["sentence"]
    assert "service_peer" not in {a["key"] for a in ckks["adversaries"]}
    page = render_html(content)
    assert "who could read a share" in page
    assert "no one, not even the service with one partner" in page


def test_a_session_recorded_without_its_encoding_says_so_and_keeps_the_ledger_digest(
    tmp_path: Path,
) -> None:
    with OwnerLedger.beside(tmp_path) as ledger:
        noted(ledger, session("old", encoding=CKKS, split_noise=False))
        ledger._connection.execute("UPDATE sessions SET encoding = NULL")  # an older worker's
        snapshot = ledger.snapshot()
    assert "encoding" not in snapshot.sessions["old"]  # the digest an older ledger had
    content = organisation_content([snapshot], policy=OPEN, generated_at=0.0)
    assert content["sessions"][0]["shares"].startswith("not recorded")


@pytest.mark.parametrize(
    ("encoding", "holds"),
    [
        (MASKED, "any one partner, alone or with the service (split noise under masks)"),
        (CKKS, "any one partner on its own (split noise without masks)"),
    ],
)
def test_the_operator_s_report_of_a_split_session_says_against_whom_by_its_encoding(
    encoding: str, holds: str
) -> None:
    body = session("s1", encoding=encoding, split_noise=True)
    content = session_content(body, pass_kinds=["train"] * PASSES, generated_at=0.0)
    [one] = content["sessions"]
    assert one["shares"] == SHARES[encoding]
    assert content["total"]["holds_against"] == f"against {holds}"
    assert {a["key"] for a in content["adversaries"]} >= {"peer", "service_peer", "colluding"}


@pytest.mark.parametrize("split_noise", [False, True])
def test_a_masked_session_s_budget_names_no_ckks_ciphertexts(split_noise: bool) -> None:
    """The plan does not know the encoding: its notes hold for CKKS and masked shares alike."""
    text = describe(session("s1", encoding=MASKED, split_noise=split_noise)["privacy"])
    assert "the service alone: nothing to account (sees only ciphertexts" in text
    assert "CKKS" not in text
