"""GLASU Appendix B.2: one client holds the labels. The passive clients hold no label and no
split; the only label-derived value they receive is the gradient the holder broadcasts for the
top layer (wire layer L + 1), which equals autograd's on the joint model; they train by the
chain rule and the federation learns."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models.arrangement as arrangement
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layout import layout_federation
from models.release import PassContext
from models.trainer import train_inprocess
from secure.aggregation import PlainSumAggregator
from secure.protocol import ShareRequest, SharesSum

PLAIN = dict(encryption="none", dp=False, hidden=16, batch_size=16, label_holder=0)


class Recording(PlainSumAggregator):
    """Every sum (rows, values) as the clients receive it, in order."""

    def __init__(self) -> None:
        self.sums: list[tuple[int, np.ndarray]] = []

    def add(self, payloads, *, rows, cols):
        total = super().add(payloads, rows=rows, cols=cols)
        self.sums.append((rows, np.frombuffer(total, "<f4").reshape(rows, cols).copy()))
        return total


def test_passive_clients_hold_no_label_and_no_split(cora: GraphDataset) -> None:
    plan = layout_federation(TrainConfig(**PLAIN), cora)
    holder, *passive = plan.partitions
    assert (holder.labels == cora.labels).all() and holder.train_nodes.size
    for part in passive:
        assert (part.labels == -1).all()
        assert part.train_nodes.size == part.val_nodes.size == part.test_nodes.size == 0


def test_only_the_broadcast_gradient_depends_on_the_labels(cora: GraphDataset) -> None:
    """At the first pass (weights not yet trained), every sum but the gradient's is the same
    whatever the labels are."""
    torch.set_num_threads(1)
    received = []
    for labels in (cora.labels, torch.roll(cora.labels, 1)):
        data = cora.__class__(**{**cora.__dict__, "labels": labels})
        plan = layout_federation(TrainConfig(**PLAIN), data)
        clients = [GlasuClient(p, plan.client_config) for p in plan.partitions]
        recording = Recording()
        run_pass_inprocess(
            clients, recording, pass_index=0, kind="train", output_nodes=cora.train_nodes[:16]
        )
        received.append(recording.sums)
    (*features_a, gradient_a), (*features_b, gradient_b) = received
    assert len(features_a) == 2  # K = 2 aggregation layers, then the gradient (layer L + 1)
    for (_, a), (_, b) in zip(features_a, features_b, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(gradient_a[1], gradient_b[1])


def test_the_broadcast_gradient_is_autograd_on_the_joint_model(cora: GraphDataset) -> None:
    """K = L, Q = 1, no dropout. The holder broadcasts dLoss/dH[L] for the aggregate H[L]; a
    passive client's top-layer weights then get the joint model's gradient of the holder's loss
    times M (GLASU's coefficient 1 for its own share, notes/calibration.md). Lower layers differ
    by design: GLASU does not send gradients through the others' parts."""
    torch.set_num_threads(1)
    config = TrainConfig(agg_layers=4, stale=1, dropout=0.0, **PLAIN)
    plan = layout_federation(config, cora)
    clients = [GlasuClient(p, plan.client_config) for p in plan.partitions]
    recording = Recording()
    output = cora.train_nodes[:16]
    context = PassContext(pass_index=0, kind="train", output_nodes=output)
    with mock.patch.object(torch.optim.Adam, "step"):  # keep the weights the gradients are for
        run_pass_inprocess(clients, recording, pass_index=0, kind="train", output_nodes=output)
    rows, broadcast = recording.sums[-1]
    top = config.layers
    combine = arrangement.combine
    joint_inputs = {}
    for m, client in enumerate(clients):  # recompute each client's top layer, recording `own`
        batch = client.workset.next_batch()
        seen = {}

        def recording_combine(stale, own, *, count, presence=None, _seen=seen):
            _seen[own.shape[0]] = (stale, own)
            return combine(stale, own, count=count, presence=presence)

        with mock.patch.object(arrangement, "combine", recording_combine):
            step = client.arrangement.forward(context, batch, grad=True)
            with pytest.raises(StopIteration):  # every layer is in batch.others: no request
                next(step)
        joint_inputs[m] = (seen[rows], batch)
    m_passive = 1
    stale, own = joint_inputs[m_passive][0]
    aggregate = stale.detach() + own / len(clients)  # the true mean, as a function of client 1
    aggregate.retain_grad()
    holder = clients[0]
    labels = joint_inputs[0][1].labels
    loss = F.cross_entropy(holder.network.classify(aggregate, generator=holder.generator), labels)
    top_weights = list(clients[m_passive].network.convs[top - 1].parameters())
    joint = torch.autograd.grad(loss, [aggregate, *top_weights])
    np.testing.assert_allclose(broadcast / rows, joint[0].numpy(), atol=2.0**-12 / rows)
    for weight, expected in zip(top_weights, joint[1:], strict=True):
        np.testing.assert_allclose(
            weight.grad.numpy(), len(clients) * expected.numpy(), rtol=1e-2, atol=1e-5
        )


def test_a_broadcast_answer_must_not_hold_more_shares_than_clients(cora: GraphDataset) -> None:
    plan = layout_federation(TrainConfig(**PLAIN), cora)
    client = GlasuClient(plan.partitions[1], plan.client_config)
    step = client._broadcast_gradient(torch.zeros(4, 16), None, pass_index=0)
    request = next(step)
    assert isinstance(request, ShareRequest) and request.layer == 5
    with pytest.raises(ValueError, match="holds 4 shares, expected at most 3"):
        step.send(SharesSum(payload=request.payload, count=4))


@pytest.mark.slow  # three trainings of 60 rounds: ~40 s
def test_the_label_holders_federation_learns_beyond_the_holder_alone(cora: GraphDataset) -> None:
    settings = dict(PLAIN, hidden=64, rounds=60, eval_every=20)
    federation = train_inprocess(TrainConfig(**settings), dataset=cora, progress=False)
    alone = train_inprocess(
        TrainConfig(mode="standalone", **settings), dataset=cora, progress=False
    )
    majority = float(np.bincount(cora.labels[cora.test_nodes].numpy()).max()) / len(cora.test_nodes)
    assert federation.test_accuracy > majority + 0.3
    assert federation.test_accuracy > alone.test_accuracy
