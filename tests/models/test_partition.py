from pathlib import Path

import numpy as np
import pytest

from models.data.partition import (
    feature_blocks,
    load_partition,
    partition,
    save_partition,
    undirected_edges,
)


def test_feature_blocks_disjoint_and_covering() -> None:
    blocks = feature_blocks(1433, clients=3, seed=0)
    merged = np.concatenate(blocks)
    assert sorted(merged.tolist()) == list(range(1433))
    assert [len(b) for b in blocks] == [478, 478, 477]


def test_partition_properties(cora) -> None:
    parts = partition(cora, clients=3, edge_fraction=0.8, seed=7)
    total = len(undirected_edges(cora.edge_index))
    for part in parts:
        kept = undirected_edges(part.edge_index)
        assert len(kept) == round(0.8 * total)
        assert part.edge_index.shape[1] == 2 * len(kept)  # both directions
        assert part.num_nodes == cora.num_nodes
        assert np.array_equal(part.train_nodes, cora.train_nodes)
    # each client's edges are its own sample
    assert not np.array_equal(parts[0].edge_index.numpy(), parts[1].edge_index.numpy())


def test_partition_is_seeded(cora) -> None:
    a = partition(cora, clients=3, seed=1)
    b = partition(cora, clients=3, seed=1)
    c = partition(cora, clients=3, seed=2)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.feature_columns, y.feature_columns)
        assert np.array_equal(x.edge_index.numpy(), y.edge_index.numpy())
    assert not np.array_equal(a[0].feature_columns, c[0].feature_columns)


def test_save_and_load_round_trip(cora, tmp_path: Path) -> None:
    part = partition(cora, clients=3, seed=0)[1]
    folder = save_partition(part, tmp_path)
    loaded = load_partition(folder)
    assert loaded.client == 1 and loaded.clients == 3
    assert np.array_equal(loaded.features.numpy(), part.features.numpy())
    assert np.array_equal(loaded.edge_index.numpy(), part.edge_index.numpy())
    assert np.array_equal(loaded.test_nodes, part.test_nodes)


def test_load_rejects_broken_partition(cora, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        load_partition(tmp_path)
    folder = save_partition(partition(cora, clients=2, seed=0)[0], tmp_path)
    np.save(folder / "labels.npy", np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match=r"labels\.npy"):
        load_partition(folder)


def test_invalid_arguments(cora) -> None:
    with pytest.raises(ValueError, match="edge fraction"):
        partition(cora, clients=3, edge_fraction=0.0)
    with pytest.raises(ValueError, match="clients"):
        feature_blocks(10, clients=11, seed=0)
