"""A kept alignment: what one party keeps of an alignment so that the next one, an update, costs
only the ids added or removed since (docs/data.md, "The kept alignment"; docs/protocol.md,
"Alignment updates"; docs/threat-model.md, "Entity alignment").

The private set intersection (``clients/alignment.py``) costs one libsodium exponentiation per id
per party and hop. A party that keeps its secret key and the hash domain (the first alignment's
id) turns every id it blinds again into the same element; the service keeps every owner's fully
blinded set of a kept alignment (``service/alignment/incremental.py``). An update then moves only
deltas: each party blinds the ids it added (and the others' added ids, around the ring) and posts
the positions of its kept set whose ids it removed; the service answers what changed. So a party
keeps, besides its key: the last alignment's id and the service's digest of what it keeps of it
(the next update's base must match both), the aligned index's size, and its own per-position
map: its ids (sorted, with their kept positions) and each position's aligned index (-1: not
shared, or a hole where an id was removed). Every lookup is a numpy search over sorted arrays.

The kept file (:func:`kept_location`: with the organisation's ledger, or ``alignment.kept`` in
the party's own folder; mode 0600) holds the secret scalar
(:class:`~secure.masking.secret_material.SecretBytes`: never shown), and an HMAC-SHA256 under a
key derived from it over everything else; a file that was changed, or belongs to another party or
another federation, is refused with its path. Keys rotate (a fresh alignment, new keys, a new
domain) after ``MAX_UPDATES`` updates or ``MAX_AGE_SECONDS``, or on request (``--realign``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from secure.files import FileFormat, atomic_write
from secure.masking.secret_material import SecretBytes
from secure.psi import BlindingKey
from secure.wire.alignment import AlignmentChanges

KEPT_FILE = "alignment.kept"
KEPT_FORMAT = FileFormat("glasu-kept-alignment", 2, "glasu kept alignment")
SCALAR_KIND = "alignment blinding scalar"
MAX_UPDATES = 30  # updates under one key before the next alignment is a fresh one
MAX_AGE_SECONDS = 30 * 24 * 3600.0  # the same, for the key's age
_TAG_PERSON = b"glasu-kept-tag"  # blake2b personalisation of the file's MAC key


class KeptAlignmentError(ValueError):
    """A kept alignment that cannot be used (its message names the file)."""


def id_keys(ids: Sequence[str]) -> np.ndarray:
    """The ids as numpy bytes, compared and searched as their UTF-8: numpy drops trailing NULs,
    so a last byte that is none keeps "a" and "a\\0" apart."""
    return np.array([node.encode("utf-8") + b"." for node in ids], dtype=bytes)


@dataclass(frozen=True)
class Delta:
    """A party's current ids against its kept alignment."""

    added_rows: np.ndarray  # rows of the current ids that the kept alignment does not hold
    removed_positions: np.ndarray  # kept positions whose ids are gone (sorted)
    row_positions: np.ndarray  # each current row's kept position (-1: added)
    keys: np.ndarray  # each current row's id key
    order: np.ndarray  # the rows by key (``keys[order]`` sorted)


