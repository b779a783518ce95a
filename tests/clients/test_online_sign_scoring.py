"""A kept private sign model in an online session, without HTTP (clients/sign_scoring.py,
models/data/derived.py): a sender's kept block over its current table is computed once per
loaded partition, kept release and keys, and every request reads its rows from it (the same
rows as a batch scoring computes); a request's pass the service states over other nodes than
the answering party signed is refused before anything is exchanged."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from nacl.signing import SigningKey

import models.private_sign_kept as private_sign_kept
from clients.request_signing import RequestCheck, sign_request
from clients.sign_scoring import KeptSignScorer
from models.artefact import SavedModel
from models.data.derived import kept_release_block
from models.private_sign_kept import KeptRelease
from models.private_sign_model import block_rows, scored_block_rows
from models.sampler import SamplingGraph
from secure.protocol import ProtocolViolation
from secure.wire.passes import PassInfo
from tests.models.test_private_sign import as_partition

NODES = 8
HOPS = 3


def ring(n: int) -> SamplingGraph:
    edges = np.array([np.arange(n), (np.arange(n) + 1) % n])
    both = np.concatenate([edges, edges[::-1]], axis=1)
    return SamplingGraph.from_edge_index(torch.from_numpy(both), num_nodes=n)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often a kept block is computed."""
    computed: list[int] = []
    compute = private_sign_kept.kept_block

    def counting(*args: Any, **kwargs: Any):
        computed.append(1)
        return compute(*args, **kwargs)

    monkeypatch.setattr(private_sign_kept, "kept_block", counting)
    return computed


def test_a_sender_computes_its_kept_block_once_for_every_request(counted: list[int]) -> None:
    rng = np.random.default_rng(0)
    partition = as_partition(ring(NODES), rng.normal(size=(NODES, 5)))
    kept = KeptRelease(torch.randn(NODES - 1, 4), np.arange(NODES - 1, dtype=np.int64))
    keys = np.arange(NODES, dtype=object)  # node 7 is a new customer: filled from neighbours

    def rows(nodes: list[int], *, of: Any = partition, named: tuple = ("ids", 1)) -> np.ndarray:
        block = kept_release_block(of, kept, keys, release="digest", keys=named, hops=HOPS)
        return block_rows(block, np.array(nodes))

    first, second = rows([7, 1]), rows([3])
    assert len(counted) == 1  # the second request reads the block the first computed
    batch = scored_block_rows(kept, keys, partition, hops=HOPS, nodes=np.array([7, 1, 3]))
    np.testing.assert_array_equal(np.concatenate([first, second]), batch)
    rows([3], named=("ids", 2))  # other keys: their own block
    relabelled = as_partition(ring(NODES), rng.normal(size=(NODES, 5)))  # another partition
    rows([3], of=relabelled)
    assert len(counted) == 3


def scorer(check: RequestCheck, status: Any) -> KeptSignScorer:
    """The answering party's scorer (it released nothing) of a request of ``status``."""
    manifest = {"design": "private-sign", "sign_release": {"file": None, "width": 2, "hops": 1}}
    return KeptSignScorer(
        as_partition(ring(NODES), np.zeros((NODES, 2))), config=None,  # type: ignore[arg-type]
        session=SimpleNamespace(label_holder=0),  # type: ignore[arg-type]
        model=SavedModel(manifest=manifest, weights={}, path=None),  # type: ignore[arg-type]
        codec=None,  # type: ignore[arg-type]
        own_ids=np.arange(NODES, dtype=object),
        check_pass=lambda info: check.check_pass(status, info),
    )  # fmt: skip


class Offers:
    """A service that states pass 0 over ``nodes``."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def pass_info(self, index: int) -> PassInfo:
        body = {"pass": index, "kind": "eval", "round": 0, "output_nodes": self.nodes}
        return PassInfo.model_validate(body)


class NoExchange:
    def answer(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("exchanged before the pass was checked")


def test_a_request_pass_over_other_nodes_than_signed_is_refused_before_any_exchange() -> None:
    key = SigningKey.generate()
    now = time.time()
    signed = sign_request(key, online_id="o", party=0, nodes=np.array([3]), now=now)
    status = SimpleNamespace(session_id="o-1", config=SimpleNamespace(request_signature=signed))
    check = RequestCheck("o", party=0, key=key.verify_key, clock=lambda: now)
    passes = scorer(check, status).session_passes(
        Offers([3, 4]),
        NoExchange(),
        masked=False,  # type: ignore[arg-type]
    )
    with pytest.raises(ProtocolViolation, match="other nodes than the signed request"):
        next(passes)
