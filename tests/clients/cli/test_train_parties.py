"""`glasu train --party`: three organisations' own CSV tables (from Cora: vertical feature
slices, their own edges, string ids that are not node indices, 70% of the nodes shared), prepared
with `glasu prepare`, aligned privately and trained on their shared nodes. The alignment puts
every party's rows of one node at the same index; training reaches the accuracy of the same data
aligned by identical ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from clients.local.parties import federation_of_parties
from models.aligned import SharedIndex, aligned_federation
from models.config import TrainConfig
from models.data import GraphDataset
from models.layout import layout_federation
from models.party import read_party
from models.trainer import train_inprocess
from tests.clients.cli.cora_parties import PARTIES, CoraParties, write_cora_parties

TRAINING = ("--rounds", "60", "--eval-every", "20", "--hidden", "64", "--seed", "1")
CONFIG = TrainConfig(rounds=60, eval_every=20, hidden=64, seed=1, encryption="none", dp=False)


@pytest.fixture(scope="module")
def prepared(
    tmp_path_factory: pytest.TempPathFactory, cora: GraphDataset
) -> tuple[CoraParties, list[Path]]:
    root = tmp_path_factory.mktemp("parties")
    tables = write_cora_parties(cora, root / "tables")
    folders = []
    for party in PARTIES:
        source = tables.folders[party]
        args = ["prepare", "--nodes", str(source / "nodes.csv"), "--edges",
                str(source / "edges.csv"), "--id-column", "customer", "--quiet",
                "--out", str(root / "prepared" / party)]  # fmt: skip
        if (source / "labels.csv").exists():
            args += ["--labels", str(source / "labels.csv")]
        assert main(args) == 0
        folders.append(root / "prepared" / party)
    return tables, folders


def test_the_alignment_puts_every_partys_row_of_a_node_at_one_index(
    prepared: tuple[CoraParties, list[Path]], cora: GraphDataset
) -> None:
    tables, folders = prepared
    federation = federation_of_parties(folders, seed=0)
    n = len(tables.shared)
    assert federation.dataset.num_nodes == federation.index.aligned_nodes == n
    node_at = np.full(n, -1, dtype=np.int64)  # the Cora node behind each aligned index
    first = federation.index.rows[0]
    node_at[first[first >= 0]] = tables.nodes[PARTIES[0]][first >= 0]
    assert np.array_equal(np.sort(node_at), tables.shared)
    for m, party in enumerate(PARTIES):
        rows, nodes = federation.index.rows[m], tables.nodes[party]
        assert np.array_equal(rows >= 0, np.isin(nodes, tables.shared))
        assert np.array_equal(node_at[rows[rows >= 0]], nodes[rows >= 0])
        features = cora.features.numpy()[node_at][:, tables.columns[m]]
        np.testing.assert_array_equal(federation.partitions[m].features.numpy(), features)
    np.testing.assert_array_equal(federation.dataset.labels.numpy(), cora.labels.numpy()[node_at])


@pytest.mark.slow  # two trainings of 60 rounds: ~30 s
def test_three_parties_train_as_well_as_with_identical_ids(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tables, folders = prepared
    report = tmp_path / "report.json"
    parties = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *parties, "--transport", "inprocess", "--no-he", "--no-dp",
                 *TRAINING, "--report", str(report), "--quiet"])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0
    assert f"share {len(tables.shared)} nodes, {len(tables.shared)} of them labelled" in said
    over_psi = json.loads(report.read_text())
    assert over_psi["config"]["clients"] == 3 and over_psi["config"]["split"] == "aligned"
    # the same data, aligned by identical ids instead: the aligned index is the Cora index order
    parties = [read_party(folder) for folder in folders]
    rows = []
    for party in PARTIES:
        nodes = tables.nodes[party]
        where = np.searchsorted(tables.shared, nodes)
        where[where == len(tables.shared)] = 0
        rows.append(np.where(tables.shared[where] == nodes, where, -1).astype(np.int64))
    index = SharedIndex(None, None, len(tables.shared), rows)
    federation = aligned_federation(parties, index, names=list(PARTIES), seed=CONFIG.seed)
    layout = layout_federation(CONFIG, federation.dataset, partitions=federation.partitions)
    by_ids = train_inprocess(CONFIG, dataset=federation.dataset, layout=layout, progress=False)
    assert by_ids.test_accuracy > 0.7
    assert over_psi["test_accuracy"] == pytest.approx(by_ids.test_accuracy, abs=0.05)
