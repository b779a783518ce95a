"""Partly shared nodes (the union of the parties' nodes, Feras's count-aware mean): each client
sends zero rows for the nodes it lacks and a presence column; the sum's last column counts each
row's holders, and every client's view of the aggregate is the exact mean over the holders."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layout import layout_federation
from models.release import PassContext
from models.workset import combine
from secure.aggregation import PlainCodec, PlainSumAggregator
from secure.ckks import CkksCodec, CkksSumAggregator, generate_keys
from secure.protocol import SharesSum

PLAIN = dict(encryption="none", dp=False, rounds=4, eval_every=2, hidden=16, batch_size=16)


def hide_nodes(parts, *, fraction: float, seed: int):
    """Each client lacks a random ``fraction`` of the nodes: zero features, no edges there."""
    rng = np.random.default_rng(seed)
    hidden = []
    for part in parts:
        held = rng.random(part.num_nodes) >= fraction
        src, dst = part.edge_index.numpy()
        keep = held[src] & held[dst]
        features = part.features * torch.from_numpy(held).unsqueeze(1).float()
        hidden.append(
            dataclasses.replace(
                part, features=features, edge_index=part.edge_index[:, keep], held=held
            )
        )
    return hidden


@pytest.fixture(scope="module")
def ckks(tmp_path_factory: pytest.TempPathFactory) -> tuple[CkksCodec, CkksSumAggregator]:
    secret, public = generate_keys(tmp_path_factory.mktemp("keys"))
    return CkksCodec.from_file(secret), CkksSumAggregator.from_bytes(Path(public).read_bytes())


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "ckks"])
def test_the_count_aware_mean_is_the_exact_mean_over_the_holders(
    cora: GraphDataset, ckks: tuple[CkksCodec, CkksSumAggregator], encrypted: bool
) -> None:
    config = TrainConfig(nodes="union", **PLAIN)
    plan = layout_federation(config, cora)
    assert plan.client_config.count_aware
    codec, aggregator = ckks if encrypted else (PlainCodec(), PlainSumAggregator())
    clients = [GlasuClient(p, plan.client_config, codec=codec) for p in plan.partitions]
    rows, cols = 40, 16
    rng = np.random.default_rng(0)
    owns = [torch.from_numpy(rng.uniform(-1, 1, (rows, cols)).astype(np.float32)) for _ in clients]
    presence = [(rng.random((rows, 1)) < 0.6).astype(np.float32) for _ in clients]
    presence[0][:, 0] = np.maximum(presence[0][:, 0], 1 - presence[1][:, 0] - presence[2][:, 0])
    requests, steps = [], []
    for client, own, present in zip(clients, owns, presence, strict=True):
        context = PassContext(pass_index=0, kind="train", output_nodes=np.arange(rows))
        step = client.joint.aggregate(
            context, 2, own, rows=np.arange(rows), presence=torch.from_numpy(present)
        )
        requests.append(next(step))
        steps.append(step)
    assert {(r.rows, r.cols) for r in requests} == {(rows, cols + 1)}  # the presence column
    total = aggregator.add([r.payload for r in requests], rows=rows, cols=cols + 1)
    holders = sum(presence)
    exact = sum(own.numpy() * present for own, present in zip(owns, presence, strict=True))
    exact = exact / holders
    for step, own in zip(steps, owns, strict=True):
        with pytest.raises(StopIteration) as done:
            step.send(SharesSum(payload=total, count=3))
        extracted = done.value.value
        np.testing.assert_array_equal(extracted.count.numpy(), holders)  # counts are exact
        seen = combine(
            extracted.others, own, count=extracted.count, presence=extracted.presence
        ).numpy()
        np.testing.assert_allclose(seen, exact, atol=1e-3)  # shares sit on a 2^-12 grid


def test_full_overlap_with_the_count_aware_mean_trains_as_the_plain_mean(
    cora: GraphDataset,
) -> None:
    """Every client holding every node, counts are M everywhere: the same model as without."""
    torch.set_num_threads(1)
    outcomes = []
    for nodes in ("intersection", "union"):
        plan = layout_federation(TrainConfig(nodes=nodes, **PLAIN), cora)
        clients = [GlasuClient(p, plan.client_config) for p in plan.partitions]
        outcome = []
        for pass_index in range(3):
            outcome += run_pass_inprocess(
                clients,
                PlainSumAggregator(),
                pass_index=pass_index,
                kind="train",
                output_nodes=cora.train_nodes[16 * pass_index : 16 * pass_index + 16],
            )
        outcomes.append([o.loss for o in outcome])
    # the same model up to float reassociation ((t - s) / M against t / M - s / M), which some
    # CPUs' kernels round differently in the last bit
    assert outcomes[0] == pytest.approx(outcomes[1], rel=1e-6)


def test_clients_lacking_nodes_train_on_the_union(cora: GraphDataset) -> None:
    plan = layout_federation(TrainConfig(nodes="union", **PLAIN), cora)
    parts = hide_nodes(plan.partitions, fraction=0.4, seed=0)
    clients = [GlasuClient(p, plan.client_config) for p in parts]
    shares = []

    class Recording(PlainSumAggregator):
        def add(self, payloads, *, rows, cols):
            shares.extend(np.frombuffer(p, "<f4").reshape(rows, cols) for p in payloads)
            return super().add(payloads, rows=rows, cols=cols)

    outcomes = run_pass_inprocess(
        clients, Recording(), pass_index=0, kind="train", output_nodes=cora.train_nodes[:16]
    )
    assert all(np.isfinite(o.loss) for o in outcomes)
    for share in shares:
        presence = share[:, -1]
        assert set(np.unique(presence)) <= {0.0, 1.0}
        assert not share[presence == 0, :-1].any()  # nothing is sent for a node one lacks
