"""Keeping a private sign model (models/private_sign_model.py) and its kept release
(models/private_sign_kept.py KeptRelease): the in-process run keeps every party's folder (a
receiver's head, a sender's noisy release and its digest), which loads back as it was kept;
scoring from the kept releases alone gives the best evaluation's predictions; a kept row follows
its id, not its position, after a re-alignment with new customers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.local.session import session_view
from clients.session_fit import LocalModelOptions, client_config_from_session, options_of_model
from models.artefact import ModelError, describe, load_model, read_evaluation
from models.config import TrainConfig
from models.keeper import KeepModels
from models.layout import layout_federation
from models.private_sign_kept import RELEASE_FILE, KeptRelease
from models.private_sign_model import kept_head_outcome, kept_release, scored_block_rows
from models.trainer import train_inprocess

CONFIG = TrainConfig(
    backbone="sign", layers=1, agg_layers=1, hops=2, hidden=16, batch_size=140, rounds=6,
    eval_every=3, encryption="none", epsilon=4.0, device="cpu", label_holder=0,
    seed=5, release_width=8,
)  # fmt: skip


@pytest.fixture(scope="module")
def kept(cora, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], object]:
    torch.set_num_threads(1)
    layout = layout_federation(CONFIG, cora)
    root = tmp_path_factory.mktemp("sign-models")
    folders = [root / f"client-{m}" for m in range(CONFIG.clients)]
    keep = KeepModels(
        folders=folders, session_config=session_view(CONFIG, layout, cora), session_id="s"
    )
    train_inprocess(CONFIG, dataset=cora, layout=layout, progress=False, keep=keep)
    return folders, layout


def test_every_party_keeps_its_part_and_it_loads_back(kept) -> None:
    folders, _ = kept
    holder, *senders = (load_model(folder) for folder in folders)
    assert holder.manifest["design"] == "private-sign"
    assert holder.manifest["party"]["holds_head"] is True
    for saved in (holder, *senders):  # the federation's parties, not the head's own view
        assert (saved.manifest["party"]["parties"], saved.manifest["party"]["label_holder"]) == (
            3,
            0,
        )
        assert saved.manifest["model"]["agg_layers"] == [1]
    assert "scale.factor" in holder.weights
    assert holder.manifest["sign_release"]["file"] is None  # the holder released nothing
    assert kept_release(holder) is None
    assert (holder.manifest["privacy"]["releases"], holder.manifest["privacy"]["epsilon"]) == (0, 0)
    assert holder.manifest["session_config"]["kind"] == "release"
    for saved in senders:
        sign = saved.manifest["sign_release"]
        assert saved.manifest["party"]["holds_head"] is False and saved.weights == {}
        assert (sign["width"], sign["hops"], sign["rows_keyed_by"]) == (8, 2, "nodes")
        assert "epsilon 0" in sign["scoring"]
        release = kept_release(saved)
        assert release is not None and release.h1.shape == (2708, 8)
        assert release.h1.dtype == torch.float32
        np.testing.assert_array_equal(release.keys, np.arange(2708))
        assert "keeps its noisy release (2708 rows, keyed by nodes)" in describe(saved.manifest)
        assert saved.manifest["privacy"]["releases"] == 1


def test_a_changed_release_file_is_refused(kept, tmp_path: Path) -> None:
    folders, _ = kept
    copy = tmp_path / "client-1"
    copy.mkdir()
    for item in folders[1].iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    release = KeptRelease.read(copy / RELEASE_FILE)
    changed = KeptRelease(release.h1 + 1.0, release.keys)
    (copy / RELEASE_FILE).write_bytes(changed.to_bytes())
    with pytest.raises(ModelError, match="not the release the model kept"):
        kept_release(load_model(copy))


def test_scoring_from_the_kept_releases_gives_the_best_evaluation(kept) -> None:
    """The same table: every row covered, so the senders' blocks are the training's and the
    holder's head predicts as at its best evaluation pass."""
    folders, layout = kept
    nodes, expected = read_evaluation(folders[0])
    parts = layout.partitions
    received = sum(
        scored_block_rows(
            kept_release(load_model(folders[m])), np.arange(2708, dtype=object), parts[m],
            hops=2, nodes=nodes,
        )
        for m in (1, 2)
    )  # fmt: skip
    holder = load_model(folders[0])
    options = options_of_model(holder, LocalModelOptions())
    config = client_config_from_session(holder.manifest["session_config"], options)
    outcome = kept_head_outcome(holder, parts[0], config, torch.from_numpy(received), nodes=nodes)
    np.testing.assert_allclose(outcome.probabilities, expected, atol=1e-5)


def test_a_kept_row_follows_its_id_not_its_position() -> None:
    h1 = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    release = KeptRelease.of(h1, np.array(["a", "b", None, "d"], dtype=object))
    assert release.keys.tolist() == ["a", "b", "d"]  # a node the party lacks is not kept
    # re-aligned: new customers first, the old ones in another order, one of them gone
    rows, covered = release.in_current_order(
        np.array(["new-1", "d", None, "a", "new-2"], dtype=object)
    )
    assert covered.tolist() == [False, True, False, True, False]
    assert torch.equal(rows[1], h1[3]) and torch.equal(rows[3], h1[0])
    assert torch.equal(rows[[0, 2, 4]], torch.zeros(3, 2))


def test_a_kept_release_round_trips_by_ids_and_by_nodes(tmp_path: Path) -> None:
    h1 = torch.randn(3, 2)
    for keys in (np.array(["x", "yy", "z"]), np.array([4, 0, 7], dtype=np.int64)):
        path = tmp_path / "release.npz"
        path.write_bytes(KeptRelease(h1, keys).to_bytes())
        back = KeptRelease.read(path)
        assert torch.equal(back.h1, h1)
        np.testing.assert_array_equal(back.keys, keys)
    with np.load(path, allow_pickle=False) as saved:  # no pickle needed to read it
        assert sorted(saved.files) == ["h1", "nodes"]
    with pytest.raises(ValueError, match="twice"):
        KeptRelease(h1, np.array(["x", "x", "z"]))


def test_a_new_customer_row_is_filled_from_its_neighbours_not_its_features(kept) -> None:
    """Sender 1's block of a node it no longer covers (as a new customer) is the same whatever
    its features, and differs from its kept row's block."""
    folders, layout = kept
    part = layout.partitions[1]
    release = kept_release(load_model(folders[1]))
    keys = np.arange(2708, dtype=object)
    keys[7] = 10**6  # node 7 is now a new customer: no kept row
    changed = part.features.clone()
    changed[7] = 100.0
    rows = [
        scored_block_rows(
            release, keys, dataclasses.replace(part, features=f), hops=2, nodes=np.array([7])
        )
        for f in (part.features, changed)
    ]
    np.testing.assert_array_equal(rows[0], rows[1])
    covered = scored_block_rows(release, np.arange(2708, dtype=object), part, hops=2,
                                nodes=np.array([7]))  # fmt: skip
    assert not np.allclose(rows[0], covered)
