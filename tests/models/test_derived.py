"""What a client derives from its partition alone (models/data/derived.py) is derived once per
loaded partition: an online scoring worker builds a client per request on the partition it
loaded once, and a request must not cost a sort of every edge or a propagation over all nodes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import models.data.propagation
import models.sampler
from models.config import TrainConfig
from models.data.partition import without_labels
from models.federated import GlasuClient
from models.layout import layout_federation


def counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """Count the calls of ``owner.name`` from now on."""
    calls: list[int] = []
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.mark.parametrize("backbone", ["gcn", "sign"])
def test_clients_built_again_on_a_loaded_partition_derive_nothing_again(
    cora, backbone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainConfig(
        dataset="cora", clients=2, backbone=backbone, hidden=8, hops=2, dp=False, encryption="none"
    )
    layout = layout_federation(config, cora)
    graphs = counted(monkeypatch, models.sampler.SamplingGraph, "from_edge_index")
    propagations = counted(monkeypatch, models.data.propagation, "propagate_hops")
    partition = layout.partitions[0]
    clients = [
        GlasuClient(part, layout.client_config)
        for part in (partition, partition, without_labels(partition))
    ]
    precomputed = backbone == "sign"
    assert len(propagations) == int(precomputed)
    assert len(graphs) == 1  # the propagation's, or the samplers'
    if precomputed:
        first, *others = (c.network.scale.factor for c in clients)
        assert all(torch.equal(first, other) for other in others)
    other_graph = dataclasses.replace(partition, edge_index=partition.edge_index.clone())
    GlasuClient(other_graph, layout.client_config)  # other edges: derived afresh
    assert len(graphs) == 2
