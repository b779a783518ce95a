"""`glasu train --party`: three organisations' own CSV tables (from Cora: vertical feature
slices, their own edges, string ids that are not node indices, 70% of the nodes shared), prepared
with `glasu prepare`, aligned privately and trained on their shared nodes. The alignment puts
every party's rows of one node at the same index; training reaches the accuracy of the same data
aligned by identical ids."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from clients.cli.main import main
from clients.local import parties
from clients.local.parties import federation_of_parties
from clients.predictions import ids_by_aligned_node
from models.config import TrainConfig
from models.data.aligned import AlignedFederation, SharedIndex, aligned_federation
from models.data.partition import load_partition, save_partition
from models.data.party import read_meta, read_party
from models.data.planetoid import GraphDataset
from models.layout import layout_federation
from models.trainer import train_inprocess
from tests.clients.cli.cora_parties import PARTIES, CoraParties, write_cora_parties

# gcnii as CONFIG: these tests compare alignments, not the recipe (which would choose sign)
TRAINING = ("--backbone", "gcnii", "--rounds", "100", "--eval-every", "25", "--batch-size", "64",
            "--hidden", "64")  # fmt: skip
CONFIG = TrainConfig(
    rounds=100, eval_every=25, batch_size=64, hidden=64, encryption="none", dp=False
)


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
        np.testing.assert_array_equal(federation.partitions[m].aligned_features().numpy(), features)
        own = tables.edges[party][:, np.isin(tables.edges[party], tables.shared).all(axis=0)]
        aligned = node_at[federation.partitions[m].edge_index.numpy()]
        assert sorted(map(tuple, aligned.T.tolist())) == sorted(map(tuple, own.T.tolist()))
    np.testing.assert_array_equal(federation.dataset.labels.numpy(), cora.labels.numpy()[node_at])


@pytest.mark.slow  # two trainings of 100 rounds: ~30 s
def test_three_parties_train_as_well_as_with_identical_ids(
    prepared: tuple[CoraParties, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    tables, folders = prepared
    built: list[AlignedFederation] = []
    align_and_build = parties.federation_of_parties

    def recording(*args, **kwargs) -> AlignedFederation:
        built.append(align_and_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(parties, "federation_of_parties", recording)
    report = tmp_path / "report.json"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, "--transport", "inprocess", "--no-he", "--no-dp", *TRAINING,
                 "--report", str(report), "--quiet"])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0
    assert f"share {len(tables.shared)} nodes, {len(tables.shared)} of them labelled" in said
    over_psi = json.loads(report.read_text())
    assert over_psi["config"]["clients"] == 3 and over_psi["config"]["split"] == "aligned"
    # The same data with identical ids: every party's rows placed by the Cora node they are
    # (the index in Cora order), trained with the same split (the same nodes) and settings.
    psi = built[0]
    first = psi.index.rows[0]
    node_at = np.empty(psi.index.aligned_nodes, dtype=np.int64)
    node_at[first[first >= 0]] = tables.nodes[PARTIES[0]][first >= 0]
    rows = []
    for party in PARTIES:
        nodes = tables.nodes[party]
        where = np.minimum(np.searchsorted(tables.shared, nodes), len(tables.shared) - 1)
        rows.append(np.where(tables.shared[where] == nodes, where, -1).astype(np.int64))
    index = SharedIndex(None, None, len(tables.shared), rows)
    by_ids = aligned_federation(
        [read_party(folder) for folder in folders], index, names=list(PARTIES), seed=0
    )
    split = {
        name: np.sort(np.searchsorted(tables.shared, node_at[getattr(psi.dataset, name)]))
        for name in ("train_nodes", "val_nodes", "test_nodes")
    }
    dataset = dataclasses.replace(by_ids.dataset, **split)
    partitions = [dataclasses.replace(part, **split) for part in by_ids.partitions]
    layout = layout_federation(CONFIG, dataset, partitions=partitions)
    identical = train_inprocess(CONFIG, dataset=dataset, layout=layout, progress=False)
    assert identical.test_accuracy > 0.75
    assert over_psi["test_accuracy"] == pytest.approx(identical.test_accuracy, abs=0.05)


@pytest.mark.slow  # the service and three worker processes, with CKKS and DP
def test_a_secure_training_over_http_on_the_parties_folders(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path
) -> None:
    _, folders = prepared
    report = tmp_path / "secure.json"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, "--rounds", "2", "--eval-every", "2", "--hidden", "32",
                 "--report", str(report), "--quiet"])  # fmt: skip
    assert code == 0
    secure = json.loads(report.read_text())
    assert secure["config"]["encryption"] == "ckks" and secure["privacy"]["enabled"]
    assert secure["rounds"] == 2 and 0 <= secure["test_accuracy"] <= 1
    # the workers read the folders: the regime's degree is the first party's own graph's, as
    # `glasu prepare` recorded it
    meta = read_meta(folders[0])
    assert secure["regime"]["party"] == "bank, the first party"
    assert secure["regime"]["degree"] == 2 * meta["undirected_edges"] / meta["num_rows"]


@pytest.mark.parametrize("aligned", ["intersection", "union"])
def test_parties_that_share_no_node_are_told_so(
    tmp_path: Path, capsys: pytest.CaptureFixture, aligned: str
) -> None:
    folders = []
    for name, ids in (("north", ["n1", "n2", "n3"]), ("south", ["s1", "s2"])):
        nodes = tmp_path / f"{name}-nodes.csv"
        nodes.write_text("id,x\n" + "".join(f"{i},1\n" for i in ids))
        edges = tmp_path / f"{name}-edges.csv"
        edges.write_text(f"a,b\n{ids[0]},{ids[1]}\n")
        labels = tmp_path / f"{name}-labels.csv"
        labels.write_text("id,y\n" + "".join(f"{i},0\n" for i in ids))
        code = main(["prepare", "--nodes", str(nodes), "--edges", str(edges), "--labels",
                     str(labels), "--id-column", "id", "--out", str(tmp_path / name)])  # fmt: skip
        assert code == 0
        folders += ["--party", str(tmp_path / name)]
    capsys.readouterr()
    code = main(["train", *folders, "--nodes", aligned, "--transport", "inprocess", "--no-he",
                 "--no-dp", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "the alignment failed: the 2 parties share no node id" in err and "'42' and '042'" in err


def test_an_alignment_over_the_union_keeps_the_nodes_some_party_lacks(
    prepared: tuple[CoraParties, list[Path]], cora: GraphDataset
) -> None:
    tables, folders = prepared
    federation = federation_of_parties(folders, seed=0, nodes="union")
    union = np.unique(np.concatenate(list(tables.nodes.values())))
    n = federation.index.aligned_nodes
    assert n == union.size == federation.dataset.num_nodes
    node_at = np.full(n, -1, dtype=np.int64)
    for m, party in enumerate(PARTIES):
        rows = federation.index.rows[m]
        assert (rows >= 0).all() and np.unique(rows).size == rows.size
        node_at[rows] = tables.nodes[party]
    assert np.array_equal(np.sort(node_at), union)  # one index per node, the same at all
    for m, party in enumerate(PARTIES):
        part = federation.partitions[m]
        held = np.isin(node_at, tables.nodes[party])
        assert part.held is not None and np.array_equal(part.held, held)
        features = cora.features.numpy()[node_at][:, tables.columns[m]] * held[:, None]
        np.testing.assert_array_equal(part.aligned_features().numpy(), features)
        assert held[part.edge_index.numpy()].all()
    assert (
        "the union" in federation.summary and f"{len(tables.shared)} of them" in federation.summary
    )


@pytest.mark.slow  # the service and three worker processes, with CKKS and DP: ~40 s
def test_a_secure_training_over_the_union_of_the_parties_nodes(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tables, folders = prepared
    report = tmp_path / "union.json"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, "--nodes", "union", "--rounds", "4", "--eval-every", "2",
                 "--hidden", "32", "--report", str(report), "--quiet"])  # fmt: skip
    assert code == 0
    union = np.unique(np.concatenate(list(tables.nodes.values())))
    assert f"hold {union.size} nodes together (the union)" in capsys.readouterr().out
    secure = json.loads(report.read_text())
    assert secure["config"]["nodes"] == "union" and secure["privacy"]["enabled"]
    assert secure["rounds"] == 4 and 0 <= secure["test_accuracy"] <= 1


@pytest.mark.slow  # two trainings of 100 rounds in process: ~30 s
def test_the_union_trains_at_least_as_well_as_the_intersection(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path
) -> None:
    _, folders = prepared
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    accuracy = {}
    for nodes in ("intersection", "union"):
        report = tmp_path / f"{nodes}.json"
        code = main(["train", *given, "--nodes", nodes, "--transport", "inprocess", "--no-he",
                     "--no-dp", *TRAINING, "--report", str(report), "--quiet"])  # fmt: skip
        assert code == 0
        accuracy[nodes] = json.loads(report.read_text())["test_accuracy"]
    assert accuracy["union"] > 0.75
    # each run's split is drawn over an alignment order that the PSI's fresh keys set, so one
    # run's test accuracy moves by a few points (measured 0.81-0.86 over the intersection,
    # 0.79-0.86 over the union): the margin covers that spread of a difference of two runs
    assert accuracy["union"] >= accuracy["intersection"] - 0.08


def test_with_a_label_holder_only_its_labels_make_the_split(
    prepared: tuple[CoraParties, list[Path]],
) -> None:
    tables, folders = prepared
    holder = PARTIES.index("insurer")
    federation = federation_of_parties(folders, seed=0, label_holder=holder)
    labelled = np.isin(tables.nodes["insurer"], tables.shared).sum()
    split = federation.dataset
    assert split.train_nodes.size + split.val_nodes.size + split.test_nodes.size == labelled
    with pytest.raises(ValueError, match="telco carries no labels"):
        federation_of_parties(folders, seed=0, label_holder=PARTIES.index("telco"))


@pytest.mark.parametrize("label_holder", [None, 0])
def test_the_workers_folders_hold_what_the_written_partitions_held(
    prepared: tuple[CoraParties, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    label_holder: int | None,
) -> None:
    """Passed through (links to the parties' own files, the run's labels and alignment), each
    worker loads the partition it loaded from its partition written whole by `glasu train`."""
    _, folders = prepared
    index = federation_of_parties(folders, seed=3).index
    monkeypatch.setattr(parties, "_aligned_index", lambda *a, **k: index)
    config = dataclasses.replace(CONFIG, label_holder=label_holder)
    federation = federation_of_parties(folders, seed=3, label_holder=label_holder)
    layout = layout_federation(config, federation.dataset, partitions=federation.partitions)
    passive = [] if label_holder is None else [m for m in range(3) if m != label_holder]
    passed = parties.worker_folders(
        folders, tmp_path / "passed", seed=3, label_holder=label_holder, passive=passive
    )
    assert passed.summary == federation.summary
    assert passed.dataset.num_nodes == federation.dataset.num_nodes
    for nodes in ("train_nodes", "val_nodes", "test_nodes"):
        assert np.array_equal(getattr(passed.dataset, nodes), getattr(federation.dataset, nodes))
    for m, part in enumerate(layout.partitions):
        written = load_partition(save_partition(part, tmp_path / "written"), require_labels=False)
        read = load_partition(passed.folders[m], require_labels=False)
        assert read.digest() == written.digest() and read.held is None
        for name in ("train_nodes", "val_nodes", "test_nodes", "feature_columns"):
            assert np.array_equal(getattr(read, name), getattr(written, name))
        assert read.feature_names == written.feature_names
        assert (passed.folders[m] / "features.npy").resolve() == folders[m] / "features.npy"


def test_the_workers_folders_keep_the_alignments_digest_for_the_models(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model `glasu train --party` keeps names the alignment it was trained on (`glasu model
    show`), not "a benchmark partition"."""
    _, folders = prepared
    index = federation_of_parties(folders, seed=3).index
    monkeypatch.setattr(parties, "_aligned_index", lambda *a, **k: index)
    passed = parties.worker_folders(folders, tmp_path / "passed", seed=3)
    assert index.digest is not None
    for folder in passed.folders:
        assert ids_by_aligned_node(folder)[1] == index.digest


