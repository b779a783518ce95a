"""One organisation, several workers, one ledger (``clients/owner_ledger.py``): a training and
a scoring of the same organisation (on two copies of its data) may write its ledger at the same
time. No release may slip past the lifetime cap between another's budget check and its row."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from clients.owner_ledger import OwnerLedger
from clients.pass_driver import admit_release
from clients.policy import BudgetSpent, PrivacyPolicy, ReleaseGate
from secure.privacy import SessionPrivacy
from secure.protocol import ShareRequest
from secure.release_noise import ReleaseMechanism

PASSES = 40


def plan() -> SessionPrivacy:
    return SessionPrivacy.plan(
        epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1, clients=3, passes_total=PASSES,
        encrypted=True,
    )  # fmt: skip


def share(release: str) -> ShareRequest:
    return ShareRequest(layer=1, payload=b"", rows=1, cols=1, release=release)


def cap_for(releases: int, privacy: SessionPrivacy) -> PrivacyPolicy:
    """A policy whose lifetime cap leaves room for exactly ``releases`` releases."""
    step = 1.0 / privacy.ledger_noise_multiplier**2
    low = PrivacyPolicy().epsilon_of(releases * step)
    high = PrivacyPolicy().epsilon_of((releases + 1) * step)
    return PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=(low + high) / 2)


def test_no_worker_spends_between_another_workers_check_and_its_row(tmp_path: Path) -> None:
    """The scoring worker tries its release at the worst moment: after the training worker's
    budget check, before its row. With room for one release, exactly one is recorded."""
    path = tmp_path / "bank.sqlite3"
    privacy = plan()
    policy = cap_for(1, privacy)
    training, scoring = OwnerLedger(path), OwnerLedger(path)
    scoring._connection.execute("PRAGMA busy_timeout = 200")  # it cannot get in: fail fast
    mechanism = ReleaseMechanism.of(privacy, width=1, encoding="ckks")
    training_gate = ReleaseGate(policy, privacy, training, "training", mechanism)
    scoring_gate = ReleaseGate(policy, privacy, scoring, "scoring", mechanism, scoring=True)
    blocked: list[str] = []
    record = training.record

    def record_after_the_other_tried(**row: object) -> bool:
        try:
            admit_release(scoring_gate, 0, share("b" * 64))
        except sqlite3.OperationalError as exc:  # the training worker holds the ledger
            blocked.append(str(exc))
        return record(**row)

    training.record = record_after_the_other_tried  # type: ignore[method-assign]
    admit_release(training_gate, 0, share("a" * 64))
    assert training.releases() == 1, "a second release slipped past the lifetime cap"
    assert blocked and "locked" in blocked[0]
    with pytest.raises(BudgetSpent, match="lifetime"):  # once the row is in, the cap holds
        admit_release(scoring_gate, 0, share("b" * 64))
    assert scoring.releases() == 1
    training.close()
    scoring.close()


def test_the_default_ledger_is_the_organisations_whichever_copy(tmp_path: Path) -> None:
    from clients.owner_ledger import ledger_location

    for copy in ("prepared", "current"):
        (tmp_path / copy / "bank").mkdir(parents=True)
        (tmp_path / copy / "bank" / "meta.json").write_text(json.dumps({"organisation": "bank"}))
    first = ledger_location(tmp_path / "prepared" / "bank")
    assert first == ledger_location(tmp_path / "current" / "bank")
    assert first.name == "bank.sqlite3" and first.parent.name == "ledgers"
    chosen = tmp_path / "vault" / "bank.db"
    assert ledger_location(tmp_path / "current" / "bank", ledger=chosen) == chosen
