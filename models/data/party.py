"""One organisation's folder: the worker's on-disk format (docs/data.md), written by
``glasu prepare`` from the organisation's own tables and by ``glasu partition`` from a benchmark
dataset.

In the organisation's own row order (row r is the r-th row of its node table):

- ``meta.json``: ``format_version``, ``num_rows``, ``feature_names``, counts, and what
  ``glasu prepare`` did (``summary``); a benchmark partition adds ``dataset`` and
  ``feature_columns``;
- ``ids.parquet``: column ``id`` (text), the organisation's own node ids: private, never sent;
- ``features.npy`` (float32, rows x d), ``edges.npy`` (int64, 2 x 2E: both directions of every
  undirected edge, as row numbers), ``labels.npy`` (int64 class index per row, -1 = no label).

After the alignment (``glasu align``, or ``glasu train --party`` in memory):

- ``alignment.json``: the alignment's id, this party's index, the number of parties, the number
  of shared nodes N, the digest all parties hold, and how the split was drawn;
- ``aligned.npy`` (int64 per row: its index in the aligned node index 0..N-1, -1 where the
  node is not shared); ``train.npy``/``val.npy``/``test.npy`` (int64 aligned indices).

``models.data.partition.aligned_partition`` turns the two into what the training uses: a
``ClientPartition`` over the aligned index. Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from models.data.class_names import CLASS_NAMES
from secure.files import atomic_write

FORMAT_VERSION = 2
META = "meta.json"
IDS = "ids.parquet"
ALIGNMENT = "alignment.json"
NO_LABEL = -1
NOT_SHARED = -1


@dataclass(frozen=True)
class PartyData:
    """One organisation's graph in its own row order."""

    ids: list[str]  # private: the organisation's own node ids
    features: np.ndarray  # float32 (rows, d)
    feature_names: list[str]
    edges: np.ndarray  # int64 (2, 2E): both directions, row numbers
    labels: np.ndarray  # int64 (rows,), NO_LABEL where none
    summary: dict[str, Any] = field(default_factory=dict)  # what `glasu prepare` did
    extra_meta: dict[str, Any] = field(default_factory=dict)  # benchmark: dataset, columns

    @property
    def num_rows(self) -> int:
        return int(self.features.shape[0])

    @property
    def labeled(self) -> int:
        return int((self.labels != NO_LABEL).sum())


@dataclass(frozen=True)
class PartyAlignment:
    """Where each of this party's rows sits in the shared node index, and the split over it."""

    alignment_id: str | None  # None: a benchmark partition, whose ids are identical everywhere
    party: int
    parties: int
    aligned_nodes: int  # N
    digest: str | None  # SHA-256 of the sorted intersection: the same at every party
    rows: np.ndarray  # int64 (rows,): aligned index of each row, NOT_SHARED where none
    train_nodes: np.ndarray
    val_nodes: np.ndarray
    test_nodes: np.ndarray
    split_note: str
    nodes: str = "intersection"  # or "union": N counts every node any party holds

    def local_rows(self) -> np.ndarray:
        """The row of each aligned node 0..N-1 (the inverse of ``rows``)."""
        return local_rows(self.rows, self.aligned_nodes)


def local_rows(rows: np.ndarray, aligned_nodes: int) -> np.ndarray:
    """The row of each aligned node 0..N-1, given the aligned index of each row (NOT_SHARED for
    an aligned node this party lacks: an alignment over the union)."""
    shared = np.flatnonzero(rows != NOT_SHARED)
    order = np.full(aligned_nodes, NOT_SHARED, dtype=np.int64)
    order[rows[shared]] = shared
    return order


ALIGNED_CHUNK_ROWS = 65_536  # rows gathered at a time: the only transient beyond the result


def in_aligned_order(values: np.ndarray, order: np.ndarray, *, fill: float | int) -> np.ndarray:
    """``values`` (one per row) in aligned order, given :func:`local_rows`; ``fill`` for an
    aligned node this party lacks. Where the rows are already in aligned order, ``values``
    itself (a memory-mapped file stays mapped); otherwise one new array, gathered in chunks."""
    if order.size == len(values) and np.array_equal(order, np.arange(order.size)):
        return values
    out = np.empty((order.size, *values.shape[1:]), dtype=values.dtype)
    for start in range(0, order.size, ALIGNED_CHUNK_ROWS):
        rows = order[start : start + ALIGNED_CHUNK_ROWS]
        held = rows != NOT_SHARED
        chunk = out[start : start + rows.size]
        chunk[...] = values[np.where(held, rows, 0)]
        chunk[~held] = fill
    return out


