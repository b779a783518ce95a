"""A worker's private sign session without HTTP (clients/sign_session.py): the service plans a
release session as one pass, the worker refuses a plan of more than one release and a pass
offered after it, and its one pass (models/private_sign.exchange_release) sends its block in
parts and keeps the others' blocks: the sum less what it sent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.policy import PolicyRefusal
from clients.session_fit import SessionMismatch
from clients.sign_session import check_done, check_one_release, check_release_session
from models.config import TrainConfig
from models.data.propagation import HopFeatures
from models.joint import JointAggregation
from models.private_sign import exchange_release, sign_privacy, sign_release_config
from secure.aggregation import PlainCodec
from secure.protocol import ProtocolViolation, ShareRequest, SharesSum
from secure.report import session_content
from secure.wire.node_lists import encode_nodes
from secure.wire.passes import PassInfo
from secure.wire.sessions import SessionCreate
from service.plan import SessionPlan

SIGN = TrainConfig(backbone="sign", encryption="none", epsilon=2.0, hops=2)


def release_session(**changes: object) -> SessionCreate:
    body = {
        "kind": "release", "clients": 3, "layers": 1, "agg_layers": [{"layer": 1, "width": 8}],
        "stale": 1, "rounds": 50, "eval_every": 10, "batch_size": 4, "fanout": 7,
        "num_nodes": 10, "train_nodes": encode_nodes(np.arange(4)),
        "eval_nodes": encode_nodes(np.arange(4, 10)), "seed": 0, "encryption": "none",
        "privacy": sign_release_config(SIGN).privacy_request()
        | {"noise_multiplier": sign_privacy(SIGN, clients=3).noise_multiplier},
    } | changes  # fmt: skip
    return SessionCreate.model_validate(body)


def test_the_service_plans_a_release_session_as_one_evaluation_pass() -> None:
    """Whatever its rounds: its training is local, so its z is calibrated for one release, as
    in process."""
    config = release_session()
    plan = SessionPlan.build("s", config)
    assert plan.passes_total == 1 and plan.passes[0].kind == "eval"
    planned = sign_privacy(SIGN, clients=3)
    assert plan.privacy is not None and plan.privacy.planned_releases == 1
    assert plan.privacy.sensitivity == pytest.approx(planned.sensitivity)
    training = SessionPlan.build("t", config.model_copy(update={"kind": "training"}))
    assert training.passes_total == 55  # the same settings as passes: 50 rounds, 5 evaluations
    with pytest.raises(ValueError, match="needs privacy"):
        release_session(privacy=None)


def test_a_plan_of_more_than_one_release_is_refused() -> None:
    one = sign_privacy(SIGN, clients=3)
    check_one_release({"passes_total": 1}, one)
    two = sign_release_config(SIGN).session_privacy(clients=3, passes_total=2)
    assert two is not None
    for session, privacy in (({"passes_total": 2}, two), ({"passes_total": 2}, one)):
        with pytest.raises(PolicyRefusal, match="plans 2 passes"):
            check_one_release(session, privacy)
    with pytest.raises(SessionMismatch, match="needs privacy"):
        check_release_session({"passes_total": 1}, None)
    assert check_release_session({"passes_total": 1}, one) is one  # keeping its model or not


def test_a_pass_offered_after_the_release_is_refused() -> None:
    check_done(PassInfo.model_validate({"pass": 1, "kind": "done", "round": None,
                                        "output_nodes": []}))  # fmt: skip
    second = PassInfo.model_validate({"pass": 1, "kind": "eval", "round": 0, "output_nodes": [0]})
    with pytest.raises(ProtocolViolation, match="releases this data once"):
        check_done(second)


def drive(steps, other: np.ndarray) -> tuple[HopFeatures, list[ShareRequest]]:
    """Answer each part with the sum of the sent part and ``other``'s rows."""
    codec, sent = PlainCodec(), []
    answer = None
    while True:
        try:
            request = steps.send(answer) if answer is not None else next(steps)
        except StopIteration as done:
            return done.value, sent
        sent.append(request)
        part = codec.decode_sum(request.payload, rows=request.rows, cols=request.cols)
        start = sum(r.rows for r in sent[:-1])
        total = part + other[start : start + request.rows]
        answer = SharesSum(payload=codec.encode(total), count=3)


def test_the_one_pass_sends_the_block_in_parts_and_keeps_the_sum_less_its_own() -> None:
    rows, width = 6, 2
    block = HopFeatures((torch.full((rows, width), 1.0), torch.full((rows, width), 2.0)))
    other = np.tile(np.array([[10.0, 10.0, 20.0, 20.0]], dtype=np.float32), (rows, 1))
    joint = JointAggregation(PlainCodec(), clients=3, part_values=8, device=torch.device("cpu"))
    steps = exchange_release(joint, block, rows=rows, width=width, hops=2, release="ab")
    received, sent = drive(steps, other)
    assert len(sent) == 3 and {r.parts for r in sent} == {3}  # 2 rows of 4 columns per part
    assert all(r.release == "ab" and not r.disclosure for r in sent)
    assert [float(h[0, 0]) for h in received.hops] == [0.0, 10.0, 20.0]
    # a party that releases nothing sends zeros, not a release (no digest, no gate)
    steps = exchange_release(joint, None, rows=rows, width=width, hops=2, release=None)
    received, sent = drive(steps, other)
    assert all(r.release is None and r.disclosure for r in sent)
    assert [float(h[-1, 1]) for h in received.hops] == [0.0, 10.0, 20.0]


def test_the_operators_report_counts_the_one_release_as_training() -> None:
    """The service's report (``secure.report``): a release session's one pass (an evaluation
    pass in the schedule) feeds training, as the owner's ledger records it."""
    release = {"pass_index": 0, "released_at": 0.0, "release": 1, "epsilon": 4.0}
    status = {
        "session_id": "s", "config": {"kind": "release"},
        "privacy": {"enabled": True, "delta": 1e-6, "ledger": [release]},
    }  # fmt: skip
    content = session_content(status, pass_kinds=["eval"], generated_at=0.0)
    assert content["sessions"][0]["by_kind"] == {"training": 1}
