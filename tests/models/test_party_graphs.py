import numpy as np
import pytest
import torch

from models.data.csbm import csbm
from models.data.partition import partition, undirected_edges
from models.data.party_graphs import PartyGraphs, differing_party_graphs, joined_edges

NODES = 3000


def party_graphs(*, nodes: int = NODES, seed: int = 0, **settings: object) -> PartyGraphs:
    """Party graphs over a CSBM's nodes (its own graph is sparse and unused)."""
    return differing_party_graphs(csbm(nodes=nodes, degree=2.0, seed=seed), seed=seed, **settings)


def _pair_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, undirected_edges(edge_index).tolist()))


def test_each_party_gets_its_own_degree() -> None:
    graphs = party_graphs(nodes=NODES, degrees=(4.0, 16.0, 32.0), overlap=0.5, seed=1)
    for part, degree in zip(graphs.partitions, (4.0, 16.0, 32.0), strict=True):
        pairs = undirected_edges(part.edge_index)
        assert 2 * len(pairs) / NODES == pytest.approx(degree, rel=0.06)


@pytest.mark.parametrize("overlap", [0.0, 0.25, 1.0])
def test_overlap_is_the_share_of_the_sparsest_graph_every_party_holds(overlap: float) -> None:
    graphs = party_graphs(nodes=NODES, degrees=(8.0, 16.0, 16.0), overlap=overlap, seed=2)
    sparse, *partners = (_pair_set(p.edge_index) for p in graphs.partitions)
    held_by_all = sparse.intersection(*partners)
    assert len(held_by_all) / len(sparse) == pytest.approx(overlap, abs=0.03)
    # the partners' own draws are independent: beyond the common graph they meet by chance only
    beyond = (partners[0] & partners[1]) - held_by_all
    assert len(beyond) / len(partners[0]) < 0.02


def test_every_party_keeps_the_homophily() -> None:
    graphs = party_graphs(nodes=NODES, degrees=(4.0, 24.0), overlap=0.3, homophily=0.7, seed=3)
    labels = graphs.joined.labels.numpy()
    for part in graphs.partitions:
        pairs = undirected_edges(part.edge_index)
        assert (labels[pairs[:, 0]] == labels[pairs[:, 1]]).mean() == pytest.approx(0.7, abs=0.03)


def test_deterministic_per_seed() -> None:
    a, b, c = (party_graphs(nodes=800, degrees=(4.0, 12.0), seed=s) for s in (5, 5, 6))
    for x, y in zip(a.partitions, b.partitions, strict=True):
        assert torch.equal(x.edge_index, y.edge_index)
        assert torch.equal(x.features, y.features)
        assert np.array_equal(x.feature_columns, y.feature_columns)
    assert torch.equal(a.joined.edge_index, b.joined.edge_index)
    assert np.array_equal(a.joined.train_nodes, b.joined.train_nodes)
    assert not torch.equal(a.partitions[1].edge_index, c.partitions[1].edge_index)
    assert not torch.equal(a.joined.features, c.joined.features)


def test_joined_data_holds_every_feature_and_the_union_of_the_edges() -> None:
    graphs = party_graphs(nodes=1000, degrees=(4.0, 16.0, 16.0), overlap=0.5, seed=0)
    union = set().union(*(_pair_set(p.edge_index) for p in graphs.partitions))
    assert _pair_set(graphs.joined.edge_index) == union
    assert torch.equal(joined_edges(graphs.partitions), graphs.joined.edge_index)
    columns = np.sort(np.concatenate([p.feature_columns for p in graphs.partitions]))
    assert columns.tolist() == list(range(graphs.joined.num_features))
    for part in graphs.partitions:
        assert torch.equal(part.features, graphs.joined.features[:, part.feature_columns])
        assert torch.equal(part.labels, graphs.joined.labels)
        src, dst = part.edge_index.numpy()
        assert (src != dst).all()
        assert part.edge_index.shape[1] == 2 * len(_pair_set(part.edge_index))


def test_joined_edges_of_a_sampled_partition() -> None:
    graph = csbm(nodes=600, degree=8.0, seed=0)
    parts = partition(graph, clients=3, edge_fraction=0.8, seed=0)
    union = set().union(*(_pair_set(p.edge_index) for p in parts))
    assert _pair_set(joined_edges(parts)) == union
    assert union <= _pair_set(graph.edge_index)


@pytest.mark.parametrize(
    "settings",
    [
        {"overlap": 1.5},
        {"overlap": -0.1},
        {"degrees": ()},
        {"degrees": (0.0, 8.0)},
        {"homophily": 1.0},
    ],
)
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(ValueError):
        party_graphs(nodes=500, **settings)
