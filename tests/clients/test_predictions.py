"""A scoring session's predictions in the party's own ids (clients/predictions.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import clients.predictions
from clients.predictions import PredictionWriter, own_ids_by_node


def test_predictions_are_written_in_own_ids_in_chunks_and_only_for_held_nodes(
    tmp_path: Path, monkeypatch
) -> None:
    # rows "c", "a", "b" at aligned nodes 4, 0, 2; the party lacks nodes 1 and 3
    ids = own_ids_by_node(np.array([4, 0, 2]), pa.array(["c", "a", "b"]), aligned_nodes=5)
    assert ids[np.array([0, 1, 4])].tolist() == ["a", None, "c"]
    monkeypatch.setattr(clients.predictions, "WRITE_ROWS", 2)
    writer = PredictionWriter(tmp_path / "p.parquet", ids_of_node=ids, num_classes=2)
    nodes = np.arange(5)
    probabilities = np.array([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    writer.write(nodes, probabilities)
    table = pq.read_table(writer.finish())
    assert writer.rows == 3
    assert table.column("id").to_pylist() == ["a", "b", "c"]
    assert table.column("predicted_class").to_pylist() == [0, 1, 1]
    assert table.column("probability_1").to_pylist() == [0.1, 0.8, 0.7]
