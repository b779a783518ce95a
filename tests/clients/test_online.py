"""The answering party's side of online scoring (clients/online.py), without a service: its own
ids to the aligned nodes of its kept alignment, in the asked order; ids it lacks are refused by
name, all of them, before anything is asked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.online import UnknownIds, aligned_nodes_of
from models.config import TrainConfig
from models.data.partition import save_partition
from models.layout import layout_federation


@pytest.fixture
def party(cora, tmp_path: Path) -> Path:
    """Client 1 of a Cora federation: ids "0".."2707", aligned to themselves."""
    config = TrainConfig(clients=2, encryption="none", dp=False, device="cpu")
    return save_partition(layout_federation(config, cora).partitions[1], tmp_path)


def test_own_ids_map_to_aligned_nodes_in_the_asked_order(party: Path) -> None:
    nodes = aligned_nodes_of(party, ["2701", "5", "1708"])
    assert nodes.tolist() == [2701, 5, 1708] and nodes.dtype == np.int64


def test_every_unknown_id_is_named_and_nothing_is_mapped(party: Path) -> None:
    with pytest.raises(UnknownIds) as refused:
        aligned_nodes_of(party, ["5", "no-such-customer", "2708"])
    assert refused.value.ids == ["no-such-customer", "2708"]
    assert "'no-such-customer', '2708'" in str(refused.value)
