"""Contextual stochastic block model (CSBM): synthetic graphs whose degree, homophily and feature
signal are set by hand, to map where private federation pays (bench/frontier.py).

Nodes fall into ``classes`` balanced classes. An undirected edge joins two nodes of the same class
with probability p_in and of different classes with probability p_out; ``homophily`` is the
expected fraction of edges inside a class, so for balanced classes

    p_in / p_out = homophily * (classes - 1) / (1 - homophily)

(6 with the defaults: homophily 0.6, 5 classes, against 1 without community structure;
Cora's edge homophily is 0.81, but with it the graph alone classifies a CSBM of degree 16
or more almost perfectly, which leaves nothing to map). The expected
average degree is ``degree``. Features are Gaussian: x_v = mu_{y_v} + N(0, I), with class means
mu_c ~ N(0, signal^2 / F * I) drawn once per seed, so two class means lie about signal * sqrt(2)
apart over all F features, and a party holding F / M of the columns sees about 1 / sqrt(M) of
that distance. The split is the paper split's shape: ``train_per_class`` training nodes per class,
then 500 validation and 1,000 test nodes.
"""

from __future__ import annotations

import numpy as np
import torch

from models.data.planetoid import GraphDataset, random_split

SIGNALS: dict[str, float] = {"weak": 1.0, "strong": 2.0}


def csbm(
    *,
    nodes: int = 5000,
    classes: int = 5,
    degree: float = 8.0,
    homophily: float = 0.6,
    features: int = 48,
    signal: float = SIGNALS["weak"],
    train_per_class: int = 60,
    seed: int = 0,
) -> GraphDataset:
    """One CSBM graph, deterministic per ``seed``, as a dataset that partitions vertically."""
    if not 0.0 < homophily < 1.0:
        raise ValueError(f"homophily must be in (0, 1), got {homophily}")
    if not 0.0 < degree < nodes - 1:
        raise ValueError(f"degree must be in (0, {nodes - 1}), got {degree}")
    rng = np.random.default_rng([seed, 0xC5B4])
    labels = rng.permutation(np.arange(nodes) % classes)
    pairs = csbm_edges(labels, degree=degree, homophily=homophily, rng=rng)
    means = rng.normal(0.0, signal / features**0.5, size=(classes, features))
    x = means[labels] + rng.normal(size=(nodes, features))
    train, val, test = random_split(labels, per_class=train_per_class, rng=rng)
    return GraphDataset(
        name=f"csbm-d{degree:g}-s{signal:g}",
        features=torch.from_numpy(x.astype(np.float32)),
        labels=torch.from_numpy(labels.astype(np.int64)),
        edge_index=both_directions(pairs),
        train_nodes=train,
        val_nodes=val,
        test_nodes=test,
        split="paper",
        split_note=(
            f"CSBM n={nodes}, {classes} classes, degree {degree:g}, homophily {homophily:g}, "
            f"signal {signal:g}, {features} features (seed {seed}); seeded random split, "
            f"{train_per_class} training nodes per class"
        ),
    )


def both_directions(pairs: np.ndarray) -> torch.Tensor:
    """(2, 2E) edge index of (E, 2) undirected pairs: each pair in both directions."""
    both = np.concatenate([pairs, pairs[:, ::-1]], axis=0).T
    return torch.from_numpy(np.ascontiguousarray(both)).long()


def csbm_edges(
    labels: np.ndarray, *, degree: float, homophily: float, rng: np.random.Generator
) -> np.ndarray:
    """(E, 2) undirected edges u < v: Binomial counts of intra- and inter-class pairs, each drawn
    uniformly among the pairs of its kind (so the degrees are Poisson-like, as in an SBM)."""
    nodes = labels.size
    sizes = np.bincount(labels)
    intra_pairs = int((sizes * (sizes - 1) // 2).sum())
    inter_pairs = nodes * (nodes - 1) // 2 - intra_pairs
    expected = nodes * degree / 2
    n_intra = rng.binomial(intra_pairs, min(1.0, homophily * expected / intra_pairs))
    n_inter = rng.binomial(inter_pairs, min(1.0, (1 - homophily) * expected / inter_pairs))
    members = [np.flatnonzero(labels == c) for c in range(sizes.size)]
    weights = sizes * (sizes - 1) / max(1, 2 * intra_pairs)
    found: list[np.ndarray] = []
    for count, same in ((n_intra, True), (n_inter, False)):
        found.append(_draw(labels, members, weights, count=count, same=same, rng=rng))
    return np.concatenate(found, axis=0)


def _draw(
    labels: np.ndarray,
    members: list[np.ndarray],
    weights: np.ndarray,
    *,
    count: int,
    same: bool,
    rng: np.random.Generator,
) -> np.ndarray:
    """``count`` distinct pairs u < v, both ends in one class (``same``) or in two."""
    nodes = labels.size
    order = np.concatenate(members)
    sizes = np.array([m.size for m in members])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    have = np.empty((0, 2), dtype=np.int64)
    while len(have) < count:
        batch = 2 * (count - len(have)) + 64
        if same:
            cls = rng.choice(len(members), size=batch, p=weights / weights.sum())
            u = order[starts[cls] + rng.integers(0, sizes[cls])]
            v = order[starts[cls] + rng.integers(0, sizes[cls])]
        else:
            u, v = rng.integers(0, nodes, size=(2, batch))
        keep = (u != v) & ((labels[u] == labels[v]) == same)
        lo, hi = np.minimum(u, v)[keep], np.maximum(u, v)[keep]
        merged = np.concatenate([have, np.stack([lo, hi], axis=1)], axis=0)
        _, first = np.unique(merged[:, 0] * nodes + merged[:, 1], return_index=True)
        have = merged[np.sort(first)]
    chosen = have[:count]
    return chosen[np.lexsort((chosen[:, 1], chosen[:, 0]))]
