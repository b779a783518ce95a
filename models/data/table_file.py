"""One table file, CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``), read with pyarrow in
batches (CSV blocks, Parquet row groups, one at a time) so that a large file streams, with a
progress bar (a CSV file's bytes read of its size, a Parquet file's rows of its row count); and
:class:`TableError`, a bad input said for people (file, row, column)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from tqdm.auto import tqdm

CSV_BLOCK_BYTES = 8 << 20
PARQUET_BATCH_ROWS = 65_536
#: A CSV file's progress: the share of its bytes read, and the time so far and left.
CSV_BAR = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"
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


class TableFile:
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
                header = self._open_csv({})
                try:
                    self.columns = list(header.schema.names)
                finally:
                    header.close()
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
        # a CSV file's row count is unknown until it has been read: the share of its bytes read
        # is shown (tqdm's scaled counts read "0.00" at the start)
        in_bytes = self.kind == "csv"
        bar = tqdm(
            total=self.path.stat().st_size if in_bytes else self.total,
            desc=self.path.name,
            unit=" rows",
            bar_format=CSV_BAR if in_bytes else None,
            disable=not self.progress,
            leave=False,
        )
        first_row = 1
        try:
            for batch, position in self._raw_batches():
                yield first_row, batch
                first_row += batch.num_rows
                bar.update(position - bar.n if in_bytes else batch.num_rows)
        except pa.ArrowInvalid as exc:
            raise self._unreadable(exc, f"not readable after row {first_row - 1}") from None
        finally:
            bar.close()

    def _raw_batches(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        """Each batch, and how many bytes of a CSV file have been read by then."""
        if self.kind == "parquet":
            # a row group at a time: pyarrow's iter_batches reads ahead, holding several
            for group in range(self._parquet.num_row_groups):
                table = self._parquet.read_row_group(group)
                for batch in table.to_batches(max_chunksize=PARQUET_BATCH_ROWS):
                    yield batch, 0
            return
        # closed here, not by the garbage collector: a reader left to the interpreter's exit
        # (its parser still holding the Python row handler) can abort the process
        with ExitStack() as opened:
            source = opened.enter_context(pa.OSFile(str(self.path)))  # its position: the bytes read
            reader = self._open_csv({name: pa.string() for name in self.columns}, source)
            opened.callback(reader.close)
            for batch in reader:
                yield batch, source.tell()

    def _open_csv(
        self, column_types: dict[str, pa.DataType], source: pa.NativeFile | None = None
    ) -> pa_csv.CSVStreamingReader:
        """A reader of the file, or of ``source`` (the file opened by the caller)."""

        def refuse(row: pa_csv.InvalidRow) -> str:
            self._bad_rows.append(row)
            return "error"

        if source is not None and self.path.name.lower().endswith(".gz"):
            source = pa.CompressedInputStream(source, "gzip")
        return pa_csv.open_csv(
            self.path if source is None else source,
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
