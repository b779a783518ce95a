"""A scoring session's predictions in the party's own ids (clients/predictions.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import clients.predictions
from clients.predictions import (
    PredictionWriter,
    own_ids_by_node,
    prediction_table,
    rounded_probabilities,
)


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
    # in the party's own table order (c, a, b), whatever order the nodes were scored in
    assert table.column("id").to_pylist() == ["c", "a", "b"]
    assert table.column("predicted_class").to_pylist() == [1, 0, 1]
    assert table.column("probability_1").to_pylist() == [0.7, 0.1, 0.8]
    assert not writer.partial.exists()


def test_rows_follow_the_table_whatever_the_chunks_and_classes_keep_their_names(
    tmp_path: Path, monkeypatch
) -> None:
    """A model whose labels table named the classes: a `class` column with the name and one
    probability column per class name; rows in the table's order across chunks; CSV."""
    ids = own_ids_by_node(np.array([2, 0, 1]), pa.array(["c-9", "c-1", "c-5"]), aligned_nodes=3)
    monkeypatch.setattr(clients.predictions, "WRITE_ROWS", 1)
    writer = PredictionWriter(
        tmp_path / "p.csv", ids_of_node=ids, num_classes=2, class_names=["fraud", "paid"]
    )
    writer.write(np.array([2]), np.array([[0.25, 0.75]]))  # c-9, the party's first row
    writer.write(np.array([1, 0]), np.array([[0.9, 0.1], [0.4, 0.6]]))  # c-5, c-1
    with writer.finish().open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["id"] for r in rows] == ["c-9", "c-1", "c-5"]
    assert list(rows[0]) == ["id", "class", "probability_fraud", "probability_paid"]
    assert [r["class"] for r in rows] == ["paid", "paid", "fraud"]
    assert [r["probability_paid"] for r in rows] == ["0.75", "0.6", "0.1"]


def test_probabilities_are_rounded_to_four_places_and_still_sum_to_one() -> None:
    probabilities = np.array([[1 / 3, 1 / 3, 1 / 3], [0.123456, 0.876544, 0.0], [0.5, 0.5, 0]])
    rounded = rounded_probabilities(probabilities)
    assert rounded.tolist()[0] == [0.3334, 0.3333, 0.3333]
    assert rounded.tolist()[1] == [0.1235, 0.8765, 0.0]
    np.testing.assert_array_equal(rounded, np.round(rounded, 4))  # what a CSV shows
    np.testing.assert_allclose(rounded.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    many = np.random.default_rng(0).dirichlet(np.ones(7), size=1000)
    assert np.abs(rounded_probabilities(many) - many).max() < 1e-4
    np.testing.assert_allclose(rounded_probabilities(many).sum(axis=1), 1.0, atol=1e-12)
    # the predicted class is the model's most probable one, even where rounding ties it
    table = prediction_table(pa.array(["x"]), np.array([[0.49999, 0.50001]]), ["no", "yes"])
    assert table.column("class").to_pylist() == ["yes"]


def test_a_model_s_class_names_must_fit_its_classes(tmp_path: Path) -> None:
    ids = own_ids_by_node(np.array([0]), pa.array(["a"]), aligned_nodes=1)
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        PredictionWriter(tmp_path / "p.csv", ids_of_node=ids, num_classes=3, class_names="ab")
