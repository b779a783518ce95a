"""A kept private sign model's releases (docs/privacy.md 3.8): a sender keeps its ONE noisy
release ``H1`` (its rows over the training's nodes) and, to score, hands on the block of the
current table computed from it alone: post-processing, so scoring releases nothing new and
spends no budget, whatever a scoring session asks.

A node the kept release does not cover (a customer added since the training) gets as its ``H1``
row the mean of its covered neighbours' kept rows in the party's current graph (zero where it
has none): its own features never leave the party. Then the K - 1 further hops over the current
graph, as at training (``models.private_sign.released_block``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures, propagate_hops
from models.sampler import SamplingGraph


def filled_release(
    kept: torch.Tensor, covered: np.ndarray, partition: ClientPartition
) -> torch.Tensor:
    """(N, width) ``H1`` of the current table: ``kept`` (rows in the current order; those of
    uncovered nodes ignored) where ``covered``, else the mean of the node's covered neighbours'
    kept rows (zero without one)."""
    covered = np.asarray(covered, dtype=bool)
    if kept.shape[0] != partition.num_nodes or covered.shape != (partition.num_nodes,):
        raise ValueError(
            f"a kept release of {kept.shape[0]} rows ({covered.shape[0]} covered flags) for "
            f"a table of {partition.num_nodes} nodes"
        )
    filled = kept.clone()
    new = np.flatnonzero(~covered)
    filled[torch.from_numpy(new)] = 0.0
    if new.size == 0:
        return filled
    graph = SamplingGraph.from_edge_index(partition.edge_index, num_nodes=partition.num_nodes)
    starts = graph.indptr[new].astype(np.int64)
    counts = graph.indptr[new + 1].astype(np.int64) - starts
    # every neighbour of every new node, flattened: position within its run plus the run's start
    runs = np.repeat(np.arange(new.size), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    neighbours = graph.neighbours[np.repeat(starts, counts) + offsets].astype(np.int64)
    usable = covered[neighbours]
    runs, neighbours = runs[usable], neighbours[usable]
    if runs.size == 0:
        return filled
    sums = torch.zeros(new.size, kept.shape[1], dtype=torch.float64)
    sums.index_add_(0, torch.from_numpy(runs), kept[torch.from_numpy(neighbours)].double())
    per_node = torch.from_numpy(np.bincount(runs, minlength=new.size)).clamp_min(1)
    filled[torch.from_numpy(new)] = (sums / per_node[:, None]).to(kept.dtype)
    return filled


def kept_block(
    kept: torch.Tensor, covered: np.ndarray, partition: ClientPartition, *, hops: int
) -> HopFeatures:
    """The sender's block over ``partition``'s current nodes from its kept release:
    ``[H1, Â H1, ..., Â^(K-1) H1]`` of :func:`filled_release` over the current graph."""
    if hops < 1:
        raise ValueError(f"the private sign design propagates 1 hop at least, got {hops}")
    filled = filled_release(kept, covered, partition)
    return propagate_hops(
        dataclasses.replace(partition, features=filled, rows_of_nodes=None), hops=hops - 1
    )
