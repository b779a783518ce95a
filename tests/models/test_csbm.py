import numpy as np
import pytest
import torch

from models.data.csbm import csbm
from models.data.partition import partition, undirected_edges


@pytest.mark.parametrize("degree", [4.0, 32.0])
def test_average_degree_and_homophily(degree: float) -> None:
    graph = csbm(nodes=2000, degree=degree, homophily=0.6, seed=3)
    pairs = undirected_edges(graph.edge_index)
    assert 2 * len(pairs) / graph.num_nodes == pytest.approx(degree, rel=0.05)
    labels = graph.labels.numpy()
    assert (labels[pairs[:, 0]] == labels[pairs[:, 1]]).mean() == pytest.approx(0.6, abs=0.03)


def test_classes_balanced_and_split_shaped() -> None:
    graph = csbm(nodes=1000, classes=4, degree=8.0, train_per_class=20, seed=0)
    assert np.bincount(graph.labels.numpy()).tolist() == [250] * 4
    assert np.bincount(graph.labels.numpy()[graph.train_nodes]).tolist() == [20] * 4
    assert (len(graph.val_nodes), len(graph.test_nodes)) == (500, 420)
    split = np.concatenate([graph.train_nodes, graph.val_nodes, graph.test_nodes])
    assert np.unique(split).size == split.size


def test_undirected_without_self_loops_or_duplicates() -> None:
    graph = csbm(nodes=1500, degree=16.0, seed=1)
    src, dst = graph.edge_index.numpy()
    assert (src != dst).all()
    forward = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert len(forward) == src.size
    assert forward == {(v, u) for u, v in forward}


def test_deterministic_per_seed() -> None:
    a, b, c = (csbm(nodes=800, degree=8.0, seed=s) for s in (5, 5, 6))
    assert torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(a.features, b.features)
    assert torch.equal(a.labels, b.labels)
    assert np.array_equal(a.test_nodes, b.test_nodes)
    assert not torch.equal(a.features, c.features)


def test_signal_separates_class_means_and_partitions_vertically() -> None:
    weak, strong = (csbm(nodes=2000, signal=s, seed=0) for s in (1.0, 2.0))
    for graph, low, high in ((weak, 0.8, 2.0), (strong, 2.0, 4.0)):
        labels = graph.labels.numpy()
        means = np.stack([graph.features.numpy()[labels == c].mean(0) for c in range(5)])
        gaps = [np.linalg.norm(means[i] - means[j]) for i in range(5) for j in range(i)]
        assert low < np.mean(gaps) < high
    parts = partition(strong, clients=3, seed=0)
    assert sum(p.features.shape[1] for p in parts) == strong.num_features
