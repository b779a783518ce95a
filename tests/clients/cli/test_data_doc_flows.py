"""docs/data.md's one-machine flow runs as written: its `glasu` commands, taken from the page in
order (the worked example, then "Using the model"), run in a folder holding the tables the page
names (three organisations built from Cora), new customers included; the one change is fewer
training rounds (:data:`FEWER_ROUNDS`). The deployed commands need a server of their own:
tests/e2e/test_scoring.py runs the deployed scoring."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from clients.cli.main import main
from models.data.planetoid import GraphDataset
from tests.clients.cli.cora_parties import PARTIES, write_cora_parties
from tests.clients.cli.test_data_doc import DOC, invocations
from tests.clients.cli.test_score import add_new_customers

#: The only values changed in the page's commands: a test trains for a few rounds
FEWER_ROUNDS = {"--rounds": "4", "--eval-every": "2"}


def one_machine_flow(text: str) -> list[list[str]]:
    """The page's one-machine commands in order: every `glasu` line from the worked example
    on, except those talking to a server (deployed) and the trainings that keep no model
    (the flow goes on from the one with --model-dir; a `budget` before it has nothing to read)."""
    start = text.index("## Worked example")
    commands = [argv for argv in invocations(text[start:]) if "--server" not in argv]
    kept, trained = [], False
    for argv in commands:
        if argv[0] == "train":
            if "--model-dir" not in argv:
                continue
            trained = True
        if argv[0] == "budget" and not trained:
            continue
        previous = ["", *argv[:-1]]
        kept.append([FEWER_ROUNDS.get(flag, arg) for flag, arg in zip(previous, argv, strict=True)])
    return kept


@pytest.mark.slow  # a training and a scoring of three parties on Cora, each a federation
def test_the_one_machine_flow_runs_as_written_with_new_customers(
    tmp_path: Path,
    cora: GraphDataset,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tables = write_cora_parties(cora, tmp_path)  # bank/nodes.csv, ... as the page names them
    monkeypatch.chdir(tmp_path)
    flow = one_machine_flow(DOC.read_text())
    assert [argv[0] for argv in flow] == [
        "prepare", "prepare", "prepare", "train", "model",
        "prepare", "prepare", "prepare", "score", "budget",
    ]  # fmt: skip
    new_ids: list[str] = []
    for argv in flow:
        if argv[0] == "prepare" and argv[-1].startswith("current/") and not new_ids:
            # "Suppose every organisation has since added 50 new customers to its tables"
            new_ids = add_new_customers(tables, cora, tmp_path / "now")
            for party in PARTIES:
                shutil.rmtree(tmp_path / party)
                (tmp_path / "now" / party).rename(tmp_path / party)
            Path("new-customers.txt").write_text("\n".join(new_ids) + "\n")
        code = main([*argv, "--quiet"] if argv[0] in ("prepare", "train", "score") else argv)
        assert code == 0, (argv, capsys.readouterr().err)
        shown = capsys.readouterr().out
        if argv[0] == "model":
            assert "its predictions are the model's answer" in shown
        if argv[0] == "score":
            assert f"scored {len(new_ids)} shared nodes" in shown
        if argv[:2] == ["budget", "--local"] and argv[2].startswith("current/"):
            assert "in 2 session(s)" in shown  # the training's and the scoring's
            # the default design's scoring post-processes the training's release
            assert "0 release(s), epsilon = 0, post-processing of session" in shown
    # one answer per customer: the bank's (the first party, every party holding labels)
    assert sorted(path.name for path in Path("predictions").iterdir()) == ["bank.csv"]
    with Path("predictions/bank.csv").open() as handle:
        assert sorted(row["id"] for row in csv.DictReader(handle)) == sorted(new_ids)
