"""A kept private sign release (models/private_sign_kept.py): covered rows are the kept ones,
a new node's row the mean of its covered neighbours', and the block depends on no feature."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.data.propagation import propagate_hops
from models.private_sign_kept import filled_release, kept_block
from models.sampler import SamplingGraph
from tests.models.test_private_sign import as_partition


def path_graph(n: int) -> SamplingGraph:
    """0 - 1 - ... - (n - 1)."""
    src = np.arange(n - 1)
    edges = torch.from_numpy(np.stack([np.r_[src, src + 1], np.r_[src + 1, src]]))
    return SamplingGraph.from_edge_index(edges, num_nodes=n)


def test_a_new_node_gets_its_covered_neighbours_mean_and_covered_rows_stay() -> None:
    part = as_partition(path_graph(5), np.full((5, 2), 99.0, dtype=np.float32))
    kept = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    covered = np.array([True, True, False, True, False])
    filled = filled_release(kept, covered, part)
    assert torch.equal(filled[[0, 1, 3]], kept[[0, 1, 3]])
    assert torch.allclose(filled[2], (kept[1] + kept[3]) / 2)  # both neighbours covered
    assert torch.allclose(filled[4], kept[3])  # node 3 its only covered neighbour


def test_a_new_node_without_covered_neighbours_gets_zeros() -> None:
    part = as_partition(path_graph(3), np.ones((3, 2), dtype=np.float32))
    kept = torch.ones(3, 2)
    filled = filled_release(kept, np.array([True, False, False]), part)
    assert torch.equal(filled[2], torch.zeros(2))


def test_the_block_reads_no_feature_and_propagates_the_filled_rows() -> None:
    graph = path_graph(6)
    covered = np.array([True, False, True, True, False, True])
    kept = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    blocks = [
        kept_block(kept, covered, as_partition(graph, features), hops=3)
        for features in (np.zeros((6, 4), np.float32), np.ones((6, 4), np.float32))
    ]
    for a, b in zip(blocks[0].hops, blocks[1].hops, strict=True):
        assert torch.equal(a, b)
    part = as_partition(graph, np.zeros((6, 3), np.float32))
    filled = filled_release(kept, covered, part)
    expected = propagate_hops(as_partition(graph, filled.numpy()), hops=2)
    for got, want in zip(blocks[0].hops, expected.hops, strict=True):
        assert torch.allclose(got, want)


def test_a_release_of_another_table_size_is_refused() -> None:
    part = as_partition(path_graph(4), np.ones((4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="3 rows"):
        filled_release(torch.ones(3, 2), np.ones(3, bool), part)
