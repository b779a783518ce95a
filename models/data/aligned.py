"""A federation of organisations' own data, once aligned: the split over the shared node index,
the labels of a run, each party's partition, and the pooled view (``glasu train --party``).

Labels and split (docs/data.md): with one label holder (GLASU B.2) its labels alone, and the
split over the shared nodes it labels. Otherwise every client trains against labels: in
``glasu train --party`` (one machine holds every folder) the labels of the parties that carry
them, merged (they must agree on every shared node they both label), given to every client, and
the split over the shared nodes that have a label. A deployed party has only its own labels:
there the split is drawn over every aligned node (``models.data.shared_split.deployed_alignment``),
so every party that trains against labels needs one for every aligned node it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.data.class_names import class_names_in
from models.data.partition import ClientPartition, aligned_partition, undirected_edges
from models.data.party import (
    NO_LABEL,
    NOT_SHARED,
    PartyAlignment,
    PartyData,
    aligned_edges,
    in_aligned_order,
    local_rows,
)
from models.data.planetoid import GraphDataset
from models.data.shared_split import split_nodes, split_note


@dataclass(frozen=True)
class SharedIndex:
    """What one alignment gave every party: N, its id and digest, each party's rows."""

    alignment_id: str | None
    digest: str | None
    aligned_nodes: int
    rows: Sequence[np.ndarray]  # per party: aligned index of each of its rows, -1 if not shared


@dataclass(frozen=True)
class AlignedFederation:
    dataset: GraphDataset  # the pooled view: every party's features side by side, all edges
    partitions: list[ClientPartition]  # party m's own features and edges, aligned
    index: SharedIndex  # the alignment it was built on
    summary: str  # for people: who holds how many nodes, how many are shared and labelled


class LabelConflict(ValueError):
    """Label holders disagree on shared nodes."""


def merged_labels(
    parties: Sequence[PartyData], index: SharedIndex, names: Sequence[str]
) -> np.ndarray:
    """The label holders' labels in aligned order (NO_LABEL where nobody labels a node); a
    node two holders label differently is an error naming both parties' ids."""
    merged = np.full(index.aligned_nodes, NO_LABEL, dtype=np.int64)
    source = np.full(index.aligned_nodes, -1, dtype=np.int64)  # the party that labelled it
    for m, (data, rows) in enumerate(zip(parties, index.rows, strict=True)):
        if data.labeled == 0:
            continue
        labels = in_aligned_order(data.labels, local_rows(rows, index.aligned_nodes), fill=NO_LABEL)
        clash = np.flatnonzero((labels != NO_LABEL) & (merged != NO_LABEL) & (labels != merged))
        if clash.size:
            node = clash[0]
            other = int(source[node])
            raise LabelConflict(
                f"{names[other]} and {names[m]} label {clash.size} shared node(s) differently, "
                f"e.g. {names[other]}'s id {_id(parties[other], index.rows[other], node)!r} has "
                f"label {merged[node]} and {names[m]}'s id {_id(data, rows, node)!r} has label "
                f"{labels[node]}: the label holders must agree on the nodes they share"
            )
        fill = (labels != NO_LABEL) & (merged == NO_LABEL)
        merged[fill] = labels[fill]
        source[fill] = m
    return merged


@dataclass(frozen=True)
class AlignedSplit:
    """The labels of a run (aligned order) and the split over the labelled shared nodes."""

    labels: np.ndarray
    train_nodes: np.ndarray
    val_nodes: np.ndarray
    test_nodes: np.ndarray
    note: str
    summary: str  # for people: who holds how many nodes, how many are shared and labelled
    class_names: tuple[str, ...] | None = None  # the label holders' (glasu prepare), if named


def shared_class_names(
    parties: Sequence[PartyData], names: Sequence[str]
) -> tuple[str, ...] | None:
    """The class names of the parties that carry labels: one list (they number the classes),
    or none where they label with indices; parties naming them differently are an error."""
    named = {
        name: class_names_in(data.extra_meta)
        for name, data in zip(names, parties, strict=True)
        if data.labeled
    }
    if len(set(named.values())) > 1:
        described = "; ".join(
            f"{name} {'indices' if classes is None else ', '.join(classes)}"
            for name, classes in named.items()
        )
        raise LabelConflict(
            f"the label holders name their classes differently ({described}): label with the "
            "same class names (or indices) everywhere"
        )
    return next(iter(named.values()), None)


