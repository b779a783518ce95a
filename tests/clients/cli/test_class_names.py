"""Class names from the labels table to the predictions: `glasu prepare` numbers a column of
names (sorted) and keeps them, the alignment gives them to every party trained against those
labels, a kept model's manifest lists them and `glasu score` writes them (a `class` column and a
probability column per class name), rows in the order of --ids."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from clients.cli.main import main
from clients.local import parties
from clients.local.parties import federation_of_parties
from models.artefact import class_names, describe, load_model
from models.data.aligned import LabelConflict
from models.data.class_names import ClassNames
from models.data.party import read_meta
from models.data.planetoid import GraphDataset
from models.data.table_file import TableError
from models.keeper import model_classes
from tests.clients.cli.cora_parties import node_id, write_cora_parties
from tests.clients.cli.test_score import prepare

CUSTOMERS = [f"c-{i}" for i in range(12)]


def write_party(root: Path, name: str, labels: dict[str, str] | None) -> Path:
    """A tiny organisation: 12 customers with two features, a ring of edges, its labels."""
    folder = root / name
    folder.mkdir(parents=True)
    with (folder / "nodes.csv").open("w", newline="") as handle:
        rows = [[c, str(i), str(i % 3)] for i, c in enumerate(CUSTOMERS)]
        csv.writer(handle).writerows([["customer", f"{name}-a", f"{name}-b"], *rows])
    with (folder / "edges.csv").open("w", newline="") as handle:
        ring = [[c, CUSTOMERS[(i + 1) % len(CUSTOMERS)]] for i, c in enumerate(CUSTOMERS)]
        csv.writer(handle).writerows([["from", "to"], *ring])
    args = ["prepare", "--nodes", str(folder / "nodes.csv"), "--edges",
            str(folder / "edges.csv"), "--id-column", "customer", "--quiet",
            "--out", str(root / "prepared" / name)]  # fmt: skip
    if labels is not None:
        with (folder / "labels.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows([["customer", "status"], *labels.items()])
        args += ["--labels", str(folder / "labels.csv")]
    assert main(args) == 0
    return root / "prepared" / name


STATUS = {c: ("paid", "late", "fraud")[i % 3] for i, c in enumerate(CUSTOMERS)}


def test_prepare_numbers_class_names_in_sorted_order_and_keeps_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_party(tmp_path, "bank", STATUS)
    assert "12 labelled nodes (classes fraud, late, paid)" in capsys.readouterr().out
    assert read_meta(folder)["class_names"] == ["fraud", "late", "paid"]
    labels = np.load(folder / "labels.npy")
    assert labels[:3].tolist() == [2, 1, 0]  # paid, late, fraud
    indices = write_party(tmp_path, "insurer", {c: str(i % 2) for i, c in enumerate(CUSTOMERS)})
    assert "class_names" not in read_meta(indices)  # a column of indices stays numbers


def test_a_number_among_class_names_is_refused_by_row() -> None:
    names = ClassNames()
    names.codes(Path("labels.csv"), pa.array(["paid", "fraud"]), "status", 1)
    with pytest.raises(TableError, match=r"row 4, column 'status': '7' is a class index among"):
        names.codes(Path("labels.csv"), pa.array(["paid", "7"]), "status", 3)


def test_the_run_gives_its_class_names_to_every_party_it_trains_against_its_labels(
    tmp_path: Path,
) -> None:
    folders = [write_party(tmp_path, "bank", STATUS), write_party(tmp_path, "telco", None)]
    federation = federation_of_parties(folders, seed=0)
    assert [p.class_names for p in federation.partitions] == [("fraud", "late", "paid")] * 2
    passed = parties.worker_folders(folders, tmp_path / "passed", seed=0)
    assert [read_meta(f).get("class_names") for f in passed.folders] == [
        ["fraud", "late", "paid"]
    ] * 2
    assert "class_names" not in read_meta(folders[1])  # the telco's own folder is unchanged
    # a label holder's partners are passive: no labels, no names
    passive = parties.worker_folders(
        folders, tmp_path / "passive", seed=0, label_holder=0, passive=[1]
    )
    assert "class_names" not in read_meta(passive.folders[1])


def test_label_holders_naming_classes_differently_are_refused(tmp_path: Path) -> None:
    other = {c: ("ok", "ko")[i % 2] for i, c in enumerate(CUSTOMERS)}
    folders = [write_party(tmp_path, "bank", STATUS), write_party(tmp_path, "insurer", other)]
    with pytest.raises(LabelConflict, match="name their classes differently"):
        federation_of_parties(folders, seed=0)


def test_a_model_names_its_classes_only_where_it_holds_the_head() -> None:
    def client(holds: bool, names: tuple[str, ...] | None, count: int = 2) -> SimpleNamespace:
        return SimpleNamespace(
            network=SimpleNamespace(classifier=SimpleNamespace(out_features=count)),
            partition=SimpleNamespace(class_names=names),
            holds_labels=holds,
        )

    assert model_classes(client(True, ("no", "yes"))) == ["no", "yes"]
    assert model_classes(client(False, ("no", "yes"))) == [0, 1]
    assert model_classes(client(True, None)) == [0, 1]
    assert class_names({"classes": ["no", "yes"]}) == ["no", "yes"]
    assert class_names({"classes": [0, 1]}) is None and class_names({}) is None
    shown = describe({"classes": ["no", "yes"], "model": {"num_classes": 2}})
    assert "-> 2 classes (no, yes)" in shown  # glasu model show


CORA_CLASSES = ("case", "genetic", "neural", "probabilistic", "reinforcement", "rule", "theory")


@pytest.mark.slow  # two runs of the service and three workers (training, then scoring)
def test_scoring_writes_class_names_in_the_order_of_ids(
    tmp_path: Path, cora: GraphDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = write_cora_parties(cora, tmp_path / "tables")
    for party in ("bank", "insurer"):  # the label holders' class indices, as names
        path = tables.folders[party] / "labels.csv"
        with path.open() as handle:
            rows = list(csv.reader(handle))
        named = [rows[0]] + [[i, CORA_CLASSES[int(c)]] for i, c in rows[1:]]
        with path.open("w", newline="") as handle:
            csv.writer(handle).writerows(named)
    folders = prepare(tmp_path / "tables", tmp_path / "prepared")
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    models = tmp_path / "models"
    assert main(["train", *given, "--rounds", "4", "--eval-every", "4", "--batch-size", "64",
                 "--hidden", "16", "--model-dir", str(models), "--quiet"]) == 0  # fmt: skip
    manifest = load_model(models / "bank").manifest
    assert manifest["classes"] == list(CORA_CLASSES)
    ids = [node_id(int(n)) for n in tables.shared[[40, 3, 17, 3, 25]]]  # c-3 twice
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "predictions"
    assert main(["score", *given, "--model-dir", str(models), "--ids", str(ids_file),
                 "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err  # fmt: skip
    with (out / "bank.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["id"] for r in rows] == [ids[0], ids[1], ids[2], ids[4]]  # listed once each
    assert list(rows[0]) == ["id", "class", *[f"probability_{c}" for c in CORA_CLASSES]]
    for row in rows:
        probabilities = [row[f"probability_{c}"] for c in CORA_CLASSES]
        assert all(len(p.partition(".")[2]) <= 4 for p in probabilities)
        assert abs(sum(map(float, probabilities)) - 1) < 1e-9
        assert row["class"] in CORA_CLASSES
    assert json.loads((models / "bank" / "claim.json").read_text())["party"] == 0
