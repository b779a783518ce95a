"""A scoring session's output at a party with a head: one row per scored node, in its own ids,
in the order of its own table, for people to read: the predicted class (its name where the
labels table named the classes), and each class's probability rounded to
``PROBABILITY_DECIMALS`` places.

Rows are streamed as each pass's chunk is scored into ``<file>.partial`` (the party's row of
each node and its probabilities), put in the table's order when the session finished (the
scored rows are then held once in memory: (classes + 1) x 8 bytes per row, 64 MB for 1M rows of
seven classes) and renamed to the file: a file that exists is complete. CSV or Parquet by the
file's extension."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from models.data.party import NOT_SHARED, local_rows, read_alignment, read_ids, read_meta
from secure.files import move_into_place

FORMATS = (".csv", ".parquet")
#: Rows written at a time: a scoring session's one pass may score every node.
WRITE_ROWS = 65_536
#: Decimal places of a probability (docs/data.md, "Score jointly"): below the fourth, the
#: digits of a probability move with the precision of the shares it reads (rounded to a
#: 2^-12 grid, CKKS sums decoded within 5e-5) and with a pass's sampled neighbourhood.
PROBABILITY_DECIMALS = 4
ROW = "row"  # the party's row of a scored node, while the rows are not yet in order


@dataclass(frozen=True)
class IdsByNode:
    """A party's own id of each aligned node without a Python object per node: the party's
    row of each aligned node (NOT_SHARED where it lacks the node) and its ids by row."""

    rows_of_nodes: np.ndarray  # int64 (N,)
    ids: pa.Array  # string, one per row of the party

    def held(self, nodes: np.ndarray) -> tuple[np.ndarray, pa.Array]:
        """Which of ``nodes`` the party holds (a mask) and their own ids."""
        rows = self.rows_of_nodes[np.asarray(nodes, dtype=np.int64)]
        held = rows != NOT_SHARED
        return held, self.ids.take(pa.array(rows[held], pa.int64()))

    def __getitem__(self, nodes: np.ndarray) -> np.ndarray:
        """The own ids of ``nodes`` as objects (None where the party lacks a node)."""
        held, ids = self.held(nodes)
        own = np.full(len(held), None, dtype=object)
        own[held] = np.asarray(ids.to_pylist(), dtype=object)
        return own


def ids_by_aligned_node(folder: Path) -> tuple[IdsByNode, str | None]:
    """The party's own id of each aligned node, and its alignment's digest, from its prepared
    and aligned folder."""
    folder = Path(folder)
    alignment = read_alignment(folder, rows=int(read_meta(folder)["num_rows"]))
    if alignment is None:
        raise ValueError(f"{folder} is not aligned: run `glasu align run` first")
    ids = read_ids(folder)
    return own_ids_by_node(alignment.rows, ids, alignment.aligned_nodes), alignment.digest


def own_ids_by_node(
    rows: np.ndarray, ids: Sequence[str] | pa.Array, aligned_nodes: int
) -> IdsByNode:
    """A party's own id of each aligned node, from the aligned index of each of its rows."""
    ids = ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())
    return IdsByNode(local_rows(rows, aligned_nodes), ids)


def check_predictions_path(path: Path) -> None:
    if Path(path).suffix not in FORMATS:
        raise ValueError(f"{path}: predictions are written as .csv or .parquet")


def rounded_probabilities(
    probabilities: np.ndarray, decimals: int = PROBABILITY_DECIMALS
) -> np.ndarray:
    """Each row rounded to ``decimals`` places and still summing to 1: every probability rounded
    down, then the units left over go to the largest remainders (so 0.33333 x 3 reads 0.3334,
    0.3333, 0.3333, not three 0.3333)."""
    scale = 10**decimals
    scaled = np.asarray(probabilities, dtype=np.float64) * scale
    units = np.floor(scaled)
    left = np.clip(np.rint(scale - units.sum(axis=1)), 0, scaled.shape[1]).astype(np.int64)
    by_remainder = np.argsort(units - scaled, axis=1, kind="stable")  # largest remainder first
    place = np.empty_like(by_remainder)
    np.put_along_axis(place, by_remainder, np.arange(scaled.shape[1])[None, :], axis=1)
    return (units + (place < left[:, None])) / scale


