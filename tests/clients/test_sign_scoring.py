"""Scoring a kept private sign model without HTTP (clients/sign_scoring.py, service/plan.py,
clients/policy.py): the service plans a scoring of a kept release (``model_kind`` 'release')
with no release and rows of the scored nodes only; a worker admits it for epsilon 0, even at its
lifetime cap, because its own model says so; and it refuses a session that asks for more (more
passes, a wider block, a second pass, shared predictions) or that names the wrong kind of
model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy, admit_session
from clients.session_fit import SessionMismatch, check_model_kind
from clients.sign_scoring import check_one_pass, check_scoring_session
from models.artefact import ModelError, SavedModel
from secure.protocol import ProtocolViolation
from secure.wire.passes import PassInfo
from secure.wire.sessions import SessionCreate
from service.plan import SessionPlan
from service.rounds.sums import _is_release
from tests.clients.test_sign_session import release_session

SCORED = np.array([3, 7, 8])


def kept_scoring(**changes: object) -> SessionCreate:
    """A scoring session of a release session's models over ``SCORED``."""
    released = release_session().model_dump()
    body = released | {
        "kind": "scoring", "model_kind": "release", "model_session": "t", "rounds": 1,
        "train_nodes": [], "eval_nodes": SCORED,
    } | changes  # fmt: skip
    return SessionCreate.model_validate(body)


def sign_model(*, width: int = 4, hops: int = 2) -> SavedModel:
    manifest = {"design": "private-sign", "sign_release": {"width": width, "hops": hops}}
    return SavedModel(manifest=manifest, weights={}, path=Path("models/insurer"))


def test_the_service_plans_a_scoring_of_a_kept_release_with_no_release() -> None:
    plan = SessionPlan.build("s", kept_scoring())
    assert plan.post_processing and plan.passes_total == 1
    assert plan.privacy is not None and plan.privacy.planned_releases == 0
    assert not _is_release(plan, plan.first_agg_layer)  # its sum appends no ledger row
    report = plan.privacy.report(releases=0)
    assert (report["epsilon"], report["epsilon_planned"]) == (0.0, 0.0)
    trained = SessionPlan.build("s", kept_scoring(model_kind="training"))
    assert trained.privacy is not None and trained.privacy.planned_releases == 1
    assert _is_release(trained, trained.first_agg_layer)


def test_model_kind_release_is_a_private_scoring_of_one_pass_over_all_its_nodes() -> None:
    for changes, said in (
        ({"kind": "training", "train_nodes": SCORED}, "scoring session's setting"),
        ({"privacy": None}, "needs privacy"),
        ({"scoring_pass": "sampled"}, "no sampled pass"),
        ({"online": True, "scoring_pass": "sampled"}, "no sampled pass"),
    ):
        with pytest.raises(ValueError, match=said):
            kept_scoring(**changes)
    assert kept_scoring(online=True).online  # its requests: one pass over the asked nodes


def admitted(session: SessionCreate, ledger: OwnerLedger | None, *, post_processing: bool):
    plan = SessionPlan.build("s", session)
    status = {"config": plan.config_view().model_dump(mode="json"), "passes_total": 1}
    policy = PrivacyPolicy(max_session_epsilon=100, max_lifetime_epsilon=1.0)
    return admit_session(
        policy, status, session_id="s", encrypted=False, ledger=ledger,
        post_processing=post_processing,
    )  # fmt: skip


def test_a_worker_admits_the_scoring_of_its_kept_release_for_nothing_even_at_its_cap(
    tmp_path: Path,
) -> None:
    with OwnerLedger(tmp_path / "ledger.sqlite3") as ledger:
        ledger.record(
            session_id="t", pass_index=0, layer=1, release_digest="d", mechanism="m",
            noise_multiplier=0.5, kind="training",
        )  # fmt: skip
        session = kept_scoring()
        privacy = admitted(session, ledger, post_processing=True)
        assert privacy is not None and privacy.epsilon_planned == 0.0
        # the same session to a worker whose model is not a kept release: a release at the cap
        with pytest.raises(PolicyRefusal):
            admitted(session.model_copy(update={"model_kind": "training"}), ledger,
                     post_processing=False)  # fmt: skip


def test_a_worker_refuses_a_scoring_that_asks_for_more_than_its_kept_release() -> None:
    model = sign_model(width=4, hops=2)
    view = SessionPlan.build("s", kept_scoring()).config_view()
    check_scoring_session(view, model, passes_total=1)  # 8 columns: the kept 4 x 2 hops
    with pytest.raises(SessionMismatch, match="2 passes"):
        check_scoring_session(view, model, passes_total=2)
    with pytest.raises(
        SessionMismatch, match="8 columns wide, the kept release gives one pass of 4"
    ):
        check_scoring_session(view, sign_model(width=2, hops=2), passes_total=1)
    shares = SessionPlan.build("s", kept_scoring(share_predictions="label-holder"))
    with pytest.raises(SessionMismatch, match="shares no predictions"):
        check_scoring_session(shares.config_view(), model, passes_total=1)


def test_a_second_pass_after_the_one_pass_is_refused() -> None:
    done = {"pass": 1, "kind": "done", "round": None, "output_nodes": []}
    check_one_pass(PassInfo.model_validate(done))
    second = PassInfo.model_validate({"pass": 1, "kind": "eval", "round": 0, "output_nodes": [0]})
    with pytest.raises(ProtocolViolation, match="releases nothing new"):
        check_one_pass(second)


def test_the_session_names_the_kind_of_the_worker_s_own_model() -> None:
    view = SessionPlan.build("s", kept_scoring()).config_view()
    check_model_kind(sign_model(), view)
    plain = SavedModel(manifest={}, weights={}, path=Path("models/bank"))
    with pytest.raises(ModelError, match="is not a private sign model"):
        check_model_kind(plain, view)  # would score with passes the service does not count
    passes = SessionPlan.build("s", kept_scoring(model_kind="training")).config_view()
    with pytest.raises(ModelError, match="is a private sign model"):
        check_model_kind(sign_model(), passes)
