"""Vertical partitioning: every client holds all node ids, the labels and the split, its own block
of feature columns and its own sample of the undirected edges. Also what a worker process
loads: one client's folder (``models/data/party.py``) as a partition over the aligned node index."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.data.class_names import CLASS_NAMES, class_names_in
from models.data.party import (
    ALIGNED_CHUNK_ROWS,
    NO_LABEL,
    NOT_SHARED,
    PartyAlignment,
    PartyData,
    aligned_edges,
    in_aligned_order,
    read_alignment,
    read_party,
    write_alignment,
    write_party,
)
from models.data.planetoid import GraphDataset


@dataclass(frozen=True)
class ClientPartition:
    """What organisation ``client`` holds."""

    client: int
    clients: int
    dataset: str
    feature_columns: np.ndarray  # indices into the original feature matrix, sorted
    # (N, d_m) in aligned order, or with ``rows_of_nodes`` the party's own rows (d_m columns),
    # memory-mapped from its folder: read them through :meth:`feature_rows`
    features: torch.Tensor
    edge_index: torch.Tensor  # (2, 2*E_m): both directions of the client's undirected edges
    labels: torch.Tensor  # (N,)
    train_nodes: np.ndarray
    val_nodes: np.ndarray
    test_nodes: np.ndarray
    # bool (N,): the nodes this client holds, where nodes are partly shared (an alignment over
    # the union); None: it holds every node. Features of a node it lacks are zero, with no edge.
    held: np.ndarray | None = None
    # the feature schema of `glasu prepare` (column names in order, what prepare did): what a
    # saved model records and checks new data against
    feature_names: tuple[str, ...] | None = None
    feature_summary: dict | None = dataclasses.field(default=None, compare=False)
    # int64 (N,): the row of ``features`` of each aligned node (NOT_SHARED where the party lacks
    # it); None: ``features`` is in aligned order already
    rows_of_nodes: np.ndarray | None = dataclasses.field(default=None, compare=False)
    # the names of the classes, index by index, where the labels table named them (glasu
    # prepare); None: the classes are numbers
    class_names: tuple[str, ...] | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    def feature_rows(self, nodes: np.ndarray) -> torch.Tensor:
        """The features of aligned ``nodes`` (zeros where the party lacks a node), read from
        the party's rows: no aligned copy of the whole matrix exists."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if self.rows_of_nodes is None:
            return self.features[torch.from_numpy(nodes)]
        rows = self.rows_of_nodes[nodes]
        held = rows != NOT_SHARED
        if held.all():
            return self.features[torch.from_numpy(rows)]
        out = torch.zeros(len(nodes), self.num_features, dtype=self.features.dtype)
        out[torch.from_numpy(held)] = self.features[torch.from_numpy(rows[held])]
        return out

    def aligned_chunks(self, chunk: int = ALIGNED_CHUNK_ROWS) -> Iterator[torch.Tensor]:
        """The features of every aligned node in order, ``chunk`` rows at a time."""
        for start in range(0, self.num_nodes, chunk):
            yield self.feature_rows(np.arange(start, min(start + chunk, self.num_nodes)))

    def aligned_features(self) -> torch.Tensor:
        """All features in aligned order (N, d_m): a copy where the party's rows are in
        another order (the pooled view of ``glasu train --party``, a benchmark's folder)."""
        if self.rows_of_nodes is None:
            return self.features
        return torch.cat(list(self.aligned_chunks())) if self.num_nodes else self.features[:0]

    @property
    def num_classes(self) -> int:
        return max(int(self.labels.max().item()) + 1, 1)  # a passive party has no label

    def digest(self) -> str:
        """SHA-256 of the features, edges and labels (the data a model is fit to) and of which
        aligned nodes this client holds, if not all: what tells a checkpoint of other data."""
        digest = hashlib.sha256()
        features = np.dtype(np.float32), (self.num_nodes, self.num_features)
        digest.update(f"{features[0]}{features[1]}".encode())
        for rows in self.aligned_chunks():  # the bytes of the aligned matrix, chunk by chunk
            digest.update(np.ascontiguousarray(rows.numpy()).reshape(-1).view(np.uint8))
        for value in (self.edge_index, self.labels, self.held):
            if value is None:
                continue
            array = np.ascontiguousarray(
                value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            )
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(memoryview(array).cast("B"))  # the bytes in place: no copy
        return digest.hexdigest()


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
    format (``models/data/party.py``, docs/data.md): the node index as ids, aligned to itself (every
    client of a benchmark holds the same ids in the same order), with the dataset's split."""
    out = Path(directory) / f"client-{part.client}"
    rows = np.arange(part.num_nodes, dtype=np.int64)
    data = PartyData(
        ids=[str(node) for node in range(part.num_nodes)],
        features=part.aligned_features().numpy().astype(np.float32),
        feature_names=list(part.feature_names)
        if part.feature_names is not None
        else [f"{part.dataset} feature {c}" for c in part.feature_columns.tolist()],
        edges=part.edge_index.numpy().astype(np.int64),
        labels=part.labels.numpy().astype(np.int64),
        summary=dict(part.feature_summary or {}),
        extra_meta={"dataset": part.dataset, "feature_columns": part.feature_columns.tolist()}
        | ({} if part.class_names is None else {CLASS_NAMES: list(part.class_names)}),
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


def load_partition(directory: Path, *, require_labels: bool = True) -> ClientPartition:
    """Read a folder written by :func:`save_partition`, or by ``glasu prepare`` and aligned by
    ``glasu align``: the partition over the aligned index. Every inconsistency is an error that
    names the file; so is a training or evaluation node without a label, unless
    ``require_labels`` is False (a worker checks that once it knows whether it holds the
    labels: :func:`check_labels`)."""
    folder = Path(directory)
    data = read_party(folder, with_ids=False)
    alignment = read_alignment(folder, rows=data.num_rows)
    if alignment is None:
        raise ValueError(
            f"{folder} is prepared but not aligned: run `glasu align` (a deployed party) or "
            "train it with `glasu train --party` (on this machine)"
        )
    part = aligned_partition(data, alignment)
    if require_labels:
        check_labels(part, where=f"{folder}/labels.npy")
    return part


LABEL_HOLDER_REMEDY = "otherwise make one party the label holder (docs/data.md)"


def check_labels(part: ClientPartition, *, where: str, remedy: str = LABEL_HOLDER_REMEDY) -> None:
    """A client that trains against labels needs one for every training and evaluation node it
    holds; ``remedy`` ends the error: what to do instead."""
    nodes = np.concatenate([part.train_nodes, part.val_nodes, part.test_nodes])
    if part.held is not None:
        nodes = nodes[part.held[nodes]]
    missing = np.sort(nodes[part.labels.numpy()[nodes] == NO_LABEL])
    if missing.size:
        raise ValueError(
            f"{where} has no label for {missing.size} of the aligned training and evaluation "
            f"nodes it holds (e.g. aligned node {missing[0]}): a party that trains against "
            f"labels needs one for every aligned node it holds; {remedy}"
        )


def without_labels(part: ClientPartition) -> ClientPartition:
    """A passive party's partition (GLASU B.2): no label and no split, only features and edges."""
    none = np.empty(0, dtype=np.int64)
    return dataclasses.replace(
        part,
        labels=torch.full_like(part.labels, NO_LABEL),
        train_nodes=none,
        val_nodes=none,
        test_nodes=none,
        class_names=None,
    )


def aligned_partition(
    data: PartyData,
    alignment: PartyAlignment,
    *,
    labels: np.ndarray | None = None,
    class_names: tuple[str, ...] | None = None,
) -> ClientPartition:
    """A party's partition over the aligned index: its features and labels in aligned order and
    its edges between shared nodes. ``labels`` (aligned order) replaces the party's own (the
    local federation gives every client the label holders' labels), and ``class_names`` their
    names. Over an alignment of the union, a node the party lacks has zero features, no label
    and no edge."""
    order = alignment.local_rows()
    held = order != NOT_SHARED
    in_order = order.size == len(data.features) and np.array_equal(order, np.arange(order.size))
    if labels is None:
        own = in_aligned_order(data.labels, order, fill=NO_LABEL)
        class_names = class_names_in(data.extra_meta)
    else:
        own = np.asarray(labels, dtype=np.int64)
    columns = data.extra_meta.get("feature_columns", range(data.features.shape[1]))
    return ClientPartition(
        client=alignment.party,
        clients=alignment.parties,
        dataset=str(data.extra_meta.get("dataset", "own data")),
        feature_columns=np.asarray(columns, dtype=np.int64),
        features=torch.from_numpy(np.ascontiguousarray(data.features, dtype=np.float32)),
        edge_index=torch.from_numpy(aligned_edges(data.edges, alignment.rows)),
        labels=torch.from_numpy(np.ascontiguousarray(own)),
        train_nodes=alignment.train_nodes,
        val_nodes=alignment.val_nodes,
        test_nodes=alignment.test_nodes,
        held=None if held.all() else held,
        feature_names=tuple(data.feature_names),
        feature_summary=dict(data.summary),
        rows_of_nodes=None if in_order else order,
        class_names=class_names,
    )