def prediction_table(
    ids: pa.Array, probabilities: np.ndarray, class_names: Sequence[str] | None
) -> pa.Table:
    """The rows a person reads: the id, the predicted class (the most probable: its name where
    the classes are named, ``class``, else its index, ``predicted_class``) and one rounded
    probability per class (``probability_<name>`` or ``probability_<index>``)."""
    predicted = np.asarray(probabilities).argmax(axis=1)
    rounded = rounded_probabilities(probabilities)
    if class_names is None:
        head = {"predicted_class": pa.array(predicted, pa.int64())}
        labels: Sequence[str | int] = range(rounded.shape[1])
    else:
        head = {"class": pa.array(np.asarray(class_names, dtype=object)[predicted], pa.string())}
        labels = class_names
    columns = {"id": ids, **head} | {
        f"probability_{label}": pa.array(rounded[:, c], pa.float64())
        for c, label in enumerate(labels)
    }
    return pa.table(columns)


class PredictionWriter:
    """``write(nodes, probabilities)`` per chunk; ``finish()`` makes the file appear, its rows
    in the order of the party's own table. ``class_names``: the model's (``class`` column and
    probability columns named by class), None for classes that are numbers."""

    def __init__(
        self,
        path: Path,
        *,
        ids_of_node: IdsByNode,
        num_classes: int,
        class_names: Sequence[str] | None = None,
    ) -> None:
        check_predictions_path(path)
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for {num_classes} classes")
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.ids_of_node = ids_of_node
        self.class_names = None if class_names is None else list(class_names)
        self.rows = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # as scored: the party's row of each node and its probabilities, ordered at the end
        self._schema = pa.schema(
            [(ROW, pa.int64())] + [(f"p{c}", pa.float64()) for c in range(num_classes)]
        )
        self._writer = pq.ParquetWriter(self.partial, self._schema)
        self._done = False

    def write(self, nodes: np.ndarray, probabilities: np.ndarray) -> None:
        """The rows of ``nodes`` this party holds, ``WRITE_ROWS`` at a time."""
        for start in range(0, len(nodes), WRITE_ROWS):
            self._write(
                nodes[start : start + WRITE_ROWS], probabilities[start : start + WRITE_ROWS]
            )

    def _write(self, nodes: np.ndarray, probabilities: np.ndarray) -> None:
        rows = self.ids_of_node.rows_of_nodes[np.asarray(nodes, dtype=np.int64)]
        held = rows != NOT_SHARED
        columns = [pa.array(rows[held], pa.int64())] + [
            pa.array(probabilities[held, c], pa.float64()) for c in range(probabilities.shape[1])
        ]
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self._schema))
        self.rows += int(held.sum())

    def finish(self) -> Path:
        """The rows in the party's table order, as people read them (:func:`prediction_table`),
        in ``<file>.partial`` first, then renamed to the file."""
        self._writer.close()
        self._done = True
        scored = pq.read_table(self.partial, memory_map=False).sort_by(ROW)
        self.partial.unlink()
        rows = scored.column(ROW).to_numpy()
        probabilities = np.stack(
            [scored.column(name).to_numpy() for name in scored.column_names[1:]], axis=1
        )
        writer = None
        for start in range(0, max(len(rows), 1), WRITE_ROWS):
            part = slice(start, start + WRITE_ROWS)
            table = prediction_table(
                self.ids_of_node.ids.take(pa.array(rows[part], pa.int64())),
                probabilities[part].reshape(-1, len(self._schema) - 1),
                self.class_names,
            )
            writer = writer or _table_writer(self.partial, table.schema)
            writer.write_table(table)
        assert writer is not None
        writer.close()
        move_into_place(self.partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close without making the file appear: the rows so far stay in ``<file>.partial``
        (Parquet, as scored: the party's row of each node and its probabilities); with none
        scored (a session refused at join), nothing stays. Nothing once finished or
        abandoned."""
        if self._done:
            return
        self._done = True
        self._writer.close()
        if not self.rows:
            self.partial.unlink(missing_ok=True)


def _table_writer(path: Path, schema: pa.Schema) -> pa_csv.CSVWriter | pq.ParquetWriter:
    """CSV or Parquet by the name the file will have (``<file>.partial`` is written first)."""
    if path.name.removesuffix(".partial").endswith(".csv"):
        return pa_csv.CSVWriter(path, schema)
    return pq.ParquetWriter(path, schema)
