"""Using a trained model: `glasu train --model-dir` keeps each party's part (weights and a
manifest), `glasu model show` describes it, and `glasu score` scores customers jointly over the
service, new customers included, with predictions in each head holder's own ids."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from models.artefact import load_model
from models.data.planetoid import GraphDataset
from tests.clients.cli.cora_parties import PARTIES, CoraParties, node_id, write_cora_parties

TRAINING = ("--rounds", "12", "--eval-every", "4", "--batch-size", "64", "--hidden", "32")
NEW_CUSTOMERS = 50


def prepare(tables: Path, out: Path) -> list[Path]:
    folders = []
    for party in PARTIES:
        source = tables / party
        args = ["prepare", "--nodes", str(source / "nodes.csv"), "--edges",
                str(source / "edges.csv"), "--id-column", "customer", "--quiet",
                "--out", str(out / party)]  # fmt: skip
        if (source / "labels.csv").exists():
            args += ["--labels", str(source / "labels.csv")]
        assert main(args) == 0
        folders.append(out / party)
    return folders


def add_new_customers(tables: CoraParties, cora: GraphDataset, root: Path) -> list[str]:
    """Copy every party's tables and append the same NEW_CUSTOMERS customers to each: features
    of existing Cora nodes (each party its own columns), an edge to that node; no label."""
    rng = np.random.default_rng(3)
    like = rng.choice(tables.shared, size=NEW_CUSTOMERS, replace=False)
    new_ids = [f"new-{i:03d}" for i in range(NEW_CUSTOMERS)]
    features = cora.features.numpy()
    for m, party in enumerate(PARTIES):
        target = root / party
        shutil.copytree(tables.folders[party], target)
        with (target / "nodes.csv").open("a", newline="") as handle:
            writer = csv.writer(handle)
            for new, node in zip(new_ids, like, strict=True):
                writer.writerow([new, *[f"{v:g}" for v in features[node, tables.columns[m]]]])
        with (target / "edges.csv").open("a", newline="") as handle:
            writer = csv.writer(handle)
            for new, node in zip(new_ids, like, strict=True):
                writer.writerow([new, node_id(int(node))])
    return new_ids


@pytest.mark.slow  # two runs of the service and three workers (training, then scoring)
def test_train_keep_the_models_add_customers_and_score_exactly_them(
    tmp_path: Path, cora: GraphDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = write_cora_parties(cora, tmp_path / "tables")
    folders = prepare(tmp_path / "tables", tmp_path / "prepared")
    models = tmp_path / "models"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    assert main(["train", *given, *TRAINING, "--model-dir", str(models), "--quiet"]) == 0
    for m, party in enumerate(PARTIES):
        saved = load_model(models / party)
        assert saved.manifest["features"]["names"] == [f"f{c}" for c in tables.columns[m]]
        assert saved.manifest["privacy"]["epsilon"] <= 4.0 + 1e-9
        assert saved.manifest["best"]["round"] in (4, 8, 12)
    capsys.readouterr()
    assert main(["model", "show", str(models / "bank")]) == 0
    shown = capsys.readouterr().out
    assert "party 0 of 3 (holds the classification head)" in shown
    assert "privacy spent by the training: epsilon" in shown

    new_ids = add_new_customers(tables, cora, tmp_path / "tables-now")
    folders_now = prepare(tmp_path / "tables-now", tmp_path / "prepared-now")
    ids_file = tmp_path / "new.txt"
    ids_file.write_text("\n".join(new_ids) + "\n")
    given_now = [arg for folder in folders_now for arg in ("--party", str(folder))]
    out = tmp_path / "predictions"
    code = main(["score", *given_now, "--model-dir", str(models), "--ids", str(ids_file),
                 "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    print(printed)
    assert f"scored {NEW_CUSTOMERS} shared nodes" in printed
    assert "privacy spent by this scoring: epsilon" in printed
    for party in ("bank", "insurer", "telco"):  # every party holds a head (labels merged)
        with (out / f"{party}.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert sorted(r["id"] for r in rows) == sorted(new_ids)
        probabilities = np.array(
            [[float(r[f"probability_{c}"]) for c in range(cora.num_classes)] for r in rows]
        )
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        assert [int(r["predicted_class"]) for r in rows] == probabilities.argmax(1).tolist()