@dataclass
class KeptAlignment:
    """One party's kept alignment: its key, the hash domain, and its per-position map."""

    domain: str  # the id of the alignment that made the keys: every id is hashed under it
    parties: int
    party: int
    scalar: SecretBytes
    created_at: float  # when the key was made (seconds since the epoch)
    updates: int = 0  # alignments run with it after the one that made it
    alignment_id: str = ""  # the last alignment: the next update's base
    kept_digest: str = ""  # the service's digest of what it keeps of that one
    aligned_nodes: int = 0
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, "S1"), repr=False)  # sorted
    id_positions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    aligned: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    blinded_last: int = 0  # exponentiations the last alignment took here (not kept on disk)

    @classmethod
    def fresh(cls, *, domain: str, parties: int, party: int, now: float) -> KeptAlignment:
        return cls.with_key(BlindingKey(), domain=domain, parties=parties, party=party, now=now)

    @classmethod
    def with_key(
        cls, key: BlindingKey, *, domain: str, parties: int, party: int, now: float
    ) -> KeptAlignment:
        scalar = key.secret(kind=SCALAR_KIND)
        return cls(domain=domain, parties=parties, party=party, scalar=scalar, created_at=now)

    @property
    def key(self) -> BlindingKey:
        return BlindingKey(self.scalar.reveal())

    def rotation_due(self, now: float) -> str | None:
        """Why the next alignment must be a fresh one (new keys), or None."""
        if self.updates >= MAX_UPDATES:
            return f"its keys have served {self.updates} updates (at most {MAX_UPDATES})"
        age = now - self.created_at
        if age >= MAX_AGE_SECONDS:
            return (
                f"its keys are {age / 86400:.0f} days old (at most {MAX_AGE_SECONDS / 86400:.0f})"
            )
        return None

    def check_fits(self, *, parties: int, party: int, where: str) -> None:
        if (self.parties, self.party) != (parties, party):
            raise KeptAlignmentError(
                f"{where} is the kept alignment of party {self.party} of {self.parties}, not of "
                f"party {party} of {parties}: each party keeps its own (or realign)"
            )

    def placed(
        self, alignment_id: str, kept_digest: str, aligned_nodes: int, *, keys: np.ndarray,
        positions: np.ndarray, aligned: np.ndarray, updated: bool, blinded: int,
        order: np.ndarray | None = None,
    ) -> KeptAlignment:  # fmt: skip
        """This kept alignment after an alignment that placed ``keys`` (each id's key) at
        kept ``positions``, whose aligned index per position is ``aligned``; ``order``: the
        keys' sorting order, where known."""
        order = np.argsort(keys, kind="stable") if order is None else order
        return dataclasses.replace(
            self,
            updates=self.updates + 1 if updated else 0,
            alignment_id=alignment_id,
            kept_digest=kept_digest,
            aligned_nodes=aligned_nodes,
            ids=keys[order],
            id_positions=positions[order].astype(np.int64),
            aligned=aligned.astype(np.int64),
            blinded_last=blinded,
        )

    def delta(self, ids: Sequence[str]) -> Delta:
        """The current ``ids`` (in row order) against what is kept; ValueError naming an id
        found twice."""
        keys = id_keys(ids)
        order = np.argsort(keys, kind="stable")
        twice = np.flatnonzero(keys[order][1:] == keys[order][:-1])
        if twice.size:
            raise ValueError(f"the ids are not distinct: {ids[order[twice[0]]]!r} twice")
        row_positions = np.full(keys.size, -1, np.int64)
        live = np.zeros(self.ids.size, dtype=bool)
        if self.ids.size and keys.size:
            at = np.minimum(np.searchsorted(self.ids, keys), self.ids.size - 1)
            found = self.ids[at] == keys
            row_positions[found] = self.id_positions[at[found]]
            live[at[found]] = True
        return Delta(
            order=order,
            added_rows=np.flatnonzero(row_positions < 0),
            removed_positions=np.sort(self.id_positions[~live]),
            row_positions=row_positions,
            keys=keys,
        )

    def applied(self, delta: Delta, added_positions: np.ndarray, changes: AlignmentChanges,
                aligned_nodes: int) -> np.ndarray:  # fmt: skip
        """Each kept position's aligned index after an update (the base's map, ``changes``
        and this party's ``delta`` with its added rows at ``added_positions``), checked: a
        service whose changes do not fit this party's kept alignment raises ValueError."""
        removed = np.asarray(changes.removed, np.int64)
        inserted = np.asarray(changes.inserted, np.int64)
        positions = np.asarray(changes.positions, np.int64)
        old = self.aligned_nodes
        added = delta.added_rows.size
        if changes.kept_positions != self.aligned.size + added:
            raise ValueError(
                f"they count {changes.kept_positions} kept positions where this party has "
                f"{self.aligned.size} and added {added}"
            )
        if not (_indices(removed, old) and _indices(inserted, aligned_nodes)):
            raise ValueError("their removed or inserted aligned nodes are not distinct indices")
        if old - removed.size != aligned_nodes - inserted.size or positions.size != inserted.size:
            raise ValueError(
                f"{old} aligned nodes less {removed.size} removed plus {inserted.size} inserted "
                f"are not the {aligned_nodes} the status declares"
            )
        lost = self.aligned[delta.removed_positions]
        if not np.isin(lost[lost >= 0], removed).all():
            raise ValueError("they keep an aligned node whose id this party removed")
        survivors = np.ones(old, dtype=bool)
        survivors[removed] = False
        old_to_new = np.full(old, -1, np.int64)
        old_to_new[survivors] = np.setdiff1d(np.arange(aligned_nodes), inserted)
        aligned = np.concatenate([self.aligned, np.full(added, -1, np.int64)])
        aligned = np.where(aligned >= 0, old_to_new[np.maximum(aligned, 0)], -1)
        aligned[delta.removed_positions] = -1
        live = np.zeros(aligned.size, dtype=bool)
        live[delta.row_positions[delta.row_positions >= 0]] = True
        live[added_positions] = True
        if not _indices(positions, aligned.size) or not (
            live[positions].all() and (aligned[positions] < 0).all()
        ):
            raise ValueError("an inserted node's position is not one of this party's unaligned ids")
        aligned[positions] = inserted
        return aligned


def _indices(values: np.ndarray, size: int) -> bool:
    """Distinct indices into ``size`` items."""
    inside = values.size == 0 or (values.min() >= 0 and values.max() < size)
    return bool(inside and np.unique(values).size == values.size)


# -- the file ------------------------------------------------------------------------------------


def _tag(scalar: SecretBytes, payload: bytes) -> bytes:
    key = hashlib.blake2b(scalar.reveal(), digest_size=32, person=_TAG_PERSON).digest()
    return hmac.new(key, payload, hashlib.sha256).digest()


