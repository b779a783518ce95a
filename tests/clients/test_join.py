"""What a worker decides when it joins a session, without a service: a scoring session needs no
labels (new customers have none) where a training session refuses unlabelled nodes; the answer
reaches a worker asked for predictions only where it is the answering party or the session
shares the answer; the answering party's owner must agree to share it; and a refusal is told to
the service of a session with the join gate before it goes on up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from clients.join import admit_prediction_sharing, disclosure_counter, refusal_reported
from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy
from clients.session_fit import SessionMismatch, check_answer_reaches, session_partition
from models.config import TrainConfig
from models.layout import layout_federation
from secure.protocol import ShareRequest


def _session(**settings: Any) -> Any:
    """The few settings of a session these decisions read (``SessionConfigView``'s names)."""
    defaults = {"kind": "scoring", "label_holder": None, "nodes": "intersection",
                "share_predictions": "none", "ready_gate": True}  # fmt: skip
    return SimpleNamespace(**{**defaults, **settings})


def test_a_scoring_session_needs_no_labels_and_a_training_session_does(cora) -> None:
    part = layout_federation(TrainConfig(clients=2), cora).partitions[0]
    unlabelled = dataclasses.replace(part, labels=torch.full_like(part.labels, -1))
    assert session_partition(unlabelled, _session()) is unlabelled
    with pytest.raises(SessionMismatch, match="has no label for"):
        session_partition(unlabelled, _session(kind="training"))


def test_predictions_reach_the_answering_party_and_partners_only_where_shared() -> None:
    check_answer_reaches(_session(), client=0)  # no label holder: party 0 answers
    check_answer_reaches(_session(label_holder=2), client=2)
    with pytest.raises(SessionMismatch, match=r"party 2's .* shares it with no partner"):
        check_answer_reaches(_session(label_holder=2), client=0)
    check_answer_reaches(_session(label_holder=2, share_predictions="label-holder"), client=0)
    with pytest.raises(SessionMismatch, match="scoring session"):
        check_answer_reaches(_session(kind="training"), client=0)


def test_the_answering_party_shares_its_predictions_only_with_its_owner_s_agreement() -> None:
    shared = _session(label_holder=1, share_predictions="label-holder")
    with pytest.raises(PolicyRefusal, match="has not agreed"):
        admit_prediction_sharing(PrivacyPolicy(), shared, client=1)
    admit_prediction_sharing(PrivacyPolicy(share_predictions=True), shared, client=1)
    admit_prediction_sharing(PrivacyPolicy(), shared, client=0)  # a partner only receives
    admit_prediction_sharing(PrivacyPolicy(), _session(label_holder=1), client=1)


class _Service:
    def __init__(self) -> None:
        self.refusals: list[str] = []

    def refuse(self, reason: str) -> None:
        self.refusals.append(reason)


@pytest.mark.parametrize("gated", [True, False])
def test_a_refusal_is_told_to_a_gated_session_and_goes_on_up(gated: bool) -> None:
    service = _Service()
    with pytest.raises(SessionMismatch), refusal_reported(service, _session(ready_gate=gated)):  # type: ignore[arg-type]
        raise SessionMismatch("this worker's data has no label for 3 nodes")
    assert service.refusals == (["this worker's data has no label for 3 nodes"] if gated else [])
    with pytest.raises(RuntimeError), refusal_reported(service, _session()):  # type: ignore[arg-type]
        raise RuntimeError("not a refusal: a bug")
    assert len(service.refusals) == int(gated)


def test_the_shared_answer_is_counted_in_the_answering_owner_s_ledger(tmp_path: Path) -> None:
    shared = _session(label_holder=1, share_predictions="label-holder")
    part = ShareRequest(layer=2, payload=b"", rows=40, cols=16, disclosure=True)
    with OwnerLedger(tmp_path / "ledger.sqlite3") as ledger:
        assert disclosure_counter(ledger, shared, client=0, session_id="s") is None  # a partner
        assert (
            disclosure_counter(ledger, _session(label_holder=1), client=1, session_id="s") is None
        )
        count = disclosure_counter(ledger, shared, client=1, session_id="s")
        assert count is not None
        count(part)
        count(part)
        assert ledger.predictions_shared("s") == 80 and ledger.predictions_shared("t") == 0
        assert ledger.releases(session_id="s") == 0  # not a noisy release: no epsilon
