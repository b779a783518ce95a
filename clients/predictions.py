"""A scoring session's output at a party with a head: one row per scored node, in its own ids.

Rows are streamed as each pass's chunk is scored (memory does not grow with the number of nodes
scored) into ``<file>.partial``, renamed to the file when the session finished: a file that
exists is complete. CSV or Parquet by the file's extension."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from models.data.party import NOT_SHARED, read_alignment, read_party
from secure.files import move_into_place

FORMATS = (".csv", ".parquet")


def ids_by_aligned_node(folder: Path) -> tuple[np.ndarray, str | None]:
    """The party's own id of each aligned node (None where it lacks the node), and its
    alignment's digest, from its prepared and aligned folder."""
    data = read_party(Path(folder))
    alignment = read_alignment(Path(folder), rows=data.num_rows)
    if alignment is None:
        raise ValueError(f"{folder} is not aligned: run `glasu align run` first")
    return own_ids_by_node(alignment.rows, data.ids, alignment.aligned_nodes), alignment.digest


def own_ids_by_node(rows: np.ndarray, ids: Sequence[str], aligned_nodes: int) -> np.ndarray:
    """A party's own id of each aligned node (None where it lacks the node), from the aligned
    index of each of its rows."""
    own = np.full(aligned_nodes, None, dtype=object)
    shared = rows != NOT_SHARED
    own[rows[shared]] = np.asarray(ids, dtype=object)[shared]
    return own


def check_predictions_path(path: Path) -> None:
    if Path(path).suffix not in FORMATS:
        raise ValueError(f"{path}: predictions are written as .csv or .parquet")


class PredictionWriter:
    """``write(nodes, probabilities)`` per chunk; ``finish()`` makes the file appear."""

    def __init__(self, path: Path, *, ids_of_node: np.ndarray, num_classes: int) -> None:
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

    def write(self, nodes: np.ndarray, probabilities: np.ndarray) -> None:
        ids = self.ids_of_node[np.asarray(nodes, dtype=np.int64)]
        held = np.array([i is not None for i in ids], dtype=bool)  # the nodes this party holds
        columns = [
            pa.array(ids[held].tolist(), pa.string()),
            pa.array(probabilities[held].argmax(axis=1), pa.int64()),
        ] + [pa.array(probabilities[held, c], pa.float64()) for c in range(probabilities.shape[1])]
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows += int(held.sum())

    def finish(self) -> Path:
        self._writer.close()
        move_into_place(self.partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close without making the file appear: the rows so far stay in ``<file>.partial``."""
        self._writer.close()
