"""The daily flow of docs/data.md ("Keep it", "Score jointly") with the private sign design:
`glasu train --party ... --backbone sign --model-dir` under DP keeps every party's model (its
head, its noisy release), and `glasu score` on tables with new customers scores exactly them,
by post-processing of the kept releases: each owner's ledger records the scoring session with no
release (naming the training it post-processes), and no owner's budget moves."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from clients.owner_ledger import OwnerLedger, party_ledgers
from models.artefact import load_model
from models.data.planetoid import GraphDataset
from models.private_sign_model import kept_release
from tests.clients.cli.cora_parties import PARTIES, node_id, write_cora_parties
from tests.clients.cli.test_score import NEW_CUSTOMERS, add_new_customers, prepare, read_answer

# local training after the one release is cheap: enough rounds for the head to learn (measured:
# 0.77 test accuracy at the bank, 0.78 on the 50 new customers)
TRAINING = ("--backbone", "sign", "--rounds", "200", "--eval-every", "50", "--hidden", "32",
            "--hops", "2", "--epsilon", "4")  # fmt: skip


def spend(folders: list[Path]) -> list[tuple[int, float]]:
    """Each owner's (releases, sum of 1 / z^2) over its ledger's lifetime."""
    spent = []
    for path in party_ledgers(folders):
        with OwnerLedger(path) as ledger:
            spent.append((ledger.releases(), ledger.inverse_square_sum()))
    return spent


@pytest.mark.slow  # two runs of the service and three workers (training, then scoring)
def test_a_private_sign_model_is_kept_and_scores_new_customers_for_nothing(
    tmp_path: Path, cora: GraphDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = write_cora_parties(cora, tmp_path / "tables")
    folders = prepare(tmp_path / "tables", tmp_path / "prepared")
    models = tmp_path / "models"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, *TRAINING, "--model-dir", str(models), "--quiet"])
    assert code == 0, capsys.readouterr().err
    training = {load_model(models / party).manifest["session_id"] for party in PARTIES}
    assert len(training) == 1
    for party in PARTIES:
        saved = load_model(models / party)
        assert saved.manifest["design"] == "private-sign"
        release = kept_release(saved)
        assert release is not None and release.keyed_by == "ids"  # the parties' own ids
        assert set(release.keys.tolist()) <= {node_id(n) for n in range(cora.num_nodes)}
        assert saved.manifest["privacy"]["releases"] == 1

    new_ids = add_new_customers(tables, cora, tmp_path / "tables-now")
    folders_now = prepare(tmp_path / "tables-now", tmp_path / "prepared-now")
    before = spend(folders_now)
    assert [releases for releases, _ in before] == [1, 1, 1]
    ids_file = tmp_path / "new.txt"
    ids_file.write_text("\n".join(new_ids) + "\n")
    given_now = [arg for folder in folders_now for arg in ("--party", str(folder))]
    out = tmp_path / "predictions"
    capsys.readouterr()
    code = main(["score", *given_now, "--model-dir", str(models), "--ids", str(ids_file),
                 "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"scored {NEW_CUSTOMERS} shared nodes" in printed
    # the service's statement of the scoring session: no release
    assert "privacy spent by this scoring: epsilon 0 at delta" in printed
    assert "(0 releases)" in printed
    assert sorted(path.name for path in out.iterdir()) == ["bank.csv"]
    answer = read_answer(out / "bank.csv", cora.num_classes)
    assert sorted(answer) == sorted(new_ids)
    for probabilities, predicted in answer.values():
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-5)
        assert predicted == probabilities.argmax()

    assert spend(folders_now) == before  # no release, no budget spent
    for path in party_ledgers(folders_now):
        with OwnerLedger(path) as ledger:
            scorings = [
                s for s in ledger.snapshot().sessions.values() if s.get("kind") == "scoring"
            ]
        assert len(scorings) == 1
        assert scorings[0]["post_processes"] in training
        assert ledger_releases_of(path, scorings[0]["session_id"]) == 0
    # the new customers copy labelled Cora nodes (features, one edge to the node): the answer
    # reads their neighbours' kept rows and their own features at the bank (0.78 measured; a
    # majority class scores 0.3)
    labels = cora.labels.numpy()
    truth = new_customer_labels(tmp_path / "tables-now", labels)
    hits = [answer[i][1] == truth[i] for i in new_ids if truth[i] >= 0]
    assert np.mean(hits) >= 0.6


def ledger_releases_of(path: Path, session_id: str) -> int:
    with OwnerLedger(path) as ledger:
        return ledger.releases(session_id=session_id)


def new_customer_labels(tables: Path, labels: np.ndarray) -> dict[str, int]:
    """Each new customer's label: that of the Cora node it copies (its one edge's end)."""
    by_id = {node_id(n): n for n in range(len(labels))}
    with (tables / PARTIES[0] / "edges.csv").open() as handle:
        rows = list(csv.reader(handle))
    return {a: int(labels[by_id[b]]) for a, b in rows if a.startswith("new-")}


@pytest.mark.slow  # a training in process, then a scoring over the service
def test_in_process_the_kept_releases_are_keyed_by_the_parties_own_ids(
    tmp_path: Path, cora: GraphDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = write_cora_parties(cora, tmp_path / "tables")
    folders = prepare(tmp_path / "tables", tmp_path / "prepared")
    models = tmp_path / "models"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, *TRAINING, "--rounds", "20", "--transport", "inprocess",
                 "--model-dir", str(models), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    shared = {node_id(int(n)) for n in tables.shared}  # the nodes every party holds
    for party in PARTIES:
        release = kept_release(load_model(models / party))
        assert release is not None and release.keyed_by == "ids"
        assert set(release.keys.tolist()) == shared
    new_ids = add_new_customers(tables, cora, tmp_path / "tables-now")
    folders_now = prepare(tmp_path / "tables-now", tmp_path / "prepared-now")
    ids_file = tmp_path / "new.txt"
    ids_file.write_text("\n".join(new_ids) + "\n")
    given_now = [arg for folder in folders_now for arg in ("--party", str(folder))]
    out = tmp_path / "predictions"
    code = main(["score", *given_now, "--model-dir", str(models), "--ids", str(ids_file),
                 "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert sorted(read_answer(out / "bank.csv", cora.num_classes)) == sorted(new_ids)
