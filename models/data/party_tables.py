"""An organisation's own tables, read and checked: a node table (an id column and numeric
feature columns), an edge table (two id columns) and, optionally, a label table (an id column and
a class index), each CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``). docs/data.md
describes them.

Each file is read in batches (``models.data.table_file``) and the features are written as they
are read (:func:`write_party_tables`), so large files stream. Every bad input is
one :class:`~models.data.table_file.TableError` naming the file, the row (data rows count from 1;
the CSV header is not a row) and the column. Ids are compared as text: an integer
id is its decimal text, and CSV ids are read as text as written (``42`` and ``042`` differ).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from models.data.class_names import CLASS_NAMES, ClassNames, holds_names
from models.data.npy_stream import NpyStream
from models.data.party import NO_LABEL, save_array, write_ids, write_meta
from models.data.table_file import TableError, TableFile

EDGE_CHUNK = 1 << 20  # edges turned into row pairs at a time when written


@dataclass(frozen=True)
class PartyTables:
    """Where one organisation's tables are and which columns hold what."""

    nodes: Path
    edges: Path
    id_column: str
    labels: Path | None = None
    edge_columns: tuple[str, str] | None = None  # default: the edge table's two columns
    label_column: str | None = None  # default: the label table's column besides the id


def write_party_tables(
    tables: PartyTables, folder: Path, *, progress: bool = False, organisation: str | None = None
) -> dict[str, Any]:
    """Read and check the tables and write them to ``folder`` in the worker's format
    (``models.data.party``), streaming: features go to ``features.npy`` batch by batch, so the
    memory held is one batch plus the id index and the edges' keys. Self-loops and duplicate
    edges are dropped and counted. The folder's ``meta.json`` (returned) is written last, with
    ``organisation``: whose data it is (the name its owner's privacy ledger goes by)."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, feature_names = _write_nodes(tables, folder / "features.npy", progress)
    edge_counts = _write_edges(tables, ids, folder / "edges.npy", progress)
    labeled = 0
    class_names = None
    if tables.labels is not None:
        labels, class_names = _read_labels(tables, ids, progress)
        labeled = int((labels != NO_LABEL).sum())
        save_array(folder / "labels.npy", labels)
    write_ids(folder, ids)
    summary = {
        "nodes": str(tables.nodes),
        "edges": str(tables.edges),
        "labels": str(tables.labels) if tables.labels is not None else None,
        "id_column": tables.id_column,
        **edge_counts,
    }
    return write_meta(
        folder,
        num_rows=len(ids),
        num_features=len(feature_names),
        feature_names=feature_names,
        labeled=labeled,
        undirected_edges=edge_counts["undirected_edges"],
        summary=summary,
        extra=({} if organisation is None else {"organisation": organisation})
        | ({} if class_names is None else {CLASS_NAMES: class_names}),
    )


# -- the tables ------------------------------------------------------------------------------------


def _write_nodes(tables: PartyTables, out: Path, progress: bool) -> tuple[pa.Array, list[str]]:
    """The node table's ids (the id index), its features written to ``out`` as they are read."""
    path = tables.nodes
    source = TableFile(path, progress, what="node table")
    _require_column(path, source.columns, tables.id_column, "--id-column")
    names = [c for c in source.columns if c != tables.id_column]
    if not names:
        raise TableError(path, "the node table has no feature column besides the id column")
    id_chunks: list[pa.Array] = []
    with NpyStream(out, np.float32, (len(names),)) as features:
        for first_row, batch in source.batches():
            id_chunks.append(_ids(path, batch, tables.id_column, first_row))
            block = np.empty((batch.num_rows, len(names)), dtype=np.float32)
            for j, name in enumerate(names):
                block[:, j] = _numbers(path, batch, name, first_row)
            features.append(block)
    ids = _combine(path, id_chunks)
    _refuse_duplicates(path, ids, tables.id_column, what="id")
    return ids, names


