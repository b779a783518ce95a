"""Scoring a kept private sign model without HTTP (clients/sign_scoring.py, service/plan.py,
clients/policy.py): the service plans a scoring of a kept release (``model_kind`` 'release')
with no release and rows of the scored nodes only; a worker admits it for epsilon 0, even at its
lifetime cap, because its own model says so; it refuses a session that asks for more (more
passes, a wider block, a second pass) or that names the wrong kind of model; and where the
session shares the answer, a partner receives the answering party's through the same answer
exchange as every design (models/answer.py), after the one block pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy, admit_session
from clients.session_fit import SessionMismatch, check_model_kind, shared_answer_width
from clients.sign_scoring import KeptSignScorer, check_one_pass, check_scoring_session
from models.answer import Answer, encode_answer
from models.artefact import ModelError, SavedModel
from models.backbone import ModelConfig
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.outcome import PassOutcome
from secure.aggregation import PlainCodec
from secure.protocol import ProtocolViolation, ShareRequest, SharesSum
from secure.wire.passes import PassInfo
from secure.wire.sessions import SessionConfigView, SessionCreate
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


def partner(session: SessionConfigView) -> KeptSignScorer:
    """Client 1 of ``session``, a partner that released nothing (its block rows are zeros)."""
    n = 10
    partition = ClientPartition(
        client=1, clients=3, dataset="toy", feature_columns=np.arange(2),
        features=torch.zeros(n, 2), edge_index=torch.zeros(2, 0, dtype=torch.long),
        labels=torch.zeros(n, dtype=torch.long), train_nodes=np.arange(n),
        val_nodes=np.arange(n), test_nodes=np.arange(n),
    )  # fmt: skip
    config = ClientConfig(
        model=ModelConfig(backbone="sign", layers=1, hops=2), agg_layers=(1,),
        shared_answer_width=shared_answer_width(session.model_dump(mode="json")),
    )  # fmt: skip
    return KeptSignScorer(
        partition, config, session, sign_model(), PlainCodec(), own_ids=np.arange(n)
    )


def drive_sums(steps, added: dict[int, np.ndarray]) -> tuple[PassOutcome, list[ShareRequest]]:
    """Answer each part of wire layer ``layer`` with the sum of the sent part and the rows of
    ``added[layer]`` (what the others sent)."""
    codec, sent, answer = PlainCodec(), [], None
    while True:
        try:
            request = steps.send(answer) if answer is not None else next(steps)
        except StopIteration as done:
            return done.value, sent
        sent.append(request)
        part = codec.decode_sum(request.payload, rows=request.rows, cols=request.cols)
        start = sum(r.rows for r in sent[:-1] if r.layer == request.layer)
        total = part + added[request.layer][start : start + request.rows]
        answer = SharesSum(payload=codec.encode(total), count=3)


def test_a_partner_receives_the_answer_of_a_scoring_that_shares_it() -> None:
    """After the one block pass, the answer exchange at layer L + 1: the partner adds zeros,
    marked as the answer (what the answering party's worker counts before its parts leave),
    and gets the answering party's answer, with nothing at that layer counted as a release."""
    plan = SessionPlan.build("s", kept_scoring(share_predictions="label-holder"))
    view = plan.config_view()
    check_scoring_session(view, sign_model(), passes_total=1)
    assert plan.answer_layer == view.layers + 1 and plan.last_layer(0) == plan.answer_layer
    assert not _is_release(plan, plan.answer_layer)
    scorer = partner(view)
    assert not scorer.receives and scorer.kept is None
    probabilities = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.25, 0.5, 0.25]])
    answering = encode_answer(Answer.of(probabilities), rows=len(SCORED), width=8)
    added = {1: np.ones((len(SCORED), 8), dtype=np.float32), plan.answer_layer: answering}
    info = PassInfo.model_validate({"pass": 0, "kind": "eval", "round": 0,
                                    "output_nodes": SCORED.tolist()})  # fmt: skip
    outcome, sent = drive_sums(scorer._pass(SCORED, info), added)
    assert [r.layer for r in sent] == [1, plan.answer_layer]
    block, shared = sent
    assert block.release is None and shared.release is None  # no release: post-processing
    assert shared.disclosure and shared.rows == len(SCORED)
    assert not PlainCodec().decode_sum(shared.payload, rows=3, cols=8).any()  # its zeros
    assert outcome.answer is not None
    np.testing.assert_allclose(outcome.answer.probabilities, probabilities, atol=2**-12)
    assert outcome.answer.predicted.tolist() == [0, 2, 1]
