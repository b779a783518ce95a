"""Vertical partitioning: every client holds all node ids, the labels and the split, its own block
of feature columns and its own sample of the undirected edges. Also the on-disk format of one
client's partition, which is all a worker process ever loads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.data import GraphDataset

PARTITION_FORMAT_VERSION = 1


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
    """Write one client's partition to ``directory/client-<m>/``: ``meta.json`` plus
    ``features.npy`` (float32, N x d_m), ``edges.npy`` (int64, 2 x E_m), ``labels.npy`` (int64,
    N) and ``train.npy``/``val.npy``/``test.npy`` (int64 node ids)."""
    out = Path(directory) / f"client-{part.client}"
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "features.npy", part.features.numpy().astype(np.float32))
    np.save(out / "edges.npy", part.edge_index.numpy().astype(np.int64))
    np.save(out / "labels.npy", part.labels.numpy().astype(np.int64))
    for name, nodes in (
        ("train", part.train_nodes),
        ("val", part.val_nodes),
        ("test", part.test_nodes),
    ):
        np.save(out / f"{name}.npy", nodes.astype(np.int64))
    meta = {
        "format_version": PARTITION_FORMAT_VERSION,
        "dataset": part.dataset,
        "client": part.client,
        "clients": part.clients,
        "feature_columns": part.feature_columns.tolist(),
        "num_nodes": part.num_nodes,
    }
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def load_partition(directory: Path) -> ClientPartition:
    """Read a partition written by :func:`save_partition`; every inconsistency is an error that
    names the file."""
    folder = Path(directory)
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} not found: is {folder} a partition directory?")
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != PARTITION_FORMAT_VERSION:
        raise ValueError(f"{meta_path}: unsupported format_version {meta.get('format_version')}")

    def array(name: str, dtype: type) -> np.ndarray:
        path = folder / f"{name}.npy"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing")
        return np.load(path, allow_pickle=False).astype(dtype, copy=False)

    features, edges, labels = (
        array("features", np.float32),
        array("edges", np.int64),
        array("labels", np.int64),
    )
    n = int(meta["num_nodes"])
    if features.ndim != 2 or features.shape[0] != n:
        raise ValueError(f"{folder}/features.npy has shape {features.shape}, expected ({n}, d)")
    if (
        edges.ndim != 2
        or edges.shape[0] != 2
        or (edges.size and (edges.min() < 0 or edges.max() >= n))
    ):
        raise ValueError(f"{folder}/edges.npy must be 2 x E with node ids in [0, {n})")
    if labels.shape != (n,):
        raise ValueError(f"{folder}/labels.npy has shape {labels.shape}, expected ({n},)")
    splits = {name: array(name, np.int64) for name in ("train", "val", "test")}
    for name, nodes in splits.items():
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"{folder}/{name}.npy has node ids outside [0, {n})")
    return ClientPartition(
        client=int(meta["client"]),
        clients=int(meta["clients"]),
        dataset=str(meta["dataset"]),
        feature_columns=np.asarray(meta["feature_columns"], dtype=np.int64),
        features=torch.from_numpy(features.copy()),
        edge_index=torch.from_numpy(edges.copy()),
        labels=torch.from_numpy(labels.copy()),
        train_nodes=splits["train"],
        val_nodes=splits["val"],
        test_nodes=splits["test"],
    )