def _write_edges(tables: PartyTables, ids: pa.Array, out: Path, progress: bool) -> dict[str, int]:
    """The edge table as row numbers, both directions of every undirected edge, to ``out``; the
    counts of what was kept and dropped."""
    path = tables.edges
    source = TableFile(path, progress, what="edge table")
    if tables.edge_columns is not None:
        pair = tables.edge_columns
        for name in pair:
            _require_column(path, source.columns, name, "--edge-columns")
    elif len(source.columns) == 2:
        pair = (source.columns[0], source.columns[1])
    else:
        raise TableError(
            path,
            f"the edge table has {len(source.columns)} columns ({', '.join(source.columns)}); "
            "name its two id columns with --edge-columns SOURCE,TARGET",
        )
    n = len(ids)
    keys: list[np.ndarray] = []  # one int64 per undirected edge u < v: u * n + v
    edge_rows = loops = 0
    for first_row, batch in source.batches():
        src, dst = (
            _rows_of(path, _ids(path, batch, name, first_row), ids, name, first_row, tables.nodes)
            for name in pair
        )
        edge_rows += src.size
        loop = src == dst
        loops += int(loop.sum())
        keys.append(np.minimum(src, dst)[~loop] * n + np.maximum(src, dst)[~loop])
    if edge_rows == 0:
        raise TableError(path, "the table has no rows")
    kept = sum(k.size for k in keys)
    unique = np.unique(np.concatenate(keys)) if keys else np.empty(0, np.int64)
    del keys
    with NpyStream(out, np.int64, (2 * unique.size,), rows=2) as edges:
        for quotient in (True, False, False, True):  # row 0: lo then hi; row 1: hi then lo
            for start in range(0, unique.size, EDGE_CHUNK):
                chunk = unique[start : start + EDGE_CHUNK]
                edges.append(chunk // n if quotient else chunk % n)
    return {
        "edge_rows": edge_rows,
        "self_loops_dropped": loops,
        "duplicate_edges_dropped": kept - unique.size,
        "undirected_edges": int(unique.size),
    }


def _read_labels(
    tables: PartyTables, ids: pa.Array, progress: bool
) -> tuple[np.ndarray, list[str] | None]:
    """The class index of each row (NO_LABEL where none) and, for a column of class names
    (text, none of it a number), the names in the order that numbers them (sorted)."""
    path = tables.labels
    assert path is not None
    source = TableFile(path, progress, what="label table")
    _require_column(path, source.columns, tables.id_column, "--id-column")
    if tables.label_column is not None:
        _require_column(path, source.columns, tables.label_column, "--label-column")
        label_column = tables.label_column
    elif len(source.columns) == 2:
        label_column = next(c for c in source.columns if c != tables.id_column)
    else:
        raise TableError(
            path,
            f"the label table has {len(source.columns)} columns ({', '.join(source.columns)}); "
            "name the label column with --label-column",
        )
    labels = np.full(len(ids), NO_LABEL, dtype=np.int64)
    labelled_at = np.zeros(len(ids), dtype=np.int64)  # the label table's row of each node
    total = 0
    names: ClassNames | None = None  # a column of class names (not indices): their codes
    for first_row, batch in source.batches():
        node_ids = _ids(path, batch, tables.id_column, first_row)
        rows = _rows_of(path, node_ids, ids, tables.id_column, first_row, tables.nodes)
        if names is None and total == 0 and holds_names(batch.column(label_column)):
            names = ClassNames()
        if names is None:
            values = _class_indices(path, batch, label_column, first_row)
        else:
            values = names.codes(
                path, _labels(path, batch, label_column, first_row), label_column, first_row
            )
        by_node = np.argsort(rows, kind="stable")
        again = np.zeros(rows.size, dtype=bool)  # a node labelled earlier in this batch
        again[by_node[1:]] = rows[by_node[1:]] == rows[by_node[:-1]]
        second = np.flatnonzero(again | (labelled_at[rows] != 0))
        if second.size:
            offset = int(second[0])
            row = rows[offset]
            first = labelled_at[row] or first_row + int(np.flatnonzero(rows == row)[0])
            raise TableError(
                path,
                f"a second label for id {node_ids[offset].as_py()!r} (the first is at row {first})",
                row=first_row + offset,
                column=tables.id_column,
            )
        labelled_at[rows] = first_row + np.arange(rows.size)
        labels[rows] = values
        total += len(rows)
    if total == 0:
        raise TableError(path, "the table has no rows")
    if names is None:
        return labels, None
    return names.numbered(labels, unlabelled=NO_LABEL), names.sorted()


# -- checking columns ------------------------------------------------------------------------------


#: A table with more columns than this is not listed whole when a column is missing.
COLUMNS_LISTED = 8


def _require_column(path: Path, columns: list[str], name: str, flag: str) -> None:
    if name not in columns:
        raise TableError(path, f"no column {name!r} ({flag}); {_columns_like(name, columns)}")


def _columns_like(name: str, columns: list[str]) -> str:
    """The columns a mistyped ``name`` may have meant: every column of a narrow table, else the
    closest few by name and the count (a table of 479 columns is not one line to read)."""
    if len(columns) <= COLUMNS_LISTED:
        return f"the columns are: {', '.join(columns)}"
    closest = difflib.get_close_matches(name, columns, n=3, cutoff=0.6)
    if closest:
        return f"the closest of its {len(columns)} columns: {', '.join(closest)}"
    return f"its {len(columns)} columns begin with {', '.join(columns[:3])}, ..."


def _first_null(values: pa.Array) -> int | None:
    if not values.null_count:
        return None
    return int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])


