"""Layer-wise neighbour sampling (GLASU Algorithm 2), one client's graph at a time.

Going down from the output nodes S[L], a layer with targets S[l] draws for every target at most
``fanout`` distinct neighbours from the client's own graph; its sources are
S[l-1] = S[l] ∪ drawn. Node sets are sorted node ids, so the service can form a union of the
clients' sets that every client reads in the same order. With ``occurrence_cap`` c, a node is
drawn as a neighbour by at most c targets of one layer (the differential-privacy sensitivity
bound relies on this cap; see docs/privacy.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SampledLayer:
    """One graph layer's bipartite block: rows ``targets``, columns ``sources``."""

    targets: np.ndarray  # sorted node ids, S[l]
    sources: np.ndarray  # sorted node ids, S[l-1] ⊇ S[l]
    edge_target: np.ndarray  # row position (into targets) of every edge, self-loops included
    edge_source: np.ndarray  # column position (into sources) of every edge

    @property
    def target_positions(self) -> np.ndarray:
        """Where each target sits among the sources."""
        return np.searchsorted(self.sources, self.targets)

    def mean_adjacency(self, device: torch.device) -> torch.Tensor:
        """Row-normalised (|targets| x |sources|) sparse matrix: each target averages itself and
        its drawn neighbours."""
        rows = torch.from_numpy(self.edge_target)
        cols = torch.from_numpy(self.edge_source)
        degree = torch.bincount(rows, minlength=len(self.targets)).float()
        values = 1.0 / degree[rows]
        adjacency = torch.sparse_coo_tensor(
            torch.stack([rows, cols]),
            values,
            (len(self.targets), len(self.sources)),
            check_invariants=False,
        )
        return adjacency.coalesce().to(device)

    def with_sources(self, union: np.ndarray) -> SampledLayer:
        """The same edges with the columns re-indexed into ``union`` ⊇ ``sources`` (the node set
        agreed at an aggregation layer)."""
        union = np.asarray(union, dtype=np.int64)
        nodes = self.sources[self.edge_source]
        columns = np.searchsorted(union, nodes)
        if columns.size and (columns.max() >= len(union) or (union[columns] != nodes).any()):
            raise ValueError("the agreed node set does not contain this client's sampled nodes")
        return SampledLayer(
            targets=self.targets, sources=union, edge_target=self.edge_target, edge_source=columns
        )

    def edge_index(self, device: torch.device) -> torch.Tensor:
        """(2, E) source-to-target edges for message-passing layers (row 0 sources)."""
        return torch.from_numpy(np.stack([self.edge_source, self.edge_target])).long().to(device)


class NeighbourSampler:
    """Samples one client's graph. ``edge_index`` holds both directions of every edge."""

    def __init__(
        self,
        edge_index: torch.Tensor,
        *,
        num_nodes: int,
        fanout: int,
        occurrence_cap: int | None = None,
    ) -> None:
        if fanout < 0:
            raise ValueError(f"fanout must be >= 0, got {fanout}")
        if occurrence_cap is not None and occurrence_cap < 0:
            raise ValueError(f"occurrence_cap must be >= 0, got {occurrence_cap}")
        self.num_nodes = num_nodes
        self.fanout = fanout
        self.occurrence_cap = occurrence_cap
        src, dst = edge_index.numpy()
        keep = src != dst
        src, dst = src[keep], dst[keep]
        order = np.lexsort((src, dst))
        # neighbours of v: every u with an edge u -> v (the graph is undirected)
        self._indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_nodes))])
        self._neighbours = src[order]

    def sample_layer(self, targets: np.ndarray, *, rng: random.Random) -> SampledLayer:
        """Draw the neighbours of ``targets`` (sorted, unique) for one layer."""
        targets = np.asarray(targets, dtype=np.int64)
        drawn_by: dict[int, int] = {}
        edge_target: list[int] = []
        edge_source_nodes: list[int] = []
        visit = list(range(len(targets)))
        rng.shuffle(visit)  # with a cap, who gets a contested neighbour must not depend on ids
        for position in visit:
            node = int(targets[position])
            candidates = self._neighbours[self._indptr[node] : self._indptr[node + 1]]
            pool = sorted(set(candidates.tolist()))
            if self.occurrence_cap is not None:
                pool = [u for u in pool if drawn_by.get(u, 0) < self.occurrence_cap]
            chosen = pool if len(pool) <= self.fanout else rng.sample(pool, self.fanout)
            for u in chosen:
                drawn_by[u] = drawn_by.get(u, 0) + 1
                edge_target.append(position)
                edge_source_nodes.append(u)
        drawn = np.asarray(edge_source_nodes, dtype=np.int64)
        sources = np.union1d(targets, drawn)
        self_rows = np.arange(len(targets), dtype=np.int64)
        rows = np.concatenate([self_rows, np.asarray(edge_target, dtype=np.int64)])
        cols = np.concatenate([np.searchsorted(sources, targets), np.searchsorted(sources, drawn)])
        return SampledLayer(targets=targets, sources=sources, edge_target=rows, edge_source=cols)


#: The stream of inference passes (evaluation, scoring): not a pass index.
INFERENCE_STREAM = 0x1EFE_1EFE


def sampling_rng(*, seed: int, client: int, pass_index: int | None, layer: int) -> random.Random:
    """The generator for one (client, pass, layer): reproducible and independent across them.
    ``pass_index=None``: the one stream of inference passes, so that a model scores the same
    output nodes the same way in any pass (a scoring session reproduces an evaluation pass)."""
    entropy = [seed, client, layer, INFERENCE_STREAM] if pass_index is None else [
        seed, client, pass_index, layer
    ]  # fmt: skip
    state = np.random.SeedSequence(entropy).generate_state(2)
    return random.Random(int(state[0]) << 32 | int(state[1]))
