"""Private entity alignment, one party's side (docs/protocol.md, "Alignment"; the service's side
is ``service/alignment/``).

Party m of M, with a fresh secret key: hashes each of its own node ids into ristretto255
(``secure/psi.py``), blinds them, shuffles them with a secret permutation and posts them (hop 0).
Then, for hops 1..M-1, it fetches the set of party m - h blinded by parties m - h .. m - 1,
checks it (signed by party m - 1 when given peer keys, distinct canonical elements, the size its
owner declared: a service that deviates could otherwise hand it guessed ids to blind), blinds it
in place (the order stays, so that its owner can find its rows again) and posts it, signed when
given a signing key (``clients/alignment_signing.py``; the ring's turns are
``clients/alignment_ring.py``).
Last it fetches, for each position of the set it posted, the index of that id in the aligned
node index (-1 where not every party holds it), and undoes its permutation. An update of a kept
alignment runs the same ring over the parties' deltas only (``clients/alignment_update.py``).
The ids, their hashes and anything blinded by fewer than all keys never reach anyone who could
test an id against them (against a service that deviates, only with signatures:
docs/threat-model.md); node ids never leave this process.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx
import numpy as np
from tqdm.auto import tqdm

from clients.alignment_keeping import KeptAlignment, id_keys
from clients.alignment_ring import AlignmentFailed, checked_signing, declared_set, run_ring
from clients.alignment_signing import SetSigning
from clients.cores import available_cores
from clients.service_http import ConnectionOptions, PeerConnection
from secure.psi import ELEMENT_BYTES, BlindingKey
from secure.wire.alignment import (
    SET_ENCODING,
    AlignmentChanges,
    AlignmentStatus,
    set_part_span,
    set_parts,
)
from secure.wire.headers import ENCODING_HEADER, SHAPE_HEADER, SIGNATURE_HEADER

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")
POSITION_BYTES = 8  # little-endian int64: one aligned index per element posted


@dataclass(frozen=True)
class RelayedSet:
    body: bytes
    signature: str | None  # X-Glasu-Signature as relayed: hex, or None when unsigned


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
    kept: KeptAlignment | None = None  # what this party keeps for the next alignment


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
        options: ConnectionOptions | None = None,
    ) -> None:
        self.alignment_id = alignment_id
        self.party = party
        self._part_elements: int | None = None  # the alignment's, from its status
        super().__init__(base_url=base_url, token=token, options=options or ConnectionOptions())

    @property
    def _party_path(self) -> str:
        return f"/v1/alignments/{self.alignment_id}/parties/{self.party}"

    def status(self) -> AlignmentStatus:
        response = self._request("GET", f"/v1/alignments/{self.alignment_id}")
        status = AlignmentStatus.model_validate_json(response.content)
        self._part_elements = status.part_elements
        return status

    @property
    def part_elements(self) -> int:
        """Elements per part of the alignment's sets and positions."""
        if self._part_elements is None:
            return self.status().part_elements
        return self._part_elements

    def post_set(self, owner: int, hop: int, body: bytes, *, signature: str | None = None) -> None:
        """``body``: the packed elements, posted part by part; ``signature``: hex, over the
        whole set (each part carries it), relayed to the next party."""
        size = len(body) // ELEMENT_BYTES
        headers = {
            "Content-Type": "application/octet-stream",
            ENCODING_HEADER: SET_ENCODING,
            SHAPE_HEADER: str(size),
        }
        if signature is not None:
            headers[SIGNATURE_HEADER] = signature
        for part, span in enumerate(self._spans(size)):
            self._request(
                "PUT",
                f"{self._party_path}/sets/{owner}/hops/{hop}",
                params={"part": part},
                content=body[span.start * ELEMENT_BYTES : span.stop * ELEMENT_BYTES],
                headers=headers,
            )

    def fetch_set(self, owner: int, hop: int) -> RelayedSet:
        """The whole set, part by part (the first part long-polled); the signature the parts
        carry (all the same: ValueError otherwise)."""
        parts = self._fetch_parts(f"{self._party_path}/sets/{owner}/hops/{hop}", ELEMENT_BYTES)
        signatures = {part.headers.get(SIGNATURE_HEADER) for part in parts}
        if len(signatures) > 1:
            raise ValueError("its parts carry different signatures")
        return RelayedSet(b"".join(part.content for part in parts), signatures.pop())

    def fetch_positions(self) -> np.ndarray:
        parts = self._fetch_parts(f"{self._party_path}/positions", POSITION_BYTES)
        body = b"".join(part.content for part in parts)
        return np.frombuffer(body, dtype="<i8").astype(np.int64)

    def post_removed(self, positions: np.ndarray) -> None:
        """An update's removed positions of this party's kept set (int64 each)."""
        self._request(
            "PUT",
            f"{self._party_path}/removed",
            content=np.asarray(positions, dtype="<i8").tobytes(),
            headers={"Content-Type": "application/octet-stream"},
        )

    def fetch_changes(self) -> AlignmentChanges:
        """What an update changed for this party (long-polled)."""
        response = self._wait_for(f"{self._party_path}/changes")
        return AlignmentChanges.model_validate_json(response.content)

    def _spans(self, size: int) -> list[range]:
        part_elements = self.part_elements
        parts = set_parts(size, part_elements)
        return [set_part_span(k, size=size, part_elements=part_elements) for k in range(parts)]

    def _fetch_parts(self, path: str, item_bytes: int) -> list[httpx.Response]:
        """Every part at ``path``: the first long-polled, it says the whole size
        (X-Glasu-Shape); each part's length is checked against its span."""
        first = self._wait_for(f"{path}?part=0")
        shape = first.headers.get(SHAPE_HEADER, "")
        if not shape.isdigit():
            raise ValueError(f"the service answered {SHAPE_HEADER} {shape!r}")
        responses = [first]
        spans = self._spans(int(shape))
        for part in range(1, len(spans)):
            responses.append(self._request("GET", path, params={"part": part}))
        for part, (span, response) in enumerate(zip(spans, responses, strict=True)):
            if len(response.content) != len(span) * item_bytes:
                raise ValueError(
                    f"its part {part} has {len(response.content) / item_bytes:g} elements where "
                    f"{SHAPE_HEADER} declares {shape} in all, {len(span)} in this part"
                )
        return responses


