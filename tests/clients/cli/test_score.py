"""Using a trained model: `glasu train --model-dir` keeps each party's part (weights and a
manifest), `glasu model show` describes it, and `glasu score` scores customers jointly over the
service, new customers included: one answer per customer, the answering party's, which its
partners receive in their own ids only with --share-predictions label-holder."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from models.artefact import load_model
from models.data.planetoid import GraphDataset
from secure.aggregation import SHARE_GRID
from tests.clients.cli.cora_parties import PARTIES, CoraParties, node_id, write_cora_parties

# gcnii: the per-pass design, whose scoring is a release (the default under DP, the private sign
# design, scores by post-processing: tests/clients/cli/test_score_private_sign.py)
TRAINING = (
    "--backbone", "gcnii", "--rounds", "12", "--eval-every", "4", "--batch-size", "64",
    "--hidden", "32",
)  # fmt: skip
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
    # one answer per customer: the first party's (every party holds labels, none is the holder)
    assert sorted(path.name for path in out.iterdir()) == ["bank.csv"]
    answer = read_answer(out / "bank.csv", cora.num_classes)
    assert sorted(answer) == sorted(new_ids)
    for probabilities, predicted in answer.values():
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-5)
        assert predicted == probabilities.argmax()

    # shared with the partners: each gets the same answer, in its own ids (here the same text)
    shared = tmp_path / "shared"
    code = main(["score", *given_now, "--model-dir", str(models), "--ids", str(ids_file),
                 "--out", str(shared), "--share-predictions", "label-holder",
                 "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    answer = read_answer(shared / "bank.csv", cora.num_classes)
    for party in ("insurer", "telco"):
        received = read_answer(shared / f"{party}.csv", cora.num_classes)
        assert sorted(received) == sorted(answer)
        for customer, (probabilities, predicted) in received.items():
            np.testing.assert_allclose(probabilities, answer[customer][0], atol=SHARE_GRID)
            assert predicted == answer[customer][1]


def read_answer(path: Path, classes: int) -> dict[str, tuple[np.ndarray, int]]:
    """Each customer's class probabilities and predicted class in a predictions file."""
    with path.open() as handle:
        return {
            row["id"]: (
                np.array([float(row[f"probability_{c}"]) for c in range(classes)]),
                int(row["predicted_class"]),
            )
            for row in csv.DictReader(handle)
        }
