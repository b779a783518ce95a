"""Behind a proxy with a 1 MiB body limit: `glasu train --party` with the service's limit set to
1 MiB (GLASU_MAX_BODY_BYTES, which the `glasu serve` it starts and its alignment read) aligns and
trains parties of tens of thousands of nodes with CKKS and DP on. Every body that grows with the
nodes (the alignment's blinded sets, each release's encrypted share) travels in parts the
service sized to its limit and stated in its descriptions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.cli.main import main
from models.data.csbm import csbm
from secure.psi import ELEMENT_BYTES
from tests.clients.cli.cora_parties import PARTIES, write_cora_parties
from tests.clients.cli.test_score import prepare

LIMIT = 2**20
NODES = 48_000  # 70% held by all three parties, each the owner of a third of the rest
RELEASE_WIDTH = 16


@pytest.mark.slow  # tens of thousands of ids through the PSI, a service and three workers: ~1 min
def test_parties_of_tens_of_thousands_of_nodes_train_under_a_one_mib_body_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = csbm(nodes=NODES, features=12, degree=4, seed=1)
    tables = write_cora_parties(graph, tmp_path / "tables")
    folders = prepare(tmp_path / "tables", tmp_path / "prepared")
    held = min(len(tables.nodes[party]) for party in PARTIES)
    # what the fixed sizes made of it: a set whole, an evaluation release in one part
    assert held * ELEMENT_BYTES > LIMIT
    assert len(tables.shared) * RELEASE_WIDTH * 4 > LIMIT  # even as float32, not CKKS (~6 B)
    monkeypatch.setenv("GLASU_MAX_BODY_BYTES", str(LIMIT))
    report = tmp_path / "report.json"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, "--rounds", "2", "--eval-every", "2", "--batch-size", "64",
                 "--hidden", "16", "--release-width", str(RELEASE_WIDTH), "--report",
                 str(report), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    trained = json.loads(report.read_text())
    assert trained["config"]["encryption"] == "ckks" and trained["privacy"]["enabled"]
    assert trained["rounds"] == 2 and 0 <= trained["test_accuracy"] <= 1
