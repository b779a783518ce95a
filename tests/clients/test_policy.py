"""The data owner's privacy policy and its ledger (clients/policy.py, clients/owner_ledger.py)."""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger, SessionAbout
from clients.policy import (
    BudgetSpent,
    PolicyRefusal,
    PrivacyPolicy,
    ReleaseGate,
    admit_session,
    admit_session_id,
)
from secure.accounting import epsilon_after
from secure.privacy import SessionPrivacy
from secure.release_noise import ReleaseMechanism

PASSES = 40


def session(**privacy_overrides: Any) -> dict[str, Any]:
    """``GET /v1/sessions/{id}`` of a private session, as the service plans it."""
    settings: dict[str, Any] = dict(epsilon=4.0, delta=1e-6, clip=1.0, occurrence_cap=1)
    settings.update(privacy_overrides)
    planned = SessionPrivacy.plan(**settings, clients=3, passes_total=PASSES, encrypted=True)
    return {
        "session_id": "s1",
        "passes_total": PASSES,
        "config": {
            "clients": 3,
            "agg_layers": [{"layer": 1, "width": 16}],
            "privacy": {
                k: v for k, v in planned.settings().items() if k != "noise_multiplier_source"
            },
        },
        "privacy": planned.report(releases=0),
    }


def gate_of(
    policy: PrivacyPolicy, privacy: SessionPrivacy, ledger: OwnerLedger, session_id: str
) -> ReleaseGate:
    mechanism = ReleaseMechanism.of(privacy, width=16, encoding="ckks")
    return ReleaseGate(policy, privacy, ledger, session_id, mechanism)


@pytest.fixture
def ledger(tmp_path: Path) -> OwnerLedger:
    with OwnerLedger.beside(tmp_path) as opened:
        yield opened


def test_a_session_within_the_policy_is_admitted(ledger: OwnerLedger) -> None:
    privacy = admit_session(
        PrivacyPolicy(), session(), session_id="s1", encrypted=True, ledger=ledger
    )
    assert privacy is not None and privacy.epsilon_planned <= 4.0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda s: s["config"].update(privacy=None), "no differential privacy"),
        (lambda s: s["config"].update(agg_layers=[{"layer": 2, "width": 16}]), "layers"),
        (lambda s: s["config"]["privacy"].update(noise_multiplier=5.0), "differs"),
        (lambda s: s["privacy"].update(sensitivity=0.01), "sensitivity"),
        (lambda s: s["config"]["privacy"].update(sensitivity=0.01), "not usable"),
    ],
)
def test_a_session_that_is_not_what_it_claims_is_refused(
    ledger: OwnerLedger, change: Any, says: str
) -> None:
    bad = session()
    change(bad)
    with pytest.raises(PolicyRefusal, match=says):
        admit_session(PrivacyPolicy(), bad, session_id="s1", encrypted=True, ledger=ledger)


def test_smaller_noise_or_a_larger_budget_than_the_policy_is_refused(ledger: OwnerLedger) -> None:
    honest_but_greedy = session(epsilon=8.0)
    with pytest.raises(PolicyRefusal, match="allows 4 per session"):
        admit_session(
            PrivacyPolicy(), honest_but_greedy, session_id="s1", encrypted=True, ledger=ledger
        )
    small_z = session(epsilon=None, noise_multiplier=2.0)
    with pytest.raises(PolicyRefusal, match="per session"):
        admit_session(PrivacyPolicy(), small_z, session_id="s1", encrypted=True, ledger=ledger)
    assert admit_session(
        PrivacyPolicy(max_session_epsilon=8.0),
        honest_but_greedy,
        session_id="s1",
        encrypted=True,
        ledger=ledger,
    )


def test_shared_noise_needs_the_owner_s_consent(ledger: OwnerLedger) -> None:
    shared = session(shared_noise=True)
    with pytest.raises(PolicyRefusal, match="shared noise"):
        admit_session(PrivacyPolicy(), shared, session_id="s1", encrypted=True, ledger=ledger)
    assert admit_session(
        PrivacyPolicy(allow_shared_noise=True),
        shared,
        session_id="s1",
        encrypted=True,
        ledger=ledger,
    )


