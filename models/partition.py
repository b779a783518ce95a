"""Vertical partitioning: every client holds all node ids, the labels and the split, its own block
of feature columns and its own sample of the undirected edges. Also what a worker process
loads: one client's folder (``models/party.py``) as a partition over the aligned node index."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.data import GraphDataset
from models.party import (
    PartyAlignment,
    PartyData,
    aligned_edges,
    read_alignment,
    read_party,
    unlabeled_split_nodes,
    write_alignment,
    write_party,
)


@dataclass(frozen=True)
class ClientPartition:
    """What organisation ``client`` holds."""

    client: int
    clients: int
    dataset: str
    feature_columns: np.ndarray  # indices into the original feature matrix, sorted
    features: torch.Tensor  # (N, d_m)
    edge_index: torch.Tensor  # (2, 2*E_m): both directions of the client's undirected edges
    labels: torch.Tensor  # (N,)
    train_nodes: np.ndarray
    val_nodes: np.ndarray
    test_nodes: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.labels.max().item()) + 1


def feature_blocks(num_features: int, *, clients: int, seed: int) -> list[np.ndarray]:
    """A seeded random permutation of the columns cut into ``clients`` near-equal blocks:
    disjoint, covering all columns, each sorted."""
    if not 1 <= clients <= num_features:
        raise ValueError(f"clients must be between 1 and {num_features}, got {clients}")
    order = np.random.default_rng([seed, 1]).permutation(num_features)
    return [np.sort(block).astype(np.int64) for block in np.array_split(order, clients)]


def undirected_edges(edge_index: torch.Tensor) -> np.ndarray:
    """(E, 2) array of undirected edges u < v, without duplicates or self-loops."""
    src, dst = edge_index.numpy()
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    pairs = np.stack([lo, hi], axis=1)[lo != hi]
    return np.unique(pairs, axis=0)


def sample_edges(
    edge_index: torch.Tensor, *, fraction: float, rng: np.random.Generator
) -> torch.Tensor:
    """Keep ``round(fraction * E)`` of the E undirected edges, uniformly; both directions."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"edge fraction must be in (0, 1], got {fraction}")
    pairs = undirected_edges(edge_index)
    keep = np.sort(rng.choice(len(pairs), size=round(fraction * len(pairs)), replace=False))
    kept = pairs[keep]
    both = np.concatenate([kept, kept[:, ::-1]], axis=0).T
    return torch.from_numpy(np.ascontiguousarray(both)).long()


def partition(
    dataset: GraphDataset,
    *,
    clients: int,
    edge_fraction: float = 0.8,
    seed: int = 0,
    split_features: bool = True,
) -> list[ClientPartition]:
    """Split ``dataset`` vertically among ``clients``. With ``split_features=False`` every client
    gets all feature columns (the centralized case uses that with one client)."""
    if split_features:
        blocks = feature_blocks(dataset.num_features, clients=clients, seed=seed)
    else:
        blocks = [np.arange(dataset.num_features, dtype=np.int64)] * clients
    parts = []
    for m, columns in enumerate(blocks):
        edge_rng = np.random.default_rng([seed, 2, m])
        parts.append(
            ClientPartition(
                client=m,
                clients=clients,
                dataset=dataset.name,
                feature_columns=columns,
                features=dataset.features[:, torch.from_numpy(columns)].contiguous(),
                edge_index=sample_edges(dataset.edge_index, fraction=edge_fraction, rng=edge_rng),
                labels=dataset.labels,
                train_nodes=dataset.train_nodes,
                val_nodes=dataset.val_nodes,
                test_nodes=dataset.test_nodes,
            )
        )
    return parts


def save_partition(part: ClientPartition, directory: Path) -> Path:
    """Write one client's partition to ``directory/client-<m>/`` in the organisations' folder
    format (``models/party.py``, docs/data.md): the node index as ids, aligned to itself (every
    client of a benchmark holds the same ids in the same order), with the dataset's split."""
    out = Path(directory) / f"client-{part.client}"
    rows = np.arange(part.num_nodes, dtype=np.int64)
    data = PartyData(
        ids=[str(node) for node in range(part.num_nodes)],
        features=part.features.numpy().astype(np.float32),
        feature_names=[f"{part.dataset} feature {c}" for c in part.feature_columns.tolist()],
        edges=part.edge_index.numpy().astype(np.int64),
        labels=part.labels.numpy().astype(np.int64),
        extra_meta={"dataset": part.dataset, "feature_columns": part.feature_columns.tolist()},
    )
    write_party(data, out)
    write_alignment(
        PartyAlignment(
            alignment_id=None,
            party=part.client,
            parties=part.clients,
            aligned_nodes=part.num_nodes,
            digest=None,
            rows=rows,
            train_nodes=part.train_nodes,
            val_nodes=part.val_nodes,
            test_nodes=part.test_nodes,
            split_note=f"the {part.dataset} split",
        ),
        out,
    )
    return out


def load_partition(directory: Path) -> ClientPartition:
    """Read a folder written by :func:`save_partition`, or by ``glasu prepare`` and aligned by
    ``glasu align``: the partition over the aligned index. Every inconsistency is an error that
    names the file; so is a training or evaluation node without a label."""
    folder = Path(directory)
    data = read_party(folder, with_ids=False)
    alignment = read_alignment(folder, rows=data.num_rows)
    if alignment is None:
        raise ValueError(
            f"{folder} is prepared but not aligned: run `glasu align` (a deployed party) or "
            "train it with `glasu train --party` (on this machine)"
        )
    part = aligned_partition(data, alignment)
    missing = unlabeled_split_nodes(part.labels.numpy(), alignment)
    if missing.size:
        raise ValueError(
            f"{folder}/labels.npy has no label for {missing.size} of the shared training and "
            f"evaluation nodes (e.g. aligned node {missing[0]}): every party needs a label for "
            "every shared node until the single-label-holder mode exists (docs/data.md)"
        )
    return part


def aligned_partition(
    data: PartyData, alignment: PartyAlignment, *, labels: np.ndarray | None = None
) -> ClientPartition:
    """A party's partition over the aligned index: its features and labels in aligned order and
    its edges between shared nodes. ``labels`` (aligned order) replaces the party's own (the
    local federation gives every client the label holders' labels)."""
    order = alignment.local_rows()
    own = data.labels[order] if labels is None else np.asarray(labels, dtype=np.int64)
    columns = data.extra_meta.get("feature_columns", range(data.features.shape[1]))
    return ClientPartition(
        client=alignment.party,
        clients=alignment.parties,
        dataset=str(data.extra_meta.get("dataset", "own data")),
        feature_columns=np.asarray(columns, dtype=np.int64),
        features=torch.from_numpy(np.ascontiguousarray(data.features[order])),
        edge_index=torch.from_numpy(aligned_edges(data.edges, alignment.rows)),
        labels=torch.from_numpy(np.ascontiguousarray(own)),
        train_nodes=alignment.train_nodes,
        val_nodes=alignment.val_nodes,
        test_nodes=alignment.test_nodes,
    )
