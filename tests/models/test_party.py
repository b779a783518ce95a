"""The organisations' folder format (models/data/party.py): what a worker loads from a prepared and
aligned folder, and the errors of a folder that is not aligned or lacks labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.data.aligned import SharedIndex, aligned_federation, merged_labels
from models.data.partition import load_partition
from models.data.party import PartyData, read_alignment, read_party, write_alignment, write_party
from models.data.shared_split import deployed_alignment, split_nodes


def party(ids: list[str], labels: list[int], offset: float = 0.0) -> PartyData:
    n = len(ids)
    chain = np.array([[i, i + 1] for i in range(n - 1)]).T
    return PartyData(
        ids=ids,
        features=(np.arange(n, dtype=np.float32) + offset).reshape(n, 1),
        feature_names=["x"],
        edges=np.concatenate([chain, chain[::-1]], axis=1).astype(np.int64),
        labels=np.asarray(labels, dtype=np.int64),
    )


def test_an_aligned_folder_loads_over_the_shared_index(tmp_path: Path) -> None:
    data = party(["d", "a", "x", "b"], [1, 0, 1, 1])
    write_party(data, tmp_path)
    with pytest.raises(ValueError, match="not aligned: run `glasu align`"):
        load_partition(tmp_path)
    rows = np.array([2, 0, -1, 1])  # row 2 ("x") is not shared
    alignment = deployed_alignment(
        alignment_id="a1", party=1, parties=2, digest="00", rows=rows, seed=3
    )
    write_alignment(alignment, tmp_path)
    assert read_party(tmp_path).ids == ["d", "a", "x", "b"]
    part = load_partition(tmp_path)
    assert part.client == 1 and part.clients == 2 and part.num_nodes == 3
    assert part.aligned_features()[:, 0].tolist() == [1.0, 3.0, 0.0]  # rows a, b, d
    assert part.feature_rows(np.array([2, 0]))[:, 0].tolist() == [0.0, 1.0]
    assert part.features.shape[0] == 4  # the party's rows, read through the aligned order
    assert part.labels.tolist() == [0, 1, 1]
    # the chain d-a-x-b keeps the edges between shared nodes only: d-a
    assert sorted(map(tuple, part.edge_index.T.tolist())) == [(0, 2), (2, 0)]
    train, _, test = split_nodes(np.arange(3), seed=3)
    assert np.array_equal(part.train_nodes, train) and np.array_equal(part.test_nodes, test)
    assert read_alignment(tmp_path, rows=4).digest == "00"


def test_a_deployed_party_needs_a_label_for_every_shared_node(tmp_path: Path) -> None:
    write_party(party(["a", "b", "c"], [0, -1, 1]), tmp_path)
    rows = np.array([0, 1, 2])
    write_alignment(
        deployed_alignment(alignment_id="a", party=0, parties=2, digest="0", rows=rows, seed=0),
        tmp_path,
    )
    with pytest.raises(ValueError, match="no label for 1 of the aligned"):
        load_partition(tmp_path)


def test_a_broken_alignment_is_named(tmp_path: Path) -> None:
    write_party(party(["a", "b"], [0, 1]), tmp_path)
    rows = np.array([0, 0])  # two rows at one shared node
    write_alignment(
        deployed_alignment(alignment_id="a", party=0, parties=2, digest="0", rows=rows, seed=0),
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"aligned\.npy does not map rows one to one"):
        load_partition(tmp_path)


def test_label_holders_are_merged_and_must_agree() -> None:
    names = ["bank", "insurer", "telco"]
    bank = party(["a", "b", "c"], [0, 1, -1])
    telco = party(["q", "r", "s"], [-1, -1, -1], offset=10)
    # shared node 0 is bank's a, insurer's x, telco's q; node 1: b, y, r; node 2: c, z, s
    rows = [np.array([0, 1, 2]), np.array([2, 1, 0]), np.array([0, 1, 2])]
    index = SharedIndex("a", "d", 3, rows)
    clashing = party(["z", "y", "x"], [-1, 2, 1])
    with pytest.raises(ValueError, match="bank and insurer label 2 shared node"):
        merged_labels([bank, clashing, telco], index, names)
    with pytest.raises(ValueError, match="bank's id 'a' has label 0 and insurer's id 'x' has"):
        merged_labels([bank, clashing, telco], index, names)
    insurer = party(["z", "y", "x"], [3, 1, 0])  # agrees with the bank, and labels c (= z)
    assert merged_labels([bank, insurer, telco], index, names).tolist() == [0, 1, 3]
    federation = aligned_federation([bank, insurer, telco], index, names=names, seed=0)
    assert all(p.labels.tolist() == [0, 1, 3] for p in federation.partitions)
    assert federation.partitions[1].aligned_features()[:, 0].tolist() == [2.0, 1.0, 0.0]
    assert federation.partitions[2].aligned_features()[:, 0].tolist() == [10.0, 11.0, 12.0]
    assert federation.dataset.features.shape == (3, 3)
    assert "share 3 nodes, 3 of them labelled" in federation.summary
