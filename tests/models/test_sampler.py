import numpy as np
import pytest
import torch

from models.sampler import NeighbourSampler, sampling_rng


def star_and_path() -> torch.Tensor:
    # node 0 is a hub linked to 1..9; 10-11-12 is a path
    pairs = [(0, i) for i in range(1, 10)] + [(10, 11), (11, 12)]
    src = [a for a, b in pairs] + [b for a, b in pairs]
    dst = [b for a, b in pairs] + [a for a, b in pairs]
    return torch.tensor([src, dst])


def rng(layer: int = 1):
    return sampling_rng(seed=0, client=0, pass_index=0, layer=layer)


def test_fanout_is_a_hard_cap() -> None:
    sampler = NeighbourSampler(star_and_path(), num_nodes=13, fanout=3)
    layer = sampler.sample_layer(np.array([0, 11]), rng=rng())
    per_target = np.bincount(layer.edge_target, minlength=2) - 1  # minus the self-loop
    assert per_target.tolist() == [3, 2]
    assert set(layer.targets) <= set(layer.sources)
    assert (np.diff(layer.sources) > 0).all()  # sorted and unique


def test_occurrence_cap_limits_how_often_a_node_is_drawn(cora) -> None:
    sampler = NeighbourSampler(
        cora.edge_index, num_nodes=cora.num_nodes, fanout=5, occurrence_cap=1
    )
    targets = np.arange(0, 2708, 3)
    layer = sampler.sample_layer(targets, rng=rng())
    neighbour_edges = layer.edge_source[len(targets) :]  # after the self-loops
    assert np.bincount(neighbour_edges).max() <= 1


def test_union_remaps_columns_and_keeps_order() -> None:
    sampler = NeighbourSampler(star_and_path(), num_nodes=13, fanout=2)
    layer = sampler.sample_layer(np.array([11]), rng=rng())
    union = np.union1d(layer.sources, [0, 3, 12])
    moved = layer.with_sources(union)
    assert np.array_equal(moved.sources, union)
    assert np.array_equal(moved.sources[moved.edge_source], layer.sources[layer.edge_source])
    with pytest.raises(ValueError, match="does not contain"):
        layer.with_sources(np.array([0, 1]))


def test_sampling_is_seeded() -> None:
    sampler = NeighbourSampler(star_and_path(), num_nodes=13, fanout=2)
    a = sampler.sample_layer(np.array([0]), rng=rng(1))
    b = sampler.sample_layer(np.array([0]), rng=rng(1))
    assert np.array_equal(a.sources, b.sources)


def test_mean_adjacency_rows_sum_to_one() -> None:
    sampler = NeighbourSampler(star_and_path(), num_nodes=13, fanout=3)
    layer = sampler.sample_layer(np.array([0, 10, 11]), rng=rng())
    dense = layer.mean_adjacency(torch.device("cpu")).to_dense()
    assert torch.allclose(dense.sum(dim=1), torch.ones(3))
