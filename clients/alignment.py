"""Private entity alignment, one party's side (docs/protocol.md, "Alignment"; the service's side
is ``service/alignment.py``).

Party m of M, with a fresh secret key: hashes each of its own node ids into ristretto255
(``secure/psi.py``), blinds them, shuffles them with a secret permutation and posts them (hop 0).
Then, for hops 1..M-1, it fetches the set of party m - h blinded by parties m - h .. m - 1,
blinds it in place (the order stays, so that its owner can find its rows again) and posts it.
Last it fetches, for each position of the set it posted, the index of that id in the aligned
node index (-1 where not every party holds it), and undoes its permutation. The ids, their
hashes and anything blinded by fewer than all keys never reach anyone who could test an id
against them; node ids never leave this process.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from tqdm.auto import tqdm

from clients.service_http import (
    RetryPolicy,
)
from clients.transport import PeerConnection
from secure.psi import BlindingKey, hash_to_group, pack, unpack

log = logging.getLogger(__name__)

SET_ENCODING = "ristretto255"


class AlignmentFailed(RuntimeError):
    """The alignment finished without a usable shared node index."""


@dataclass(frozen=True)
class AlignmentOutcome:
    alignment_id: str
    party: int
    parties: int
    seed: int  # the split's seed, chosen by whoever created the alignment
    rows: np.ndarray  # int64 per own row: its aligned index, -1 where not shared
    aligned_nodes: int  # N: the intersection's size, or the union's
    digest: str  # SHA-256 of the sorted aligned index: the same at every party
    nodes: str = "intersection"  # or "union": partly shared nodes
    shared_nodes: int | None = None  # the intersection's size


class AlignmentClient(PeerConnection):
    """Party ``party``'s calls to the alignment routes of the service."""

    peers = "parties"
    peers_hint = "is their `glasu align` running?"

    def __init__(
        self,
        *,
        base_url: str,
        alignment_id: str,
        party: int,
        token: str,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        retry: RetryPolicy | None = None,
        poll_seconds: float = 30.0,
        peer_wait_seconds: float = 900.0,
        timeout: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.alignment_id = alignment_id
        self.party = party
        super().__init__(
            base_url=base_url,
            token=token,
            transport=transport,
            verify=verify,
            retry=retry,
            poll_seconds=poll_seconds,
            peer_wait_seconds=peer_wait_seconds,
            timeout=timeout,
            sleep=sleep,
        )

    @property
    def _party_path(self) -> str:
        return f"/v1/alignments/{self.alignment_id}/parties/{self.party}"

    def status(self) -> dict[str, Any]:
        return self._request("GET", f"/v1/alignments/{self.alignment_id}").json()

    def post_set(self, owner: int, hop: int, elements: Sequence[bytes]) -> None:
        self._request(
            "PUT",
            f"{self._party_path}/sets/{owner}/hops/{hop}",
            content=pack(elements),
            headers={
                "Content-Type": "application/octet-stream",
                "X-Glasu-Encoding": SET_ENCODING,
                "X-Glasu-Shape": str(len(elements)),
            },
        )

    def fetch_set(self, owner: int, hop: int) -> list[bytes]:
        return unpack(self._wait_for(f"{self._party_path}/sets/{owner}/hops/{hop}").content)

    def fetch_positions(self) -> np.ndarray:
        body = self._wait_for(f"{self._party_path}/positions").content
        return np.frombuffer(body, dtype="<i8").astype(np.int64)


def align(
    client: AlignmentClient,
    ids: Sequence[str],
    *,
    key: BlindingKey | None = None,
    progress: bool = False,
) -> AlignmentOutcome:
    """Run this party's side of the alignment over ``ids`` (its own node ids, distinct, in row
    order) and return where each row sits in the aligned node index."""
    seen: set[str] = set()
    for node in ids:
        if node in seen:
            raise ValueError(f"the ids are not distinct: {node!r} twice")
        seen.add(node)
    status = client.status()
    parties, m = int(status["parties"]), client.party
    key = key or BlindingKey()
    order = list(range(len(ids)))
    random.SystemRandom().shuffle(order)  # positions reveal nothing about the ids
    bar = tqdm(
        total=len(ids) * parties,
        desc=f"alignment (party {m})",
        unit=" ids",
        unit_scale=True,
        disable=not progress,
        leave=False,
    )
    try:
        own = []
        for row in order:
            own.append(key.blind(hash_to_group(client.alignment_id, ids[row])))
            bar.update(1)
        client.post_set(m, 0, own)
        for hop in range(1, parties):
            owner = (m - hop) % parties
            received = client.fetch_set(owner, hop - 1)
            blinded = []
            for element in received:
                blinded.append(key.blind(element))
            client.post_set(owner, hop, blinded)
            bar.update(len(ids))
        positions = client.fetch_positions()
    finally:
        bar.close()
    if positions.shape != (len(ids),):
        raise AlignmentFailed(
            f"the service answered {positions.size} positions for the {len(ids)} ids posted"
        )
    rows = np.empty(len(ids), dtype=np.int64)
    rows[np.asarray(order, dtype=np.int64)] = positions
    status = client.status()
    nodes = str(status.get("nodes", "intersection"))
    aligned = int(status["aligned_nodes"])
    mine = rows[rows >= 0]
    # the ids every party holds (a service from before the union mode reports only N)
    shared = mine.size if status.get("shared_nodes") is None else int(status["shared_nodes"])
    if shared == 0:
        raise AlignmentFailed(
            f"the {parties} parties share no node id, so there is nothing to train on. Check "
            "that every party took its ids from the same kind of column and writes them the "
            "same way (ids are compared as text: '42' and '042' differ)"
        )
    one_to_one = np.unique(mine).size == mine.size and np.all(mine < aligned)
    covered = mine.size == len(ids) if nodes == "union" else mine.size == aligned
    if not (one_to_one and covered):
        raise AlignmentFailed(
            f"the positions do not map this party's ids one to one onto the {aligned} aligned "
            f"nodes ({nodes})"
        )
    return AlignmentOutcome(
        alignment_id=client.alignment_id,
        party=m,
        parties=parties,
        seed=int(status["seed"]),
        rows=rows,
        aligned_nodes=aligned,
        digest=str(status["digest"]),
        nodes=nodes,
        shared_nodes=shared,
    )
