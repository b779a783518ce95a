"""Private entity alignment: the service's side of the ring PSI (docs/protocol.md, "Alignment").

M parties each hold a set of node ids. Each blinds its own set with its secret key, shuffles
it and posts it (hop 0); the set then travels the ring: party ``owner + h`` (mod M) blinds hop
``h - 1`` further and posts hop ``h``, keeping the order. After hop M - 1 every element carries
every key, so equal ids have become equal elements. The service only relays: a set at
``(owner, hop)`` is served to the next blinder, party ``owner + hop + 1``, and the fully blinded
sets are served to nobody. Every set, and each owner's positions, travel in parts of the
alignment's ``part_elements`` elements (``secure.wire.alignment.set_part_span``); a set counts
as posted once all its parts are in. A set may come with its poster's signature (over the whole
set, the same on each part), which the service relays
without checking (it holds no key: the parties do, docs/threat-model.md). When all M are in,
the service intersects them, sorts the intersection (the aligned index) and keeps, for each
owner, the aligned index of every position of its set (-1 where not shared); then it drops
every set body and signature, except, for an alignment created with ``keep``, the fully blinded
sets, which an update (``base``) then extends with the parties' deltas
(:mod:`service.alignment.updates`). The checks of a part that need no state are
:mod:`service.alignment.set_checks`.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from secure.psi import ELEMENT_BYTES, index_sets
from secure.wire.alignment import (
    AlignmentChanges,
    AlignmentCreate,
    AlignmentCreated,
    AlignmentStatus,
    SetProgress,
    set_parts,
)
from secure.wire.headers import SHAPE_HEADER
from service.alignment import updates
from service.alignment.set_checks import (
    check_body,
    check_distinct,
    check_like_the_other_parts,
    declared_signature,
    declared_size,
    part_span,
)
from service.alignment.tables import (
    AlignmentRow,
    AlignmentTables,
    PartRow,
    SetRow,
    create_alignment_tables,
)
from service.domain_errors import (
    AlignmentConflict,
    AlignmentNotFound,
    AlignmentNotReady,
    AlignmentSlotForbidden,
    WrongShape,
)
from service.notify import Pending
from service.store import Store, Transaction
from service.tokens import new_tokens, token_sha256

POSITIONS_ENCODING = "int64"


@dataclass(frozen=True)
class PartyCaller:
    alignment_id: str
    party: int


@dataclass(frozen=True)
class SetPart:
    """Part ``part`` of a set (or of positions) of ``size`` elements in all."""

    body: bytes
    size: int
    signature: bytes | None = None


@dataclass(frozen=True)
class SetHead:
    """The headers of a posted part of a blinded set, as they came (None: absent): the whole
    set's element count, the encoding and the poster's signature of the whole set (hex)."""

    shape: str | None
    encoding: str | None
    signature: str | None = None


@dataclass(frozen=True)
class SetUpload:
    created: bool
    size: int
    parts: int


def next_blinder(owner: int, hop: int, parties: int) -> int:
    """The party that blinds the set of ``owner`` after hop ``hop`` (and may fetch it)."""
    return (owner + hop + 1) % parties


def poster(owner: int, hop: int, parties: int) -> int:
    """The party that posts the set of ``owner`` at hop ``hop``."""
    return (owner + hop) % parties


class AlignmentManager:
    def __init__(self, store: Store, *, max_body_bytes: int | None = None) -> None:
        self.store = store
        self.max_body_bytes = max_body_bytes  # stated in every status
        create_alignment_tables(store)

    # -- admin -----------------------------------------------------------------------------------

    def create(self, request: AlignmentCreate) -> AlignmentCreated:
        """``request.part_elements`` set (the route fills in the service's choice)."""
        assert request.part_elements is not None
        alignment_id = uuid.uuid4().hex
        tokens = new_tokens(request.parties)
        if (request.keep or request.base) and request.nodes != "intersection":
            raise AlignmentConflict("only an alignment of the intersection is kept and updated")
        with self.store.transaction() as tx:
            statement = None if request.base is None else updates.base_statement(tx, request)
            AlignmentTables(tx).insert(
                alignment_id,
                parties=request.parties,
                seed=request.seed,
                label=request.label,
                nodes=request.nodes,
                part_elements=request.part_elements,
                token_hashes=[token_sha256(t) for t in tokens],
                keep=request.keep or request.base is not None,
                base=request.base,
                base_kept_digest=statement,
            )
        return AlignmentCreated(
            alignment_id=alignment_id,
            party_tokens=tokens,
            parties=request.parties,
            seed=request.seed,
            nodes=request.nodes,
            part_elements=request.part_elements,
        )

    def status(self, alignment_id: str) -> AlignmentStatus:
        with self.store.transaction() as tx:
            tables = AlignmentTables(tx)
            row = _alignment(tables, alignment_id)
            sets = tables.sets(alignment_id)
            removed = updates.removed_counts(tx, alignment_id) if row.base else {}
        progress = []
        for owner in range(row.parties):
            own = [s for s in sets if s.owner == owner]
            size = next((s.size for s in own if s.hop == 0), None)
            progress.append(
                SetProgress(owner=owner, size=size, hops=len(own), removed=removed.get(owner))
            )
        return AlignmentStatus(
            alignment_id=row.id,
            label=row.label,
            parties=row.parties,
            seed=row.seed,
            state=row.state,  # type: ignore[arg-type]
            created_at=row.created_at,
            sets=progress,
            nodes=row.nodes,  # type: ignore[arg-type]
            part_elements=row.part_elements,
            max_body_bytes=self.max_body_bytes,
            aligned_nodes=row.aligned_nodes,
            shared_nodes=row.shared_nodes,
            digest=row.digest.hex() if row.digest is not None else None,
            keep=row.keep,
            kept_digest=row.kept_digest,
            base=row.base,
            base_kept_digest=row.base_kept_digest,
        )

    def party_of_token(self, token_hash: bytes) -> tuple[str, int] | None:
        with self.store.transaction() as tx:
            return AlignmentTables(tx).token_owner(token_hash)

    def exists(self, alignment_id: str) -> bool:
        with self.store.transaction() as tx:
            return AlignmentTables(tx).alignment(alignment_id) is not None

    # -- parties ---------------------------------------------------------------------------------

    def check_set_head(
        self, caller: PartyCaller, owner: int, hop: int, part: int, head: SetHead
    ) -> tuple[int, bytes | None, range, int]:
        """The checks of :meth:`put_set` that need no body (headers, part, who posts the
        slot), run before the body is read so that a refused upload is answered on its head;
        the set's size, its signature's bytes, the part's span and the set's part count."""
        signed = declared_signature(head.signature)
        with self.store.transaction() as tx:
            row = _alignment(AlignmentTables(tx), caller.alignment_id)
        size = declared_size(head.shape, head.encoding, update=row.base is not None)
        span = part_span(part, size, row.part_elements)
        _check_poster(row, caller, owner, hop)
        return size, signed, span, set_parts(size, row.part_elements)

    def put_set(
        self, caller: PartyCaller, owner: int, hop: int, part: int, head: SetHead, body: bytes
    ) -> SetUpload:
        """Store part ``part`` of the set of ``owner`` at ``hop``, posted by ``caller``;
        complete the alignment when it was the last part of the last fully blinded set."""
        size, signed, span, parts = self.check_set_head(caller, owner, hop, part, head)
        check_body(body, len(span))  # before the store's lock: it costs ~10 us an element
        digest = hashlib.sha256(body).digest()
        with self.store.transaction() as tx:
            tables = AlignmentTables(tx)
            row = _alignment(tables, caller.alignment_id)
            _check_poster(row, caller, owner, hop)
            posted = tables.parts(row.id, owner, hop)
            same = next((p for p in posted if p.part == part), None)
            if same is not None:
                if (same.sha256, same.signature, same.size) != (digest, signed, size):
                    raise AlignmentConflict(
                        f"part {part} of hop {hop} of the set of party {owner} was already "
                        "posted with a different body, size or signature; a part is posted once"
                    )
                return SetUpload(created=False, size=size, parts=parts)
            check_like_the_other_parts(posted, size=size, signature=signed)
            if hop > 0:
                previous = tables.set(row.id, owner, hop - 1)
                if previous is None:
                    raise AlignmentNotReady(
                        f"hop {hop - 1} of the set of party {owner} is not in yet: blind the set "
                        "you fetched, not another"
                    )
                if previous.size != size:
                    raise WrongShape(
                        f"the set of party {owner} has {previous.size} elements, "
                        f"{SHAPE_HEADER} says {size}"
                    )
            tables.insert_part(
                row.id, owner, hop, part, size=size, sha256=digest, body=body, signature=signed
            )
            if len(posted) + 1 == parts:
                if parts > 1:
                    check_distinct(tables.set_body(row.id, owner, hop))
                every = sorted([*posted, PartRow(part, size, digest, signed)], key=_part_index)
                digests = b"".join(p.sha256 for p in every)
                tables.insert_set(
                    row.id,
                    owner,
                    hop,
                    sha256=hashlib.sha256(digests).digest(),
                    size=size,
                    signature=signed,
                )
                if hop == row.parties - 1:
                    _complete_if_ready(tx, row)
        return SetUpload(created=True, size=size, parts=parts)

    def get_set(self, caller: PartyCaller, owner: int, hop: int, part: int) -> SetPart | Pending:
        """Part ``part`` of the set of ``owner`` at ``hop``, once all its parts are in."""
        with self.store.transaction() as tx:
            tables = AlignmentTables(tx)
            row = _alignment(tables, caller.alignment_id)
            _check_slot(row, owner, hop)
            if hop == row.parties - 1:
                raise AlignmentSlotForbidden(
                    "a fully blinded set is served to nobody; fetch your positions instead"
                )
            receiver = next_blinder(owner, hop, row.parties)
            if caller.party != receiver:
                raise AlignmentSlotForbidden(
                    f"hop {hop} of the set of party {owner} goes to party {receiver} only"
                )
            found = tables.set(row.id, owner, hop)
            if found is None:
                return Pending(missing=[poster(owner, hop, row.parties)])
            if row.state == "done":
                raise AlignmentConflict(
                    f"alignment {row.id!r} is complete and its blinded sets are discarded; "
                    "fetch your positions"
                )
            span = part_span(part, found.size, row.part_elements)
            body = tables.part_body(row.id, owner, hop, part)
        if body is None or len(body) != len(span) * ELEMENT_BYTES:
            raise LookupError(f"part {part} of a complete set of alignment {row.id} is missing")
        return SetPart(body, found.size, found.signature)

    def positions(self, caller: PartyCaller, part: int) -> SetPart | Pending:
        """For each position of part ``part`` of the set ``caller`` posted, its aligned index
        (-1: not shared), as little-endian int64."""
        with self.store.transaction() as tx:
            tables = AlignmentTables(tx)
            row = _alignment(tables, caller.alignment_id)
            if row.base is not None:
                raise AlignmentConflict(
                    f"alignment {row.id!r} updates {row.base!r}: fetch your changes instead"
                )
            if row.state == "done":
                own = tables.set(row.id, caller.party, 0)
                if own is None:
                    raise LookupError(f"alignment {row.id} is done without party sets")
                span = part_span(part, own.size, row.part_elements)
                body = tables.positions(row.id, caller.party, span)
                if body is None:  # every owner's positions are written with the state
                    raise LookupError(f"alignment {row.id} is done without positions")
                return SetPart(body, own.size)
            sets = tables.sets(row.id)
        return Pending(missing=_owing(sets, row.parties))

    def put_removed(self, caller: PartyCaller, body: bytes) -> bool:
        """An update's removed positions of ``caller``'s kept set (False: a duplicate)."""
        with self.store.transaction() as tx:
            row = _alignment(AlignmentTables(tx), caller.alignment_id)
            created = updates.put_removed(tx, row, caller.party, body)
            if created:
                _complete_if_ready(tx, row)
        return created

    def changes(self, caller: PartyCaller) -> AlignmentChanges | Pending:
        """What an update changed for ``caller``, once done."""
        with self.store.transaction() as tx:
            tables = AlignmentTables(tx)
            row = _alignment(tables, caller.alignment_id)
            if row.base is None:
                raise AlignmentConflict(
                    f"alignment {row.id!r} is not an update: fetch your positions instead"
                )
            found = updates.changes(tx, row, caller.party)
            if found is not None:
                return found
            sets = tables.sets(row.id)
            owing = set(_owing(sets, row.parties))
            owing |= set(range(row.parties)) - set(updates.removed_counts(tx, row.id))
        return Pending(missing=sorted(owing))


def _part_index(row: PartRow) -> int:
    return row.part


def _alignment(tables: AlignmentTables, alignment_id: str) -> AlignmentRow:
    row = tables.alignment(alignment_id)
    if row is None:
        raise AlignmentNotFound(alignment_id)
    return row


def _check_slot(row: AlignmentRow, owner: int, hop: int) -> None:
    if owner >= row.parties or hop >= row.parties:
        raise AlignmentSlotForbidden(
            f"alignment {row.id!r} has {row.parties} parties: owners and hops run from 0 to "
            f"{row.parties - 1}, got owner {owner}, hop {hop}"
        )


def _check_poster(row: AlignmentRow, caller: PartyCaller, owner: int, hop: int) -> None:
    _check_slot(row, owner, hop)
    expected = poster(owner, hop, row.parties)
    if caller.party != expected:
        raise AlignmentSlotForbidden(
            f"party {caller.party} cannot post hop {hop} of the set of party {owner}: "
            f"party {expected} blinds it there"
        )


def _owing(sets: list[SetRow], parties: int) -> list[int]:
    posted = {(s.owner, s.hop) for s in sets}
    return sorted(
        {
            poster(owner, hop, parties)
            for owner in range(parties)
            for hop in range(parties)
            if (owner, hop) not in posted
        }
    )


def _complete_if_ready(tx: Transaction, row: AlignmentRow) -> None:
    """Once every owner's fully blinded set is in: intersect (or unite), sort, map each owner's
    positions to the aligned index, keep the sets where asked, and drop the bodies. An update
    applies its deltas instead (:func:`updates.complete_update`)."""
    if row.base is not None:
        updates.complete_update(tx, row)
        return
    tables = AlignmentTables(tx)
    last = row.parties - 1
    if any(tables.set(row.id, owner, last) is None for owner in range(row.parties)):
        return
    bodies = [tables.set_body(row.id, owner, last) for owner in range(row.parties)]
    # every stored part was checked to hold distinct elements (check_elements)
    indexed = index_sets(bodies, union=row.nodes == "union")
    kept_digest = None
    if row.keep:
        kept_digest = updates.keep_fresh(tx, row, bodies, indexed.positions, indexed.aligned_nodes)
    tables.complete(
        row.id,
        aligned_nodes=indexed.aligned_nodes,
        shared_nodes=indexed.shared_nodes,
        digest=indexed.digest,
        positions=indexed.positions,
        kept_digest=kept_digest,
    )