def align(
    client: AlignmentClient,
    ids: Sequence[str],
    *,
    key: BlindingKey | None = None,
    signing: SetSigning | None = None,
    progress: bool = False,
    workers: int | None = None,
    keep: bool = False,
    now: float | None = None,
) -> AlignmentOutcome:
    """Run this party's side of a fresh alignment over ``ids`` (its own node ids, distinct, in
    row order) and return where each row sits in the aligned node index. ``signing``: sign the
    sets posted and, given peer keys, blind only sets the peer posted. ``workers``: processes
    that blind (default: the cores available). ``keep``: the service keeps the alignment (it was
    created with keep) and the outcome's ``kept`` is what this party keeps for an update
    (``clients/alignment_update.py``), made at ``now`` (seconds since the epoch)."""
    workers = available_cores() if workers is None else workers
    check_distinct(ids)
    status = client.status()
    parties, m = status.parties, client.party
    if status.base is not None:
        raise AlignmentFailed(
            f"alignment {client.alignment_id} updates alignment {status.base}: take part with "
            "this party's kept alignment of it"
        )
    if keep and not status.keep:
        raise AlignmentFailed(
            f"alignment {client.alignment_id} was not created to be kept (keep): the service "
            "will not keep it, so it could not be updated"
        )
    key = key or BlindingKey()
    signing = checked_signing(signing, parties, m)
    order = list(range(len(ids)))
    random.SystemRandom().shuffle(order)  # positions reveal nothing about the ids
    bar = progress_bar(len(ids) * parties, m, progress)
    try:
        own = blind_own_ids(key, client.alignment_id, [ids[row] for row in order], workers, bar)
        blinded = len(ids) + run_ring(client, signing, key, own, parties, workers, bar.update)
        positions = answered(client.fetch_positions, "positions")
    finally:
        bar.close()
    if positions.shape != (len(ids),):
        raise AlignmentFailed(
            f"the service answered {positions.size} positions for the {len(ids)} ids posted"
        )
    rows = np.empty(len(ids), dtype=np.int64)
    rows[np.asarray(order, dtype=np.int64)] = positions
    status = client.status()
    outcome = checked_outcome(client, status, rows, own_size=len(ids))
    if not keep:
        return outcome
    if status.kept_digest is None:
        raise AlignmentFailed("the service answered without keeping the alignment it was to keep")
    row_positions = np.empty(len(ids), dtype=np.int64)
    row_positions[np.asarray(order, dtype=np.int64)] = np.arange(len(ids))
    kept = KeptAlignment.with_key(
        key,
        domain=client.alignment_id,
        parties=parties,
        party=m,
        now=time.time() if now is None else now,
    ).placed(
        alignment_id=client.alignment_id,
        kept_digest=status.kept_digest,
        aligned_nodes=outcome.aligned_nodes,
        keys=id_keys(ids),
        positions=row_positions,
        aligned=positions,
        updated=False,
        blinded=blinded,
    )
    return dataclasses.replace(outcome, kept=kept)


