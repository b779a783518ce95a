"""A kept private sign model's releases (docs/privacy.md 3.8): a sender keeps its ONE noisy
release ``H1`` (its rows over the training's nodes) and, to score, hands on the block of the
current table computed from it alone: post-processing, so scoring releases nothing new and
spends no budget, whatever a scoring session asks.

Each row of the kept release (:class:`KeptRelease`, ``release.npz`` in the model folder) is
known by the party's own id of its node (a prepared party) or by its aligned node index (a
benchmark dataset): a later, re-aligned table finds its rows by those, whatever their position.

A node the kept release does not cover (a customer added since the training) gets as its ``H1``
row the mean of its covered neighbours' kept rows in the party's current graph (zero where it
has none): its own features never leave the party. Then the K - 1 further hops over the current
graph, as at training (``models.private_sign.released_block``).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures, propagate_hops
from models.sampler import SamplingGraph

#: The file of a sender's kept release in its model folder
RELEASE_FILE = "release.npz"


@dataclass(frozen=True)
class KeptRelease:
    """A sender's one noisy release ``H1`` (float32, rows x width, before the K - 1 hops) and
    each row's node: the party's own id (``keys`` of strings) or its aligned index (int64)."""

    h1: torch.Tensor
    keys: np.ndarray

    def __post_init__(self) -> None:
        if self.h1.ndim != 2 or self.keys.shape != (self.h1.shape[0],):
            raise ValueError(
                f"a kept release of {tuple(self.h1.shape)} with {self.keys.shape} row keys"
            )
        if self.keys.dtype.kind not in "Ui":
            raise ValueError(
                f"a kept release's rows are keyed by ids or nodes, not {self.keys.dtype}"
            )
        if len(np.unique(self.keys)) != len(self.keys):
            raise ValueError("a kept release names a node twice")

    @classmethod
    def of(cls, h1: torch.Tensor, own_ids: np.ndarray | None) -> KeptRelease:
        """The release ``h1`` over the aligned nodes, keyed by ``own_ids`` (the party's own id
        of each aligned node, None where it lacks it: those rows are not kept), or by the
        aligned node indices where the party has no ids of its own (``own_ids`` None)."""
        if own_ids is None:
            return cls(h1.detach().float().clone(), np.arange(h1.shape[0], dtype=np.int64))
        held = np.array([i is not None for i in own_ids], dtype=bool)
        rows = torch.from_numpy(np.flatnonzero(held))
        return cls(h1.detach().float()[rows].clone(), np.asarray(own_ids[held]).astype(str))

    @property
    def keyed_by(self) -> str:
        return "ids" if self.keys.dtype.kind == "U" else "nodes"

    def to_bytes(self) -> bytes:
        """``release.npz``: ``h1`` and ``ids`` or ``nodes`` (numpy arrays, no pickle)."""
        out = io.BytesIO()
        np.savez(out, h1=self.h1.numpy().astype(np.float32), **{self.keyed_by: self.keys})
        return out.getvalue()

    @classmethod
    def read(cls, path: Path) -> KeptRelease:
        with np.load(Path(path), allow_pickle=False) as saved:
            keys = saved["ids"] if "ids" in saved.files else saved["nodes"].astype(np.int64)
            return cls(torch.from_numpy(saved["h1"].astype(np.float32)), keys)

    def in_current_order(self, current: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """The kept rows of the current table's nodes (``current``: each node's key, as
        :meth:`of` takes them; None where the party lacks the node) and which it covers: a kept
        row follows its node's key, not its position; an uncovered row is zero."""
        current = np.asarray(current, dtype=object)
        present = np.array([k is not None for k in current], dtype=bool)
        keys = current[present].astype(str if self.keyed_by == "ids" else np.int64)
        order = np.argsort(self.keys, kind="stable")
        place = np.searchsorted(self.keys, keys, sorter=order).clip(0, max(len(order) - 1, 0))
        found = order[place] if len(order) else np.zeros(len(keys), dtype=np.int64)
        hit = (self.keys[found] == keys) if len(order) else np.zeros(len(keys), dtype=bool)
        covered = np.zeros(len(current), dtype=bool)
        covered[np.flatnonzero(present)[hit]] = True
        rows = torch.zeros(len(current), self.h1.shape[1], dtype=torch.float32)
        rows[torch.from_numpy(np.flatnonzero(covered))] = self.h1[torch.from_numpy(found[hit])]
        return rows, covered


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
