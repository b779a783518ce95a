"""Party graphs that differ: a CSBM (models/data/csbm.py) whose parties each draw their own edges
from the same communities, instead of each keeping a sample of one graph (models/data/partition.py
gives every party 80% of the same edges).

Every party holds all node ids, the labels and the split, a block of the feature columns
(:func:`models.data.partition.feature_blocks`) and its own graph of expected average degree
``degrees[m]``, drawn with the CSBM's homophily over the same classes: party 0 (by convention
the label holder) can hold a sparse graph and a partner a dense one. The graphs partly overlap:
a common graph of degree ``overlap * min(degrees)`` is in every party's graph, and each party adds
its own independent draw of the rest, so ``overlap`` is the share of the sparsest party's edges
that every party holds (independent draws also meet by chance, about ``degree / nodes`` of
them). The joined data (all features, the union of the parties' edges) is what centralised
training would see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.data.csbm import (
    SIGNALS,
    balanced_labels,
    both_directions,
    class_features,
    csbm_edges,
)
from models.data.partition import ClientPartition, feature_blocks, undirected_edges
from models.data.planetoid import GraphDataset, random_split

LABEL_HOLDER = 0  # the party whose graph is degrees[0]


@dataclass(frozen=True)
class PartyGraphs:
    """The parties' partitions and the joined dataset (all features, the union of the edges)."""

    joined: GraphDataset
    partitions: list[ClientPartition]


def differing_csbm(
    *,
    nodes: int = 5000,
    degrees: Sequence[float] = (4.0, 16.0, 16.0),
    overlap: float = 0.25,
    classes: int = 5,
    homophily: float = 0.6,
    features: int = 48,
    signal: float = SIGNALS["weak"],
    train_per_class: int = 60,
    seed: int = 0,
) -> PartyGraphs:
    """One CSBM with one graph per party (``len(degrees)`` parties), deterministic per ``seed``."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if not degrees or min(degrees) <= 0.0 or max(degrees) >= nodes - 1:
        raise ValueError(f"every party's degree must be in (0, {nodes - 1}), got {degrees}")
    rng = np.random.default_rng([seed, 0xD1FF])
    labels = balanced_labels(nodes, classes=classes, rng=rng)
    x = class_features(labels, classes=classes, features=features, signal=signal, rng=rng)
    train, val, test = random_split(labels, per_class=train_per_class, rng=rng)
    common_degree = overlap * min(degrees)

    def draw(degree: float, *stream: int) -> np.ndarray:
        if degree <= 0.0:
            return np.empty((0, 2), dtype=np.int64)
        edge_rng = np.random.default_rng([seed, 0xD1FF, *stream])
        return csbm_edges(labels, degree=degree, homophily=homophily, rng=edge_rng)

    common = draw(common_degree, 0)
    graphs = [
        unique_pairs(np.concatenate([common, draw(degree - common_degree, 1, m)]), nodes)
        for m, degree in enumerate(degrees)
    ]
    features_t = torch.from_numpy(x.astype(np.float32))
    labels_t = torch.from_numpy(labels.astype(np.int64))
    listed = [f"{d:g}" for d in degrees]
    name = f"csbm-d{'-'.join(listed)}-o{overlap:g}-s{signal:g}"
    blocks = feature_blocks(features, clients=len(degrees), seed=seed)
    partitions = [
        ClientPartition(
            client=m,
            clients=len(degrees),
            dataset=name,
            feature_columns=columns,
            features=features_t[:, torch.from_numpy(columns)].contiguous(),
            edge_index=both_directions(pairs),
            labels=labels_t,
            train_nodes=train,
            val_nodes=val,
            test_nodes=test,
        )
        for m, (columns, pairs) in enumerate(zip(blocks, graphs, strict=True))
    ]
    joined = GraphDataset(
        name=name,
        features=features_t,
        labels=labels_t,
        edge_index=both_directions(unique_pairs(np.concatenate(graphs), nodes)),
        train_nodes=train,
        val_nodes=val,
        test_nodes=test,
        split="paper",
        split_note=(
            f"CSBM n={nodes}, {classes} classes, party degrees {', '.join(listed)}"
            f" (overlap {overlap:g} of the sparsest), homophily {homophily:g}, signal {signal:g}, "
            f"{features} features (seed {seed}); seeded random split, {train_per_class} training "
            "nodes per class"
        ),
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