def _ids(path: Path, batch: pa.RecordBatch, name: str, first_row: int) -> pa.Array:
    """A column of node ids as text (integers as their decimal text); a missing id is an
    error."""
    values = batch.column(name)
    if pa.types.is_integer(values.type):
        values = pc.cast(values, pa.string())
    elif not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise TableError(
            path, f"ids are text or integers, this column is {values.type}", column=name
        )
    missing = _first_null(values)
    if missing is not None:
        raise TableError(path, "missing id", row=first_row + missing, column=name)
    return pc.cast(values, pa.string())


def _converted(
    path: Path,
    values: pa.Array,
    name: str,
    first_row: int,
    convert: Callable[[pa.Array], pa.Array],
    wanted: str,
) -> pa.Array:
    """``convert(values)``; when some value does not convert, the error names the first one."""
    try:
        return convert(values)
    except pa.ArrowInvalid:
        lo, hi = 0, len(values)  # the first bad value is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                convert(values.slice(lo, mid - lo))
                lo = mid
            except pa.ArrowInvalid:
                hi = mid
        raise TableError(
            path, f"{values[lo].as_py()!r} is not {wanted}", row=first_row + lo, column=name
        ) from None


def _numbers(path: Path, batch: pa.RecordBatch, name: str, first_row: int) -> np.ndarray:
    """A feature column as float64: every value present, a number, finite, within float32."""
    values = batch.column(name)
    kind = values.type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
    ):
        raise TableError(path, f"features are numbers, this column is {kind}", column=name)
    missing = _first_null(values)
    if missing is not None:
        raise TableError(path, "missing value", row=first_row + missing, column=name)
    numbers = _converted(
        path, values, name, first_row, lambda v: pc.cast(v, pa.float64()), "a number"
    ).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~np.isfinite(numbers) | (np.abs(numbers) > np.finfo(np.float32).max))
    if bad.size:
        value = float(numbers[bad[0]])
        problem = (
            "NaN is not a usable feature value"
            if np.isnan(value)
            else f"{value:g} is not a finite float32 feature value"
        )
        raise TableError(path, problem, row=first_row + int(bad[0]), column=name)
    return numbers


def _labels(path: Path, batch: pa.RecordBatch, name: str, first_row: int) -> pa.Array:
    """A label column, every row labelled."""
    values = batch.column(name)
    missing = _first_null(values)
    if missing is not None:
        raise TableError(path, "missing label", row=first_row + missing, column=name)
    return values


def _class_indices(path: Path, batch: pa.RecordBatch, name: str, first_row: int) -> np.ndarray:
    """A label column: class indices, non-negative integers (the same numbering at every
    party)."""
    values = _labels(path, batch, name, first_row)
    wanted = "a class index (a non-negative integer)"
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_string(values.type)
        or pa.types.is_large_string(values.type)
    ):
        raise TableError(
            path, f"labels are class indices, this column is {values.type}", column=name
        )
    indices = _converted(
        path, values, name, first_row, lambda v: pc.cast(v, pa.int64()), wanted
    ).to_numpy(zero_copy_only=False)
    negative = np.flatnonzero(indices < 0)
    if negative.size:
        raise TableError(
            path,
            f"{int(indices[negative[0]])} is not {wanted}",
            row=first_row + int(negative[0]),
            column=name,
        )
    return indices.astype(np.int64)


def _rows_of(
    path: Path, values: pa.Array, ids: pa.Array, name: str, first_row: int, nodes: Path
) -> np.ndarray:
    """The node-table row (0-based) of each id; an id the node table lacks is an error."""
    rows = pc.index_in(values, value_set=ids)
    unknown = _first_null(rows)
    if unknown is not None:
        raise TableError(
            path,
            f"unknown id {values[unknown].as_py()!r}: the node table {nodes} has no such id",
            row=first_row + unknown,
            column=name,
        )
    return rows.to_numpy(zero_copy_only=False).astype(np.int64)


def _combine(path: Path, chunks: list[pa.Array]) -> pa.Array:
    ids = pa.chunked_array(chunks, type=pa.string()).combine_chunks()
    if len(ids) == 0:
        raise TableError(path, "the table has no rows")
    return ids


def _refuse_duplicates(path: Path, ids: pa.Array, name: str, *, what: str) -> None:
    if len(pc.unique(ids)) == len(ids):
        return
    first: dict[str, int] = {}
    for row, value in enumerate(ids.to_pylist(), start=1):
        if value in first:
            raise TableError(
                path,
                f"duplicate {what} {value!r} (first at row {first[value]})",
                row=row,
                column=name,
            )
        first[value] = row