# -- writing ---------------------------------------------------------------------------------------


def save_array(path: Path, values: np.ndarray) -> None:
    """``values`` to ``path`` (.npy) under a new inode: a process that has the old file
    memory-mapped keeps reading the old contents (truncating a mapped file would kill it)."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as out:
        np.save(out, values, allow_pickle=False)
    os.replace(partial, path)


def write_party(data: PartyData, folder: Path) -> None:
    """The organisation's own files (everything but the alignment) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    save_array(folder / "features.npy", data.features.astype(np.float32, copy=False))
    save_array(folder / "edges.npy", data.edges.astype(np.int64, copy=False))
    labels = folder / "labels.npy"
    if data.labeled:  # a party without labels (a passive party of GLASU B.2) has no such file
        save_array(labels, data.labels.astype(np.int64, copy=False))
    else:
        labels.unlink(missing_ok=True)
    write_ids(folder, pa.array(data.ids, type=pa.string()))
    write_meta(
        folder,
        num_rows=data.num_rows,
        num_features=int(data.features.shape[1]),
        feature_names=data.feature_names,
        labeled=data.labeled,
        undirected_edges=int(data.edges.shape[1] // 2),
        summary=data.summary,
        extra=data.extra_meta,
    )


def write_ids(folder: Path, ids: pa.Array) -> None:
    """The organisation's own ids, in row order (text)."""
    pq.write_table(pa.table({"id": ids.cast(pa.string())}), folder / IDS)


def write_meta(
    folder: Path,
    *,
    num_rows: int,
    num_features: int,
    feature_names: list[str],
    labeled: int,
    undirected_edges: int,
    summary: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``meta.json`` (what it holds)."""
    meta = {
        "format_version": FORMAT_VERSION,
        "num_rows": num_rows,
        "num_features": num_features,
        "feature_names": feature_names,
        "labeled_rows": labeled,
        "undirected_edges": undirected_edges,
        "summary": summary,
        **(extra or {}),
    }
    (folder / META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def write_alignment(alignment: PartyAlignment, folder: Path) -> None:
    """The alignment's files; ``alignment.json`` goes last (atomically), so a folder has an
    alignment only once every array of it is complete."""
    save_array(folder / "aligned.npy", np.asarray(alignment.rows, dtype=np.int64))
    split = (alignment.train_nodes, alignment.val_nodes, alignment.test_nodes)
    has_split = any(nodes.size for nodes in split)  # a passive party of GLASU B.2 holds none
    for name, nodes in zip(("train", "val", "test"), split, strict=True):
        if has_split:
            save_array(folder / f"{name}.npy", np.asarray(nodes, dtype=np.int64))
        else:
            (folder / f"{name}.npy").unlink(missing_ok=True)
    record = {
        "alignment_id": alignment.alignment_id,
        "party": alignment.party,
        "parties": alignment.parties,
        "aligned_nodes": alignment.aligned_nodes,
        "digest": alignment.digest,
        "split": alignment.split_note,
        "nodes": alignment.nodes,
    }
    atomic_write(folder / ALIGNMENT, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644)


# -- reading ---------------------------------------------------------------------------------------


def read_meta(folder: Path) -> dict[str, Any]:
    path = Path(folder) / META
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: is {folder} a folder written by glasu prepare or glasu partition?"
        )
    meta = json.loads(path.read_text())
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version {version} is not {FORMAT_VERSION}; write the folder again "
            "with this glasu (glasu prepare or glasu partition)"
        )
    return meta


def _array(
    folder: Path,
    name: str,
    dtype: type,
    *,
    if_missing: np.ndarray | None = None,
    mapped: bool = False,
) -> np.ndarray:
    """``name``.npy as ``dtype``; ``if_missing`` where a file may be absent (a passive party of
    GLASU B.2 has no labels and no split). ``mapped``: memory-mapped copy-on-write (pages are read
    as used and the file is never written; writable, so torch takes it without a copy)."""
    path = folder / f"{name}.npy"
    if not path.exists():
        if if_missing is not None:
            return if_missing
        raise FileNotFoundError(f"{path} is missing")
    return np.load(path, allow_pickle=False, mmap_mode="c" if mapped else None).astype(
        dtype, copy=False
    )


def read_ids(folder: Path) -> pa.Array:
    """The organisation's own ids in row order (text), without a Python object per id."""
    return pq.read_table(Path(folder) / IDS, columns=["id"]).column("id").combine_chunks()


def read_party(folder: Path, *, with_ids: bool = True) -> PartyData:
    """The organisation's own files, checked against each other (every inconsistency names the
    file). ``with_ids=False`` leaves the ids on disk (a worker never needs them). The features
    stay memory-mapped from ``features.npy``: nothing reads them whole."""
    folder = Path(folder)
    meta = read_meta(folder)
    rows = int(meta["num_rows"])
    features = _array(folder, "features", np.float32, mapped=True)
    edges = _array(folder, "edges", np.int64, mapped=True)
    labels = _array(folder, "labels", np.int64, if_missing=np.full(rows, NO_LABEL, np.int64))
    if features.ndim != 2 or features.shape[0] != rows:
        raise ValueError(f"{folder}/features.npy has shape {features.shape}, expected ({rows}, d)")
    if (
        edges.ndim != 2
        or edges.shape[0] != 2
        or (edges.size and not 0 <= edges.min() <= edges.max() < rows)
    ):
        raise ValueError(f"{folder}/edges.npy must be 2 x E with row numbers in [0, {rows})")
    if labels.shape != (rows,):
        raise ValueError(f"{folder}/labels.npy has shape {labels.shape}, expected ({rows},)")
    ids: list[str] = []
    if with_ids:
        ids = read_ids(folder).to_pylist()
        if len(ids) != rows:
            raise ValueError(f"{folder}/{IDS} has {len(ids)} ids, expected {rows}")
    kept = ("dataset", "feature_columns", "client", CLASS_NAMES)
    extra = {k: v for k, v in meta.items() if k in kept}
    return PartyData(
        ids=ids,
        features=features,
        feature_names=list(meta.get("feature_names", [])),
        edges=edges,
        labels=labels,
        summary=dict(meta.get("summary", {})),
        extra_meta=extra,
    )


def read_alignment(folder: Path, *, rows: int) -> PartyAlignment | None:
    """The folder's alignment, or None if it has none yet."""
    folder = Path(folder)
    path = folder / ALIGNMENT
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    n = int(record["aligned_nodes"])
    aligned = _array(folder, "aligned", np.int64)
    if aligned.shape != (rows,):
        raise ValueError(f"{folder}/aligned.npy has shape {aligned.shape}, expected ({rows},)")
    nodes = str(record.get("nodes", "intersection"))
    if nodes not in ("intersection", "union"):
        raise ValueError(f"{folder}/{ALIGNMENT}: nodes must be intersection or union: {nodes!r}")
    shared = np.sort(aligned[aligned != NOT_SHARED])
    if nodes == "union":  # every row has its place; the others' nodes fill the rest
        one_to_one = shared.size == rows and np.array_equal(np.unique(shared), shared)
        one_to_one = one_to_one and (shared.size == 0 or 0 <= shared[0] <= shared[-1] < n)
    else:
        one_to_one = np.array_equal(shared, np.arange(n))
    if not one_to_one:
        raise ValueError(
            f"{folder}/aligned.npy does not map rows one to one onto the {n} aligned nodes "
            f"({nodes})"
        )
    none = np.empty(0, dtype=np.int64)
    splits = {
        name: _array(folder, name, np.int64, if_missing=none) for name in ("train", "val", "test")
    }
    for name, nodes in splits.items():
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"{folder}/{name}.npy has node ids outside [0, {n})")
    return PartyAlignment(
        alignment_id=record.get("alignment_id"),
        party=int(record["party"]),
        parties=int(record["parties"]),
        aligned_nodes=n,
        digest=record.get("digest"),
        rows=aligned,
        train_nodes=splits["train"],
        val_nodes=splits["val"],
        test_nodes=splits["test"],
        split_note=str(record.get("split", "")),
        nodes=nodes,
    )


# -- the training's view ---------------------------------------------------------------------------


def aligned_edges(edges: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The edges between shared nodes, as aligned indices (both directions kept as given):
    ``edges`` itself where the rows are already in aligned order, otherwise one new array,
    mapped in chunks."""
    if np.array_equal(rows, np.arange(rows.size)):
        return edges
    out = np.empty(edges.shape, dtype=np.int64)
    kept = 0
    for start in range(0, edges.shape[1], ALIGNED_CHUNK_ROWS):
        src = rows[edges[0, start : start + ALIGNED_CHUNK_ROWS]]
        dst = rows[edges[1, start : start + ALIGNED_CHUNK_ROWS]]
        keep = (src != NOT_SHARED) & (dst != NOT_SHARED)
        count = int(keep.sum())
        out[0, kept : kept + count] = src[keep]
        out[1, kept : kept + count] = dst[keep]
        kept += count
    return out if kept == out.shape[1] else np.ascontiguousarray(out[:, :kept])
