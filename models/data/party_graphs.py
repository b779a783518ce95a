"""Party graphs that differ: each party draws its own graph over the same communities, instead of
each keeping a sample of one graph (models/data/partition.py gives every party 80% of the same
edges).

:func:`differing_party_graphs` takes a dataset for its nodes (features, labels, split: e.g. a CSBM,
models/data/csbm.py) and draws one graph per party with the CSBM's edge model over the dataset's
classes, at the party's own expected average degree ``degrees[m]`` and the given homophily: party
0 (by convention the label holder) can hold a sparse graph and a partner a dense one. Every party
holds all node ids, the labels and the split and a block of the feature columns
(:func:`models.data.partition.feature_blocks`). The graphs partly overlap: a common graph of
degree ``overlap * min(degrees)`` is in every party's graph and each party adds its own
independent draw of the rest, so ``overlap`` is the share of the sparsest party's edges that every
party holds (independent draws also meet by chance, about ``degree / nodes`` of them). The joined
data (all features, the union of the parties' edges; the dataset's own edges are not used) is
what centralised training would see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.data.csbm import both_directions, csbm_edges
from models.data.partition import ClientPartition, feature_blocks, undirected_edges
from models.data.planetoid import GraphDataset

LABEL_HOLDER = 0  # the party whose graph is degrees[0]


@dataclass(frozen=True)
class PartyGraphs:
    """The parties' partitions and the joined dataset (all features, the union of the edges)."""

    joined: GraphDataset
    partitions: list[ClientPartition]


def differing_party_graphs(
    dataset: GraphDataset,
    *,
    degrees: Sequence[float] = (4.0, 16.0, 16.0),
    overlap: float = 0.25,
    homophily: float = 0.6,
    seed: int = 0,
) -> PartyGraphs:
    """``len(degrees)`` parties over ``dataset``'s nodes, each with its own graph; deterministic
    per ``seed`` (and dataset)."""
    nodes = dataset.num_nodes
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if not degrees or min(degrees) <= 0.0 or max(degrees) >= nodes - 1:
        raise ValueError(f"every party's degree must be in (0, {nodes - 1}), got {degrees}")
    if not 0.0 < homophily < 1.0:
        raise ValueError(f"homophily must be in (0, 1), got {homophily}")
    labels = dataset.labels.numpy()
    common_degree = overlap * min(degrees)

    def draw(degree: float, *stream: int) -> np.ndarray:
        if degree <= 0.0:
            return np.empty((0, 2), dtype=np.int64)
        rng = np.random.default_rng([seed, 0xD1FF, *stream])
        return csbm_edges(labels, degree=degree, homophily=homophily, rng=rng)

    common = draw(common_degree, 0)
    graphs = [
        unique_pairs(np.concatenate([common, draw(degree - common_degree, 1, m)]), nodes)
        for m, degree in enumerate(degrees)
    ]
    listed = ", ".join(f"{d:g}" for d in degrees)
    name = f"{dataset.name}-parties-d{listed.replace(', ', '-')}-o{overlap:g}"
    blocks = feature_blocks(dataset.num_features, clients=len(degrees), seed=seed)
    partitions = [
        ClientPartition(
            client=m,
            clients=len(degrees),
            dataset=name,
            feature_columns=columns,
            features=dataset.features[:, torch.from_numpy(columns)].contiguous(),
            edge_index=both_directions(pairs),
            labels=dataset.labels,
            train_nodes=dataset.train_nodes,
            val_nodes=dataset.val_nodes,
            test_nodes=dataset.test_nodes,
        )
        for m, (columns, pairs) in enumerate(zip(blocks, graphs, strict=True))
    ]
    joined = dataclasses.replace(
        dataset,
        name=name,
        edge_index=both_directions(unique_pairs(np.concatenate(graphs), nodes)),
        split_note=f"{dataset.split_note}; the parties' own graphs of degree {listed} (overlap "
        f"{overlap:g} of the sparsest, homophily {homophily:g}, seed {seed}), joined",
    )
    return PartyGraphs(joined=joined, partitions=partitions)


def unique_pairs(pairs: np.ndarray, nodes: int) -> np.ndarray:
    """(E, 2) undirected pairs u < v without duplicates, sorted (by a key of each pair: fast at
    millions of edges, where ``np.unique(axis=0)`` sorts rows)."""
    keys = np.unique(pairs[:, 0].astype(np.int64) * nodes + pairs[:, 1])
    return np.stack([keys // nodes, keys % nodes], axis=1)


def joined_edges(partitions: Sequence[ClientPartition]) -> torch.Tensor:
    """The union of the parties' undirected edges, both directions: the joined graph."""
    nodes = partitions[0].num_nodes
    pairs = np.concatenate([undirected_edges(p.edge_index) for p in partitions])
    return both_directions(unique_pairs(pairs, nodes))