def test_no_dp_only_when_the_owner_says_so(ledger: OwnerLedger) -> None:
    plain = session()
    plain["config"]["privacy"] = None
    assert (
        admit_session(
            PrivacyPolicy(require_dp=False), plain, session_id="s1", encrypted=True, ledger=None
        )
        is None
    )


def test_sessions_compose_in_the_local_ledger_until_the_lifetime_budget(
    ledger: OwnerLedger,
) -> None:
    policy = PrivacyPolicy(max_session_epsilon=4.0, max_lifetime_epsilon=5.0)
    first = admit_session(policy, session(), session_id="s1", encrypted=True, ledger=ledger)
    assert first is not None
    gate = gate_of(policy, first, ledger, "s1")
    for pass_index in range(PASSES):
        gate.admit(pass_index, release=f"r{pass_index}")
    assert ledger.releases() == PASSES
    spent = ledger.epsilon(delta=1e-6, accountant="rdp")
    same = epsilon_after(
        noise_multiplier=first.ledger_noise_multiplier, releases=PASSES, delta=1e-6
    )
    assert spent == pytest.approx(same, rel=1e-9) and spent <= 4.0
    # a second session on the same data starts where the first ended: two sessions of epsilon 4
    # compose to about 5.9 (Gaussian releases compose sub-additively), over the lifetime 5
    with pytest.raises(PolicyRefusal, match="lifetime"):
        admit_session(policy, session(), session_id="s2", encrypted=True, ledger=ledger)
    # a smaller one fits; its releases stop at the lifetime budget, recorded before they leave
    second = admit_session(
        policy, session(epsilon=1.0), session_id="s2", encrypted=True, ledger=ledger
    )
    assert second is not None
    # (together they would spend about 4.17; a lifetime budget of 4.1 stops it partway)
    gate = gate_of(PrivacyPolicy(max_lifetime_epsilon=4.1), second, ledger, "s2")
    with pytest.raises(BudgetSpent, match="lifetime"):
        for pass_index in range(PASSES):
            gate.admit(pass_index, release=f"r{pass_index}")
    assert 0 < ledger.releases(session_id="s2") < PASSES
    assert ledger.epsilon(delta=1e-6, accountant="rdp") <= 4.1
    assert [s.session_id for s in ledger.sessions()] == ["s1", "s2"]


def test_the_ledger_is_durable_and_composes_different_noise(tmp_path: Path) -> None:
    with OwnerLedger.beside(tmp_path) as ledger:
        ledger.record(session_id="a", pass_index=0, noise_multiplier=3.0)
        ledger.record(session_id="b", pass_index=0, noise_multiplier=4.0)
    with OwnerLedger.beside(tmp_path) as reopened:
        assert reopened.releases() == 2
        z = 1 / math.sqrt(1 / 9 + 1 / 16)  # = 2.4: two Gaussians compose to one
        assert reopened.epsilon(delta=1e-5, accountant="rdp") == pytest.approx(
            epsilon_after(noise_multiplier=z, releases=1, delta=1e-5)
        )
        with pytest.raises(ValueError):
            reopened.record(session_id="c", pass_index=0, noise_multiplier=0.0)


