"""An organisation's own tables, read and checked: a node table (an id column and numeric
feature columns), an edge table (two id columns) and, optionally, a label table (an id column and
a class index), each CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``). docs/data.md
describes them.

Read with pyarrow in batches (CSV blocks, Parquet row groups), so large files stream, with a
progress bar. Every bad input is one :class:`TableError` naming the file, the row (data rows
count from 1; the CSV header is not a row) and the column. Ids are compared as text: an integer
id is its decimal text, and CSV ids are read as text as written (``42`` and ``042`` differ).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from models.party import NO_LABEL, PartyData

CSV_BLOCK_BYTES = 8 << 20
PARQUET_BATCH_ROWS = 65_536
FORMATS = (".csv", ".csv.gz", ".parquet")


class TableError(ValueError):
    """A bad input, for people: ``FILE: row R, column 'C': what is wrong``."""

    def __init__(
        self, path: Path, problem: str, *, row: int | None = None, column: str | None = None
    ) -> None:
        where = ", ".join(
            part
            for part in (f"row {row}" if row else "", f"column {column!r}" if column else "")
            if part
        )
        super().__init__(f"{path}: {where + ': ' if where else ''}{problem}")
        self.path = path
        self.row = row
        self.column = column


@dataclass(frozen=True)
class PartyTables:
    """Where one organisation's tables are and which columns hold what."""

    nodes: Path
    edges: Path
    id_column: str
    labels: Path | None = None
    edge_columns: tuple[str, str] | None = None  # default: the edge table's two columns
    label_column: str | None = None  # default: the label table's column besides the id


def read_party_tables(tables: PartyTables, *, progress: bool = False) -> PartyData:
    """Read and check the tables; self-loops and duplicate edges are dropped and counted."""
    ids, features, feature_names = _read_nodes(tables, progress)
    edges, edge_counts = _read_edges(tables, ids, progress)
    labels = np.full(len(ids), NO_LABEL, dtype=np.int64)
    if tables.labels is not None:
        labels = _read_labels(tables, ids, progress)
    summary = {
        "nodes": str(tables.nodes),
        "edges": str(tables.edges),
        "labels": str(tables.labels) if tables.labels is not None else None,
        "id_column": tables.id_column,
        **edge_counts,
    }
    return PartyData(
        ids=ids.to_pylist(),
        features=features,
        feature_names=feature_names,
        edges=edges,
        labels=labels,
        summary=summary,
    )


# -- the tables ------------------------------------------------------------------------------------


def _read_nodes(tables: PartyTables, progress: bool) -> tuple[pa.Array, np.ndarray, list[str]]:
    path = tables.nodes
    source = _Table(path, progress, what="node table")
    _require_column(path, source.columns, tables.id_column, "--id-column")
    names = [c for c in source.columns if c != tables.id_column]
    if not names:
        raise TableError(path, "the node table has no feature column besides the id column")
    id_chunks: list[pa.Array] = []
    blocks: list[np.ndarray] = []
    for first_row, batch in source.batches():
        id_chunks.append(_ids(path, batch, tables.id_column, first_row))
        columns = [_numbers(path, batch, name, first_row) for name in names]
        blocks.append(np.stack(columns, axis=1).astype(np.float32))
    ids = _combine(path, id_chunks)
    _refuse_duplicates(path, ids, tables.id_column, what="id")
    return ids, np.concatenate(blocks, axis=0), names


def _read_edges(
    tables: PartyTables, ids: pa.Array, progress: bool
) -> tuple[np.ndarray, dict[str, int]]:
    path = tables.edges
    source = _Table(path, progress, what="edge table")
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
    ends: list[np.ndarray] = []
    for first_row, batch in source.batches():
        rows = [
            _rows_of(path, _ids(path, batch, name, first_row), ids, name, first_row, tables.nodes)
            for name in pair
        ]
        ends.append(np.stack(rows))
    if not ends or sum(e.shape[1] for e in ends) == 0:
        raise TableError(path, "the table has no rows")
    src, dst = np.concatenate(ends, axis=1)
    loops = src == dst
    lo, hi = np.minimum(src, dst)[~loops], np.maximum(src, dst)[~loops]
    unique = np.unique(np.stack([lo, hi], axis=1), axis=0)
    both = np.concatenate([unique, unique[:, ::-1]], axis=0).T
    counts = {
        "edge_rows": int(src.size),
        "self_loops_dropped": int(loops.sum()),
        "duplicate_edges_dropped": int(lo.size - len(unique)),
        "undirected_edges": len(unique),
    }
    return np.ascontiguousarray(both, dtype=np.int64), counts


def _read_labels(tables: PartyTables, ids: pa.Array, progress: bool) -> np.ndarray:
    path = tables.labels
    assert path is not None
    source = _Table(path, progress, what="label table")
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
    for first_row, batch in source.batches():
        node_ids = _ids(path, batch, tables.id_column, first_row)
        rows = _rows_of(path, node_ids, ids, tables.id_column, first_row, tables.nodes)
        values = _class_indices(path, batch, label_column, first_row)
        for offset, row in enumerate(rows):
            if labelled_at[row]:
                raise TableError(
                    path,
                    f"a second label for id {node_ids[offset].as_py()!r} (the first is at row "
                    f"{labelled_at[row]})",
                    row=first_row + offset,
                    column=tables.id_column,
                )
            labelled_at[row] = first_row + offset
        labels[rows] = values
        total += len(rows)
    if total == 0:
        raise TableError(path, "the table has no rows")
    return labels


