"""Alignment updates, the service's side (docs/protocol.md, "Alignment updates"): an alignment
created with a ``base`` (a done alignment the service kept) takes from each party only its delta:
the ids it added, blinded around the ring as any set, and the positions of its kept set it
removed. Once all are in, the service applies them to the base's kept sets
(:mod:`service.alignment.incremental`), keeps the result under the update (the base keeps
nothing more: only the last alignment of a chain can be updated) and answers each party only
what changed for it. The parties check the service's statement of the base
(``base_kept_digest``, read anew from the kept sets when the update is created) against what
they recorded, so that a service that lost or altered them is refused before anything is
posted.
"""

from __future__ import annotations

import numpy as np

from secure.wire.alignment import AlignmentChanges, AlignmentCreate
from service.alignment.incremental import (
    ELEMENT,
    KeptSets,
    UpdateRefused,
    apply_update,
    check_removed,
)
from service.alignment.kept_tables import KeptTables
from service.alignment.tables import AlignmentRow, AlignmentTables
from service.domain_errors import AlignmentConflict, AlignmentNotFound, BadPayload
from service.store import Transaction

REMOVED_BYTES = 8  # little-endian int64 per removed position


def base_statement(tx: Transaction, request: AlignmentCreate) -> str:
    """The kept digest of the base that ``request`` updates, read anew from its kept sets;
    refused when the base cannot be updated."""
    assert request.base is not None
    base = AlignmentTables(tx).alignment(request.base)
    if base is None:
        raise AlignmentNotFound(request.base)
    if base.state != "done" or not base.keep:
        raise AlignmentConflict(
            f"alignment {base.id!r} is not a done alignment the service keeps: only such a one "
            "can be updated (create the first with keep)"
        )
    if (base.parties, base.nodes) != (request.parties, request.nodes):
        raise AlignmentConflict(
            f"alignment {base.id!r} has {base.parties} parties over the {base.nodes}: an update "
            "of it has the same"
        )
    return _kept_sets(tx, base).digest()


def _kept_sets(tx: Transaction, base: AlignmentRow) -> KeptSets:
    kept = KeptTables(tx).kept(base.id)
    if kept is None or base.aligned_nodes is None:
        raise AlignmentConflict(
            f"the service no longer keeps the sets of alignment {base.id!r} (an update of it "
            "completed since, or they were lost): align afresh"
        )
    return KeptSets.from_bodies(*kept, base.aligned_nodes)


def put_removed(tx: Transaction, row: AlignmentRow, party: int, body: bytes) -> bool:
    """Store ``party``'s removed positions (int64 each); False: the same were posted before."""
    if row.base is None:
        raise AlignmentConflict(
            f"alignment {row.id!r} is not an update: it takes no removed positions"
        )
    if len(body) % REMOVED_BYTES:
        raise BadPayload(f"removed positions are int64, {REMOVED_BYTES} bytes each")
    kept = KeptTables(tx)
    posted = kept.removed(row.id).get(party)
    if posted is not None:
        if posted != body:
            raise AlignmentConflict("this party's removed positions were posted before, others")
        return False
    elements = kept.kept_elements(row.base, party)
    if elements is None:
        raise AlignmentConflict(f"the service no longer keeps the sets of {row.base!r}")
    try:
        check_removed(np.frombuffer(body, "<i8").astype(np.int64), np.frombuffer(elements, ELEMENT))
    except UpdateRefused as exc:
        raise BadPayload(str(exc)) from None
    kept.insert_removed(row.id, party, body)
    return True


def removed_counts(tx: Transaction, alignment_id: str) -> dict[int, int]:
    return {
        owner: len(body) // REMOVED_BYTES
        for owner, body in KeptTables(tx).removed(alignment_id).items()
    }


def complete_update(tx: Transaction, row: AlignmentRow) -> None:
    """Once every fully blinded added set and every party's removed positions are in: the
    update applied to the base's kept sets, kept under ``row``, and each party's changes."""
    assert row.base is not None
    tables, kept = AlignmentTables(tx), KeptTables(tx)
    last = row.parties - 1
    removed = kept.removed(row.id)
    if len(removed) < row.parties or any(
        tables.set(row.id, owner, last) is None for owner in range(row.parties)
    ):
        return
    base_row = tables.alignment(row.base)
    if base_row is None:
        raise AlignmentNotFound(row.base)
    base = _kept_sets(tx, base_row)
    if base.digest() != row.base_kept_digest:
        raise AlignmentConflict(
            f"the kept sets of {row.base!r} changed since this update was created: align afresh"
        )
    added = [
        np.frombuffer(tables.set_body(row.id, owner, last), ELEMENT) for owner in range(row.parties)
    ]
    gone = [np.frombuffer(removed[owner], "<i8").astype(np.int64) for owner in range(row.parties)]
    try:
        result = apply_update(base, added, gone)
    except UpdateRefused as exc:
        raise BadPayload(f"the update does not apply to the kept sets: {exc}") from None
    kept.drop_kept(base_row.id)
    kept.insert_kept(row.id, *result.kept.bodies())
    kept.insert_changes(
        row.id,
        [
            AlignmentChanges(
                removed=change.removed.tolist(),
                inserted=change.inserted.tolist(),
                positions=change.positions.tolist(),
                kept_positions=change.kept_positions,
            )
            .model_dump_json()
            .encode("utf-8")
            for change in result.changes
        ],
    )
    tables.complete(
        row.id,
        aligned_nodes=result.kept.aligned_nodes,
        shared_nodes=result.kept.aligned_nodes,
        digest=result.digest,
        positions=None,
        kept_digest=result.kept.digest(),
    )


def keep_fresh(tx: Transaction, row: AlignmentRow, bodies: list[bytes], positions: list[bytes],
               aligned_nodes: int) -> str:  # fmt: skip
    """Keep a fresh alignment's fully blinded sets and positions; their kept digest."""
    sets = KeptSets.from_bodies(bodies, positions, aligned_nodes)
    KeptTables(tx).insert_kept(row.id, bodies, positions)
    return sets.digest()


def changes(tx: Transaction, row: AlignmentRow, party: int) -> AlignmentChanges | None:
    """``party``'s changes once the update is done (None: not yet)."""
    body = KeptTables(tx).changes(row.id, party)
    return None if body is None else AlignmentChanges.model_validate_json(body)
