"""The train/validation/test split over the shared node index of an alignment, drawn from a
seed: the same at every party and at the operator, who know only N and the seed. Torch-free
(``glasu align run`` and ``glasu session create --alignment`` use it)."""

from __future__ import annotations

import numpy as np

from models.data.party import PartyAlignment

TRAIN_FRACTION = 0.6
VAL_FRACTION = 0.2  # the rest is the test set


def split_nodes(nodes: np.ndarray, *, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded random split of ``nodes`` (aligned indices): 60% training, 20% validation, the
    rest test; each sorted."""
    order = np.random.default_rng([seed, 4]).permutation(np.asarray(nodes, dtype=np.int64))
    train_end = round(TRAIN_FRACTION * order.size)
    val_end = train_end + round(VAL_FRACTION * order.size)
    return (
        np.sort(order[:train_end]),
        np.sort(order[train_end:val_end]),
        np.sort(order[val_end:]),
    )


def split_note(candidates: int, train: np.ndarray, val: np.ndarray, seed: int, what: str) -> str:
    return (
        f"seeded random split of the {candidates} {what}: {train.size} training, {val.size} "
        f"validation, {candidates - train.size - val.size} test (seed {seed})"
    )


def deployed_alignment(
    *,
    alignment_id: str,
    party: int,
    parties: int,
    digest: str,
    rows: np.ndarray,
    seed: int,
    nodes: str = "intersection",
    aligned_nodes: int | None = None,
) -> PartyAlignment:
    """A deployed party's alignment (``glasu align``): the split over every aligned node, the
    same at every party and at the operator (:func:`split_nodes` of N and the seed).
    ``aligned_nodes``: N, needed for an alignment over the union (``nodes``); over the
    intersection it is the number of shared rows."""
    if aligned_nodes is None:
        if nodes == "union":
            raise ValueError("an alignment over the union needs its number of aligned nodes")
        aligned_nodes = int((rows >= 0).sum())
    n = aligned_nodes
    train, val, test = split_nodes(np.arange(n), seed=seed)
    return PartyAlignment(
        alignment_id=alignment_id,
        party=party,
        parties=parties,
        aligned_nodes=n,
        digest=digest,
        rows=rows,
        train_nodes=train,
        val_nodes=val,
        test_nodes=test,
        split_note=split_note(n, train, val, seed, f"aligned nodes ({nodes})"),
        nodes=nodes,
    )
