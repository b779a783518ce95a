"""A scoring session's output at a party with a head: one row per scored node, in its own ids.

Rows are streamed as each pass's chunk is scored (memory does not grow with the number of nodes
scored) into ``<file>.partial``, renamed to the file when the session finished: a file that
exists is complete. CSV or Parquet by the file's extension."""

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


class PredictionWriter:
    """``write(nodes, probabilities)`` per chunk; ``finish()`` makes the file appear."""

    def __init__(self, path: Path, *, ids_of_node: IdsByNode, num_classes: int) -> None:
        check_predictions_path(path)
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.ids_of_node = ids_of_node
        self.schema = pa.schema(
            [("id", pa.string()), ("predicted_class", pa.int64())]
            + [(f"probability_{c}", pa.float64()) for c in range(num_classes)]
        )
        self.rows = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".csv":
            self._writer: pa_csv.CSVWriter | pq.ParquetWriter = pa_csv.CSVWriter(
                self.partial, self.schema
            )
        else:
            self._writer = pq.ParquetWriter(self.partial, self.schema)

    def write(
        self, nodes: np.ndarray, probabilities: np.ndarray, *, predicted: np.ndarray | None = None
    ) -> None:
        """The rows of ``nodes`` this party holds, ``WRITE_ROWS`` at a time; ``predicted``: the
        predicted classes (default: the most probable)."""
        if predicted is None:
            predicted = probabilities.argmax(axis=1)
        for start in range(0, len(nodes), WRITE_ROWS):
            rows = slice(start, start + WRITE_ROWS)
            self._write(nodes[rows], probabilities[rows], predicted[rows])

    def _write(self, nodes: np.ndarray, probabilities: np.ndarray, predicted: np.ndarray) -> None:
        held, ids = self.ids_of_node.held(nodes)
        probabilities = probabilities[held]
        columns = [ids, pa.array(predicted[held], pa.int64())] + [
            pa.array(probabilities[:, c], pa.float64()) for c in range(probabilities.shape[1])
        ]
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows += int(held.sum())

    def finish(self) -> Path:
        self._writer.close()
        move_into_place(self.partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close without making the file appear: the rows so far stay in ``<file>.partial``."""
        self._writer.close()