def answered(fetch: Callable[[], Answer], what: str) -> Answer:
    """``fetch()``, the service's answer at the end of an alignment; AlignmentFailed where it
    is not usable."""
    try:
        return fetch()
    except ValueError as exc:
        raise AlignmentFailed(f"the service's {what} are not usable: {exc}") from None


def progress_bar(total: int, party: int, progress: bool) -> tqdm:
    return tqdm(
        total=total,
        desc=f"alignment (party {party})",
        unit=" ids",
        unit_scale=True,
        disable=not progress,
        leave=False,
    )


def blind_own_ids(
    key: BlindingKey, domain: str, ids: Sequence[str], workers: int, bar: tqdm
) -> list[bytes]:
    """Each id hashed under ``domain`` and blinded, in order."""
    blinded: list[bytes] = []
    for chunk in key.blind_ids(domain, ids, workers=workers):
        blinded.extend(chunk)
        bar.update(len(chunk))
    return blinded


def checked_outcome(
    client: AlignmentClient, status: AlignmentStatus, rows: np.ndarray, *, own_size: int
) -> AlignmentOutcome:
    """The outcome of ``rows`` (each own row's aligned index), checked against the status:
    this party's set of ``own_size`` declared, done, a shared node, one to one."""
    m = client.party
    _check_own_size(status, m, own_size)
    nodes = status.nodes
    if status.aligned_nodes is None or status.digest is None:
        raise AlignmentFailed("the service answered the positions before the alignment was done")
    aligned = status.aligned_nodes
    mine = rows[rows >= 0]
    # the ids every party holds (a service from before the union mode reports only N)
    shared = mine.size if status.shared_nodes is None else status.shared_nodes
    if shared == 0:
        raise AlignmentFailed(
            f"the {status.parties} parties share no node id, so there is nothing to train on. "
            "Check that every party took its ids from the same kind of column and writes them "
            "the same way (ids are compared as text: '42' and '042' differ)"
        )
    one_to_one = np.unique(mine).size == mine.size and np.all(mine < aligned)
    covered = mine.size == rows.size if nodes == "union" else mine.size == aligned
    if not (one_to_one and covered):
        raise AlignmentFailed(
            f"the positions do not map this party's ids one to one onto the {aligned} aligned "
            f"nodes ({nodes})"
        )
    return AlignmentOutcome(
        alignment_id=client.alignment_id,
        party=m,
        parties=status.parties,
        seed=status.seed,
        rows=rows,
        aligned_nodes=aligned,
        digest=status.digest,
        nodes=nodes,
        shared_nodes=shared,
    )


def check_distinct(ids: Sequence[str]) -> None:
    seen: set[str] = set()
    for node in ids:
        if node in seen:
            raise ValueError(f"the ids are not distinct: {node!r} twice")
        seen.add(node)


def _check_own_size(status: AlignmentStatus, party: int, size: int) -> None:
    try:
        declared = declared_set(status, party).size
    except ValueError as exc:
        raise AlignmentFailed(str(exc)) from None
    if declared != size:
        raise AlignmentFailed(
            f"the status declares {declared} ids for this party's set, which holds {size}"
        )