def aligned_split(
    parties: Sequence[PartyData],
    index: SharedIndex,
    *,
    names: Sequence[str],
    seed: int,
    label_holder: int | None = None,
) -> AlignedSplit:
    """The merged labels and the split over the labelled shared nodes; with a ``label_holder``,
    its labels alone. Needs the parties' ids and labels only (not their features)."""
    if label_holder is not None:
        if not 0 <= label_holder < len(parties):
            raise ValueError(f"the label holder must be a party 0..{len(parties) - 1}")
        if not parties[label_holder].labeled:
            raise ValueError(
                f"the label holder {names[label_holder]} carries no labels (glasu prepare --labels)"
            )
    elif not any(data.labeled for data in parties):
        raise ValueError(
            "no party carries labels: training needs a label table at one party at least "
            "(glasu prepare --labels)"
        )
    if label_holder is None:
        class_names = shared_class_names(parties, names)  # first: they number the labels
        labels = merged_labels(parties, index, names)
    else:
        class_names = class_names_in(parties[label_holder].extra_meta)
        labels = merged_labels(
            [parties[label_holder]],
            dataclasses.replace(index, rows=[index.rows[label_holder]]),
            [names[label_holder]],
        )
    labelled = np.flatnonzero(labels != NO_LABEL)
    if labelled.size < 3:
        raise ValueError(
            f"only {labelled.size} shared node(s) have a label: too few for a training, a "
            "validation and a test set"
        )
    train, val, test = split_nodes(labelled, seed=seed)
    note = split_note(labelled.size, train, val, seed, "labelled aligned nodes")
    held = ", ".join(f"{name} {data.num_rows}" for name, data in zip(names, parties, strict=True))
    holders = np.zeros(index.aligned_nodes, dtype=np.int64)
    for rows in index.rows:
        holders[rows[rows != NOT_SHARED]] += 1
    shared_by_all = int((holders == len(parties)).sum())
    if shared_by_all == index.aligned_nodes:
        coverage = f"share {index.aligned_nodes} nodes"
    else:
        coverage = (
            f"hold {index.aligned_nodes} nodes together (the union), {shared_by_all} of them "
            "held by every party"
        )
    summary = (
        f"{len(parties)} parties (nodes held: {held}) {coverage}, {labelled.size} of them "
        f"labelled; {note}"
    )
    return AlignedSplit(labels, train, val, test, note, summary, class_names)


def party_alignment(index: SharedIndex, split: AlignedSplit, party: int) -> PartyAlignment:
    """Party ``party``'s place in the shared index, with the run's split."""
    return PartyAlignment(
        alignment_id=index.alignment_id,
        party=party,
        parties=len(index.rows),
        aligned_nodes=index.aligned_nodes,
        digest=index.digest,
        rows=index.rows[party],
        train_nodes=split.train_nodes,
        val_nodes=split.val_nodes,
        test_nodes=split.test_nodes,
        split_note=split.note,
    )


def aligned_federation(
    parties: Sequence[PartyData],
    index: SharedIndex,
    *,
    names: Sequence[str],
    seed: int,
    label_holder: int | None = None,
) -> AlignedFederation:
    """Every party's partition over the shared index, with the merged labels and the split over
    the labelled shared nodes (:func:`aligned_split`), and the pooled dataset (the centralized
    baseline's data). With a ``label_holder``, its labels alone (the others' partitions lose
    theirs in the layout)."""
    split = aligned_split(parties, index, names=names, seed=seed, label_holder=label_holder)
    partitions = [
        aligned_partition(
            data,
            party_alignment(index, split, m),
            labels=split.labels,
            class_names=split.class_names,
        )
        for m, data in enumerate(parties)
    ]
    pooled_edges = undirected_edges(
        torch.from_numpy(
            np.concatenate(
                [aligned_edges(d.edges, r) for d, r in zip(parties, index.rows, strict=True)],
                axis=1,
            )
        )
    )
    dataset = GraphDataset(
        name="own data (" + ", ".join(names) + ")",
        features=torch.cat([p.aligned_features() for p in partitions], dim=1),
        labels=torch.from_numpy(split.labels),
        edge_index=torch.from_numpy(
            np.ascontiguousarray(np.concatenate([pooled_edges, pooled_edges[:, ::-1]]).T)
        ),
        train_nodes=split.train_nodes,
        val_nodes=split.val_nodes,
        test_nodes=split.test_nodes,
        split="aligned",
        split_note=split.note,
    )
    return AlignedFederation(
        dataset=dataset, partitions=partitions, index=index, summary=split.summary
    )


def _id(data: PartyData, rows: np.ndarray, node: int) -> str:
    return data.ids[int(np.flatnonzero(rows == node)[0])]