def test_a_private_run_reports_the_party_alone_the_gain_and_the_regime_of_its_data(
    prepared: tuple[CoraParties, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """DP on (encryption off, in process): the summary and the JSON report give the party-alone
    reference, the gain and the scale map's regime of the label holder's own data."""
    tables, folders = prepared
    holder = PARTIES.index("insurer")
    report = tmp_path / "private.json"
    given = [arg for folder in folders for arg in ("--party", str(folder))]
    code = main(["train", *given, "--label-holder", str(holder), "--transport", "inprocess",
                 "--no-he", "--rounds", "2", "--eval-every", "2", "--batch-size", "64",
                 "--hidden", "32", "--report", str(report), "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    written = json.loads(report.read_text())
    assert written["privacy"]["enabled"]
    alone, gain = written["reference_test_accuracy"], written["gain"]
    assert f"test accuracy {alone:.4f}; gain from federating {100 * gain:+.1f} points" in out
    regime = written["regime"]
    assert regime["party"] == "insurer, the label holder"
    assert regime["nodes"] == len(tables.shared)
    assert regime["epsilon"] == pytest.approx(written["privacy"]["epsilon"])
    assert 0 < regime["labelled"] < 1 and regime["degree"] > 0
    assert regime["nearest"]["nodes"] == 20_000 and regime["nearest"]["outside"]
    assert regime["sentence"] in out.splitlines()
    assert regime["sentence"].startswith(
        f"Scale map (docs/privacy.md, section 1.5): your data (insurer, the label holder: "
        f"{len(tables.shared):,} nodes"
    )
    assert "lies outside the map" in regime["sentence"]
