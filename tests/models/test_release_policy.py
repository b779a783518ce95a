"""A client's release policy (models/release.py) is one object the joint aggregation is built
with: it sees each whole share once, with the pass it belongs to and the node ids of its rows,
makes every part that is sent, gives the digest all parts carry and the fewest shares a sum may
hold; another policy is another class, passed to the client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.config import TrainConfig
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.joint import JointAggregation
from models.layout import layout_federation
from models.release import PassContext, Release, ReleasePolicy, ReleaseScope
from secure.aggregation import PlainCodec, PlainSumAggregator
from secure.protocol import ProtocolViolation, ShareRequest, SharesSum


class Shifted(Release):
    digest = "shifted"

    def part(self, index: int, clean: np.ndarray) -> np.ndarray:
        return clean + 1.0


class Recording(ReleasePolicy):
    """Sends every share shifted by 1, noting what it was asked to release."""

    def __init__(self, fewest: int = 1) -> None:
        self.scopes: list[ReleaseScope] = []
        self.fewest = fewest

    def begin(self, scope: ReleaseScope, clean: np.ndarray) -> Release:
        self.scopes.append(scope)
        return Shifted()

    def fewest_shares(self, clients: int) -> int:
        return self.fewest

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:  # type: ignore[no-untyped-def]
        pass


def test_every_part_is_what_the_policy_makes_and_carries_its_digest() -> None:
    policy = Recording(fewest=3)
    joint = JointAggregation(
        PlainCodec(), policy, clients=3, part_values=4, device=torch.device("cpu")
    )
    context = PassContext(pass_index=7, kind="train", output_nodes=np.array([4, 9]))
    own = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    step = joint.aggregate(context, 2, own, rows=np.array([4, 7, 9]))
    request = next(step)
    for part in range(2):  # 4 values per part: rows 0-1, then row 2
        assert isinstance(request, ShareRequest) and request.release == "shifted"
        sent = np.frombuffer(request.payload, "<f4").reshape(request.rows, request.cols)
        np.testing.assert_array_equal(sent, own.numpy()[2 * part : 2 * part + 2] + 1.0)
        try:
            total = PlainSumAggregator().add([request.payload] * 3, rows=len(sent), cols=2)
            request = step.send(SharesSum(payload=total, count=3))
        except StopIteration as done:
            assert part == 1
            # the sum held three copies of what was sent: the others' part is 2/3 of it
            np.testing.assert_allclose(done.value.others.numpy(), (own.numpy() + 1) * 2 / 3)
    [scope] = policy.scopes  # one release in all its parts
    assert (scope.context, scope.layer, scope.part_rows) == (context, 2, 2)
    np.testing.assert_array_equal(scope.rows, [4, 7, 9])
    step = joint.aggregate(context, 2, own, rows=np.array([4, 7, 9]))
    request = next(step)
    with pytest.raises(ProtocolViolation, match="at least 3"):  # the policy's fewest
        step.send(SharesSum(payload=request.payload, count=2))


def test_a_client_hands_its_policy_the_pass_and_the_rows_of_each_share(cora) -> None:
    plan = layout_federation(
        TrainConfig(rounds=2, eval_every=1, hidden=16, batch_size=8, encryption="none", dp=False),
        cora,
    )
    policies = [Recording() for _ in plan.partitions]
    clients = [
        GlasuClient(p, plan.client_config, release=policy)
        for p, policy in zip(plan.partitions, policies, strict=True)
    ]
    output = cora.train_nodes[:8]
    run_pass_inprocess(
        clients, PlainSumAggregator(), pass_index=5, kind="train", output_nodes=output
    )
    for policy in policies:
        assert [s.layer for s in policy.scopes] == list(plan.client_config.agg_layers)
        for scope in policy.scopes:
            assert scope.context.pass_index == 5 and scope.context.kind == "train"
            np.testing.assert_array_equal(scope.context.output_nodes, output)
        # the top aggregation layer's rows are its targets: the union the clients agreed
        assert np.isin(output, policy.scopes[-1].rows).all()
    tops = [p.scopes[-1].rows for p in policies]
    assert all(np.array_equal(tops[0], rows) for rows in tops)
    n = cora.num_nodes
    run_pass_inprocess(
        clients, PlainSumAggregator(), pass_index=6, kind="eval", output_nodes=np.arange(n)
    )
    last = policies[0].scopes[-1]
    assert last.context.kind == "eval" and np.array_equal(last.rows, np.arange(n))