# -- reading in batches ----------------------------------------------------------------------------


class _Table:
    """One CSV or Parquet file: its column names and its batches (first row number, batch),
    every CSV column read as text (the checks below convert it)."""

    def __init__(self, path: Path, progress: bool, *, what: str) -> None:
        self.path = path
        self.progress = progress
        if not path.is_file():
            raise TableError(path, f"no such file (the {what})")
        if path.stat().st_size == 0:
            raise TableError(path, f"the {what} is an empty file (0 bytes): it needs a header row")
        self.kind = _kind(path)
        self._bad_rows: list[pa_csv.InvalidRow] = []  # what the CSV parser refused, for errors
        try:
            if self.kind == "parquet":
                self._parquet = pq.ParquetFile(path)
                self.columns = list(self._parquet.schema_arrow.names)
                self.total: int | None = self._parquet.metadata.num_rows
            else:
                self.columns = list(self._open_csv({}).schema.names)
                self.total = None
        except pa.ArrowInvalid as exc:
            raise self._unreadable(exc, "cannot read it as CSV") from None
        except (pa.ArrowException, OSError) as exc:
            raise TableError(path, f"cannot read it as {self.kind.upper()}: {exc}") from None
        if len(set(self.columns)) != len(self.columns):
            twice = next(c for c in self.columns if self.columns.count(c) > 1)
            raise TableError(path, "two columns have this name", column=twice)
        if self.kind == "csv" and len(self.columns) == 1:
            delimiter = _other_delimiter(self.columns[0])
            if delimiter:
                raise TableError(
                    path, _delimiter_hint(delimiter, f"its header {self.columns[0]!r}")
                )

    def batches(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        bar = tqdm(
            total=self.total,
            desc=self.path.name,
            unit=" rows",
            unit_scale=True,
            disable=not self.progress,
            leave=False,
        )
        first_row = 1
        try:
            for batch in self._raw_batches():
                yield first_row, batch
                first_row += batch.num_rows
                bar.update(batch.num_rows)
        except pa.ArrowInvalid as exc:
            raise self._unreadable(exc, f"not readable after row {first_row - 1}") from None
        finally:
            bar.close()

    def _raw_batches(self) -> Iterator[pa.RecordBatch]:
        if self.kind == "parquet":
            yield from self._parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
            return
        yield from self._open_csv({name: pa.string() for name in self.columns})

    def _open_csv(self, column_types: dict[str, pa.DataType]) -> pa_csv.CSVStreamingReader:
        def refuse(row: pa_csv.InvalidRow) -> str:
            self._bad_rows.append(row)
            return "error"

        return pa_csv.open_csv(
            self.path,
            # one thread: the parser then knows the line numbers of the rows it refuses
            read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=False),
            parse_options=pa_csv.ParseOptions(invalid_row_handler=refuse),
            convert_options=pa_csv.ConvertOptions(
                column_types=column_types,
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )

    def _unreadable(self, exc: pa.ArrowInvalid, what: str) -> TableError:
        """A parse error as one sentence: the row the parser refused, when it said which."""
        if not self._bad_rows:
            return TableError(self.path, f"{what}: {exc}")
        bad = self._bad_rows[-1]
        fields = "1 field" if bad.actual_columns == 1 else f"{bad.actual_columns} fields"
        problem = f"{fields} where the header has {bad.expected_columns} ({bad.text[:80]!r})"
        delimiter = _other_delimiter(bad.text)
        if delimiter and bad.actual_columns == 1:
            problem += "; " + _delimiter_hint(delimiter, "the row")
        elif bad.actual_columns > bad.expected_columns:
            problem += '; quote a value that holds a comma ("a,b")'
        # the parser counts the header as line 1: data row r is line r + 1
        row = bad.number - 1 if bad.number else None
        return TableError(self.path, problem, row=row)


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise TableError(path, f"unknown format: name it {', '.join(FORMATS)}")


def _other_delimiter(text: str) -> str | None:
    """The separator a one-column CSV line seems to use instead of commas, if any."""
    return next((d for d in (";", "\t", "|") if d in text), None)


def _delimiter_hint(delimiter: str, seen: str) -> str:
    name = {";": "semicolons", "\t": "tabs", "|": "'|'"}[delimiter]
    return (
        f"{seen} seems separated by {name}; glasu prepare reads comma-separated CSV: save "
        "the table with commas (or as Parquet)"
    )


# -- checking columns ------------------------------------------------------------------------------


def _require_column(path: Path, columns: list[str], name: str, flag: str) -> None:
    if name not in columns:
        raise TableError(
            path, f"no column {name!r} ({flag}); the columns are: {', '.join(columns)}"
        )


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


def _class_indices(path: Path, batch: pa.RecordBatch, name: str, first_row: int) -> np.ndarray:
    """A label column: class indices, non-negative integers (the same numbering at every
    party)."""
    values = batch.column(name)
    missing = _first_null(values)
    if missing is not None:
        raise TableError(path, "missing label", row=first_row + missing, column=name)
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