def kept_location(folders: Sequence[Path], party: int) -> Path:
    """Where party ``party`` of the federation of ``folders`` keeps its alignment: with its
    organisation's ledger (``$XDG_DATA_HOME/glasu/alignments/<organisation>/``), one file per
    federation it is in (named by a digest of every party's organisation), so that every copy of
    its data (its tables prepared again) finds it; in a folder without an organisation (a
    benchmark partition's), ``<folder>/alignment.kept``."""
    from clients.owner_ledger import folder_organisation, organisations_folder

    names = [folder_organisation(Path(folder)) for folder in folders]
    own = names[party]
    if own is None:
        return Path(folders[party]) / KEPT_FILE
    federation = hashlib.sha256("\n".join(str(n) for n in names).encode("utf-8")).hexdigest()
    return organisations_folder() / "alignments" / own / f"federation-{federation[:16]}.kept"


def deployed_kept_location(folder: Path, server: str, party: int) -> Path:
    """Where ``glasu align run`` keeps party ``party``'s alignment through the service at
    ``server``: with the folder's organisation's ledger
    (``$XDG_DATA_HOME/glasu/alignments/<organisation>/service-<digest>-party-<m>.kept``, named
    by a digest of the service's address), so that tables prepared again find it; in a folder
    without an organisation, ``<folder>/alignment.kept``."""
    from clients.owner_ledger import folder_organisation, organisations_folder

    own = folder_organisation(Path(folder))
    if own is None:
        return Path(folder) / KEPT_FILE
    service = hashlib.sha256(server.rstrip("/").encode("utf-8")).hexdigest()[:16]
    return organisations_folder() / "alignments" / own / f"service-{service}-party-{party}.kept"


def write_kept(kept: KeptAlignment, path: Path) -> Path:
    """The kept alignment at ``path``, mode 0600, written atomically."""
    header = {
        **KEPT_FORMAT.header(),
        "domain": kept.domain,
        "parties": kept.parties,
        "party": kept.party,
        "created_at": kept.created_at,
        "updates": kept.updates,
        "alignment_id": kept.alignment_id,
        "kept_digest": kept.kept_digest,
        "aligned_nodes": kept.aligned_nodes,
    }
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
        "ids": kept.ids,
        "id_positions": kept.id_positions,
        "aligned": kept.aligned,
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    payload = buffer.getvalue()
    atomic_write(path, kept.scalar.reveal() + _tag(kept.scalar, payload) + payload)
    return path


def read_kept(path: Path, *, parties: int, party: int) -> KeptAlignment | None:
    """The kept alignment at ``path`` (None: there is none), checked: untouched since it was
    written, of this party of this many parties; :class:`KeptAlignmentError` naming it
    otherwise."""
    path = Path(path)
    if not path.exists():
        return None
    where = str(path)
    data = path.read_bytes()
    scalar_bytes, tag, payload = data[:32], data[32:64], data[64:]
    scalar = SecretBytes(scalar_bytes, kind=SCALAR_KIND)
    if len(data) < 64 or not hmac.compare_digest(tag, _tag(scalar, payload)):
        raise KeptAlignmentError(
            f"{where} was changed since glasu wrote it (its MAC does not match its key): not "
            "using it; realign to start a fresh one"
        )
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
            header = json.loads(arrays["header"].tobytes().decode("utf-8"))
            problem = KEPT_FORMAT.problem(header, name=where)
            if problem is not None:
                raise KeptAlignmentError(f"{problem}: realign to start a fresh one")
            ids, id_positions, aligned = arrays["ids"], arrays["id_positions"], arrays["aligned"]
    except (KeyError, ValueError, OSError) as exc:
        if isinstance(exc, KeptAlignmentError):
            raise
        raise KeptAlignmentError(f"{where} is not a readable glasu kept alignment: {exc}") from None
    kept = KeptAlignment(
        domain=str(header["domain"]),
        parties=int(header["parties"]),
        party=int(header["party"]),
        scalar=scalar,
        created_at=float(header["created_at"]),
        updates=int(header["updates"]),
        alignment_id=str(header["alignment_id"]),
        kept_digest=str(header["kept_digest"]),
        aligned_nodes=int(header["aligned_nodes"]),
        ids=ids,
        id_positions=id_positions,
        aligned=aligned,
    )
    kept.check_fits(parties=parties, party=party, where=where)
    return kept


def check_one_federation(kept: Sequence[KeptAlignment], where: Sequence[str]) -> None:
    """Every party's kept alignment hashes under the same domain (else no id would match) and
    keeps the same alignment (the next update's base): :class:`KeptAlignmentError` naming the
    first that differs from party 0's."""
    for m, (one, name) in enumerate(zip(kept, where, strict=True)):
        if one.domain != kept[0].domain:
            raise KeptAlignmentError(
                f"{name} is a kept alignment of another federation (domain {one.domain[:12]}..., "
                f"party 0's is {kept[0].domain[:12]}...), so party {m}'s ids would match none "
                "of the others': realign"
            )
        if one.alignment_id != kept[0].alignment_id:
            raise KeptAlignmentError(
                f"{name} keeps alignment {one.alignment_id[:12]}..., party 0's keeps "
                f"{kept[0].alignment_id[:12]}...: one of them was not updated last time; realign"
            )