def test_a_resumed_session_counts_its_own_rows_once_in_the_lifetime_check(
    ledger: OwnerLedger,
) -> None:
    """`glasu train` gives its workers lifetime cap = session cap: a worker restarted halfway
    through its session is admitted again (its rows are part of the plan, not on top of it)."""
    policy = PrivacyPolicy(max_session_epsilon=4.0, max_lifetime_epsilon=4.0)
    privacy = admit_session(policy, session(), session_id="s1", encrypted=True, ledger=ledger)
    assert privacy is not None
    gate = gate_of(policy, privacy, ledger, "s1")
    for pass_index in range(PASSES // 2):
        gate.admit(pass_index, release=f"r{pass_index}")
    assert admit_session(policy, session(), session_id="s1", encrypted=True, ledger=ledger)
    # another session on the same data is still refused: the first one's rows count in full
    with pytest.raises(PolicyRefusal, match="lifetime"):
        admit_session(policy, session(), session_id="s2", encrypted=True, ledger=ledger)


def test_shared_noise_over_a_union_alignment_is_refused(ledger: OwnerLedger) -> None:
    union = session(shared_noise=True)
    union["config"]["nodes"] = "union"
    with pytest.raises(PolicyRefusal, match="union"):
        admit_session(
            PrivacyPolicy(allow_shared_noise=True),
            union,
            session_id="s1",
            encrypted=True,
            ledger=ledger,
        )


def test_the_gate_counts_each_distinct_release_and_an_identical_one_once(
    ledger: OwnerLedger,
) -> None:
    policy = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
    privacy = admit_session(policy, session(), session_id="s1", encrypted=True, ledger=ledger)
    assert privacy is not None
    gate = gate_of(policy, privacy, ledger, "s1")
    assert gate.admit(3, release="aa") is True
    assert gate.admit(3, release="aa") is False  # the identical release again: one row
    assert gate.admit(3, release="bb") is True  # pass 3 with other inputs: another release
    assert ledger.releases(session_id="s1") == 2
    assert not ledger.record(
        session_id="s1",
        pass_index=3,
        layer=1,
        release_digest="aa",
        mechanism=gate.mechanism.digest,
        noise_multiplier=2.0,
    )  # a unique constraint, not a convention
    assert ledger.releases(session_id="s1") == 2


def test_the_ledger_is_private_and_keeps_one_noise_secret(tmp_path: Path) -> None:
    with OwnerLedger.beside(tmp_path) as ledger:
        secret = ledger.noise_secret()
    with OwnerLedger.beside(tmp_path) as reopened:
        assert reopened.noise_secret().to_bytes() == secret.to_bytes()
        assert "hidden" in repr(secret)
    assert (tmp_path / LEDGER_FILENAME).stat().st_mode & 0o777 == 0o600


def test_shared_noise_with_stragglers_continue_is_refused(ledger: OwnerLedger) -> None:
    """A pass that goes on without a client sums fewer shares than M: with shared noise, less
    noise than accounted. The worker's own policy refuses it (not only the service)."""
    going_on = session(shared_noise=True)
    going_on["config"]["stragglers"] = "continue"
    with pytest.raises(PolicyRefusal, match="stragglers 'continue'"):
        admit_session(
            PrivacyPolicy(allow_shared_noise=True),
            going_on,
            session_id="s1",
            encrypted=True,
            ledger=ledger,
        )
    waiting = session(shared_noise=True)
    waiting["config"]["stragglers"] = "wait"
    assert admit_session(
        PrivacyPolicy(allow_shared_noise=True),
        waiting,
        session_id="s1",
        encrypted=True,
        ledger=ledger,
    )


def admitted(ledger: OwnerLedger, **privacy_overrides: Any) -> ReleaseGate:
    policy = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
    privacy = admit_session(
        policy, session(**privacy_overrides), session_id="s1", encrypted=True, ledger=ledger
    )
    assert privacy is not None
    return gate_of(policy, privacy, ledger, "s1")


def test_only_a_byte_identical_upload_is_already_recorded(ledger: OwnerLedger) -> None:
    """The same release digest under another mechanism (z x 2) is another release: its own row,
    counted before it leaves, not "already recorded"."""
    gate = admitted(ledger, epsilon=None, noise_multiplier=2.0)
    doubled = admitted(ledger, epsilon=None, noise_multiplier=4.0)
    assert gate.admit(0, release="aa") is True
    assert gate.admit(0, release="aa") is False
    assert doubled.admit(0, release="aa") is True
    assert ledger.releases(session_id="s1") == 2
    assert ledger.inverse_square_sum(session_id="s1") == pytest.approx(1 / 4 + 1 / 16)
    assert ledger.recorded(
        session_id="s1", pass_index=0, layer=1, release_digest="aa", mechanism=gate.mechanism.digest
    )
    assert not ledger.recorded(
        session_id="s1", pass_index=0, layer=1, release_digest="aa", mechanism="another"
    )
    kept = {row["mechanism"] for row in ledger.snapshot().releases}
    assert kept == {gate.mechanism.digest, doubled.mechanism.digest}


def test_a_session_id_that_released_comes_back_only_with_its_checkpoint(
    ledger: OwnerLedger, tmp_path: Path
) -> None:
    gate = admitted(ledger)
    mechanism = gate.mechanism
    # nothing released yet: a worker may start (again) without a checkpoint
    admit_session_id(ledger, session_id="s1", mechanism=mechanism, checkpoint=None)
    ledger.note_session("s1", SessionAbout(), mechanism=mechanism.canonical())
    gate.admit(0, release="aa")
    with pytest.raises(PolicyRefusal, match=r"already released this data 1 times.*checkpoint"):
        admit_session_id(ledger, session_id="s1", mechanism=mechanism, checkpoint=None)
    admit_session_id(ledger, session_id="s1", mechanism=mechanism, checkpoint=tmp_path / "s1.pt")
    # another session id is another session
    admit_session_id(ledger, session_id="s2", mechanism=mechanism, checkpoint=None)


def test_a_session_id_is_refused_with_another_mechanism_even_with_a_checkpoint(
    ledger: OwnerLedger, tmp_path: Path
) -> None:
    gate = admitted(ledger)
    ledger.note_session("s1", SessionAbout(), mechanism=gate.mechanism.canonical())
    doubled = dataclasses.replace(
        gate.mechanism, noise_multiplier=2 * gate.mechanism.noise_multiplier
    )
    for checkpoint in (None, tmp_path / "s1.pt"):
        with pytest.raises(PolicyRefusal, match=r"another release mechanism.*noise_multiplier"):
            admit_session_id(ledger, session_id="s1", mechanism=doubled, checkpoint=checkpoint)
    # the session's record keeps its first mechanism
    ledger.note_session("s1", SessionAbout(), mechanism=doubled.canonical())
    assert ledger.session_mechanism("s1") == gate.mechanism.canonical()


OLD_LEDGER = """
CREATE TABLE releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, pass_index INTEGER NOT NULL,
    noise_multiplier REAL NOT NULL CHECK (noise_multiplier > 0), released_at REAL NOT NULL,
    layer INTEGER, release_digest TEXT, kind TEXT
);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, label TEXT, partners TEXT, operator TEXT, kind TEXT,
    created_at REAL, admitted_at REAL NOT NULL, clients INTEGER, adversaries TEXT,
    test_accuracy REAL, reference_test_accuracy REAL
);
CREATE TABLE noise_secret (id INTEGER PRIMARY KEY CHECK (id = 1), secret BLOB NOT NULL);
CREATE UNIQUE INDEX one_row_per_release ON releases (session_id, pass_index, layer, release_digest);
INSERT INTO releases (session_id, pass_index, noise_multiplier, released_at, layer, release_digest,
    kind) VALUES ('old', 0, 2.0, 1.0, 1, 'aa', 'training'),
    ('old', 1, 2.0, 2.0, 1, 'bb', 'training');
INSERT INTO sessions (session_id, admitted_at, clients) VALUES ('old', 0.5, 3);
"""


def test_a_ledger_of_the_earlier_schema_opens_reads_and_never_matches_a_new_release(
    tmp_path: Path,
) -> None:
    connection = sqlite3.connect(tmp_path / LEDGER_FILENAME)
    connection.executescript(OLD_LEDGER)
    connection.close()
    with OwnerLedger.beside(tmp_path) as ledger:
        assert ledger.releases() == 2
        assert ledger.inverse_square_sum() == pytest.approx(0.5)
        snapshot = ledger.snapshot()
        assert [r["mechanism"] for r in snapshot.releases] == [None, None]
        assert snapshot.sessions["old"]["mechanism"] is None
        assert ledger.session_mechanism("old") is None
        # the old rows count, but a new release with the same digest is not "already recorded"
        assert not ledger.recorded(
            session_id="old", pass_index=0, layer=1, release_digest="aa", mechanism="m"
        )
        assert ledger.record(
            session_id="old",
            pass_index=0,
            layer=1,
            release_digest="aa",
            mechanism="m",
            noise_multiplier=2.0,
        )
        assert not ledger.record(
            session_id="old",
            pass_index=0,
            layer=1,
            release_digest="aa",
            mechanism="m",
            noise_multiplier=2.0,
        )
        assert ledger.releases(session_id="old") == 3
        ledger.note_session("old", SessionAbout(), mechanism="{}")
        assert ledger.session_mechanism("old") == "{}"  # an old record gains the mechanism
