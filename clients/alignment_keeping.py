"""A kept alignment: what one party keeps of an alignment so that the next one blinds only the ids
added since (docs/data.md, "Scoring new customers"; docs/threat-model.md, "Entity alignment").

The private set intersection (``clients/alignment.py``) costs one libsodium exponentiation per id
per party and hop. With a fresh secret key every time, scoring 50 new customers re-blinds every
table. A party that keeps its key instead (and the hash domain: the first alignment's id) turns
every id it blinded before into the same element again, so it keeps what it computed: its own
ids' blinded elements and, for each hop it blinds, each element it received with the element it
posted back. The next alignment runs the same ring over the parties' whole current tables, with
the same messages and checks, but a party looks up what it blinded before and blinds only the
rest: the ids added since, at every hop. The ids removed since are simply absent from its
tables, and their memories are dropped. The outcome is the alignment of the current tables.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from secure.files import FileFormat, atomic_write
from secure.masking.secret_material import SecretBytes
from secure.psi import ELEMENT_BYTES, BlindingKey, check_elements

KEPT_FILE = "alignment.kept"
KEPT_FORMAT = FileFormat("glasu-kept-alignment", 1, "glasu kept alignment")
SCALAR_KIND = "alignment blinding scalar"
MAX_UPDATES = 30  # updates under one key before the next alignment is a fresh one
MAX_AGE_SECONDS = 30 * 24 * 3600.0  # the same, for the key's age
_TAG_PERSON = b"glasu-kept-tag"  # blake2b personalisation of the file's MAC key
_ELEMENT = f"S{ELEMENT_BYTES}"  # numpy bytes: equal, ordered and looked up as the 32 bytes


class KeptAlignmentError(ValueError):
    """A kept alignment that cannot be used (its message names the file)."""


def _elements(values: Sequence[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(values), dtype=_ELEMENT) if values else np.empty(0, _ELEMENT)


def _id_key(node: str) -> bytes:
    """An id as numpy bytes compare it: numpy drops trailing NULs, so a last byte that is none
    keeps "a" and "a\\0" apart."""
    return node.encode("utf-8") + b"."


def _as_list(array: np.ndarray) -> list[bytes]:
    raw = np.ascontiguousarray(array, dtype=_ELEMENT).tobytes()
    return [raw[i : i + ELEMENT_BYTES] for i in range(0, len(raw), ELEMENT_BYTES)]


@dataclass(frozen=True)
class Memory:
    """Inputs (sorted, distinct) and what this party's key made of each."""

    inputs: np.ndarray
    outputs: np.ndarray

    @classmethod
    def empty(cls, dtype: str = _ELEMENT) -> Memory:
        return cls(np.empty(0, dtype), np.empty(0, _ELEMENT))

    @classmethod
    def of(cls, inputs: np.ndarray, outputs: np.ndarray) -> Memory:
        order = np.argsort(inputs, kind="stable")
        return cls(inputs[order], outputs[order])

    @property
    def distinct(self) -> bool:
        return not (self.inputs[1:] == self.inputs[:-1]).any()

    def lookup(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, outputs): which queries it holds, and their outputs (zeros elsewhere)."""
        outputs = np.zeros(queries.size, dtype=_ELEMENT)
        if not self.inputs.size or not queries.size:
            return np.zeros(queries.size, dtype=bool), outputs
        at = np.minimum(np.searchsorted(self.inputs, queries), self.inputs.size - 1)
        found = self.inputs[at] == queries
        outputs[found] = self.outputs[at[found]]
        return found, outputs


@dataclass
class KeptAlignment:
    """One party's kept alignment: its key, the hash domain and what it blinded last time."""

    domain: str  # the id of the alignment that made the keys: every id is hashed under it
    parties: int
    party: int
    scalar: SecretBytes
    created_at: float  # when the key was made (seconds since the epoch)
    updates: int = 0  # alignments run with it after the one that made it
    own: Memory = field(default_factory=lambda: Memory.empty("S1"), repr=False)  # id -> blinded
    hops: list[Memory] = field(default_factory=list, repr=False)  # hop 1..M-1: received -> posted
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


class RunBlinding:
    """One alignment's blinding at one party, through its kept alignment: what it blinded before
    is looked up, the rest blinded with its key; what this run blinded becomes the new memory."""

    def __init__(self, kept: KeptAlignment, *, workers: int, remember: bool = True) -> None:
        self.kept = kept
        self.key = kept.key
        self.workers = workers
        # False: an alignment nobody keeps (a fresh one's memory is empty): no lookup, no memory
        self.remember = remember
        self.blinded = 0
        self._own = Memory.empty("S1")
        self._hops: dict[int, Memory] = {}

    def own(
        self, ids: Sequence[str], *, done: Callable[[int], object] = lambda n: None
    ) -> list[bytes]:
        """Each id hashed under the kept domain and blinded, in order; ``done(n)`` as each n
        are (for a progress bar)."""
        if not self.remember:
            blinded = []
            for chunk in self.key.blind_ids(self.kept.domain, ids, workers=self.workers):
                blinded.extend(chunk)
                done(len(chunk))
            self.blinded += len(ids)
            return blinded
        queries = np.array([_id_key(node) for node in ids], dtype=bytes)
        found, outputs = self.kept.own.lookup(queries)
        missing = np.flatnonzero(~found)
        done(len(ids) - missing.size)
        fresh: list[bytes] = []
        for chunk in self.key.blind_ids(
            self.kept.domain, [ids[i] for i in missing], workers=self.workers
        ):
            fresh.extend(chunk)
            done(len(chunk))
        if missing.size:
            outputs[missing] = _elements(fresh)
            self.blinded += missing.size
        self._own = Memory.of(queries, outputs)
        return _as_list(outputs)

    def relayed(self, hop: int, elements: Sequence[bytes]) -> list[bytes]:
        """Each element of a set received at ``hop`` blinded, in order, after the checks of
        :func:`secure.psi.check_elements` (an element it blinded before was checked then: only
        its distinctness is checked again)."""
        if not self.remember:
            check_elements(elements)
            self.blinded += len(elements)
            fresh = self.key.blind_elements(elements, workers=self.workers)
            return [element for chunk in fresh for element in chunk]
        queries = _elements(elements)
        memory = self.kept.hops[hop - 1] if hop - 1 < len(self.kept.hops) else Memory.empty()
        found, outputs = memory.lookup(queries)
        missing = np.flatnonzero(~found)
        if missing.size:
            new = [elements[i] for i in missing]
            check_elements(new)
            fresh = self.key.blind_elements(new, workers=self.workers)
            outputs[missing] = _elements([e for chunk in fresh for e in chunk])
            self.blinded += missing.size
        self._hops[hop] = Memory.of(queries, outputs)
        if not self._hops[hop].distinct:
            check_elements(elements)  # it names the element found twice
        return _as_list(outputs)

    def result(self, *, updated: bool) -> KeptAlignment:
        """The kept alignment after this run (``updated``: it ran on a kept one)."""
        if not self.remember:
            raise ValueError("this alignment's blinding was not remembered: nothing to keep")
        return dataclasses.replace(
            self.kept,
            updates=self.kept.updates + 1 if updated else 0,
            own=self._own,
            hops=[self._hops.get(hop, Memory.empty()) for hop in range(1, self.kept.parties)],
            blinded_last=self.blinded,
        )


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


def write_kept(kept: KeptAlignment, path: Path) -> Path:
    """The kept alignment at ``path``, mode 0600, written atomically."""
    header = {
        **KEPT_FORMAT.header(),
        "domain": kept.domain,
        "parties": kept.parties,
        "party": kept.party,
        "created_at": kept.created_at,
        "updates": kept.updates,
    }
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
        "own_inputs": kept.own.inputs,
        "own_outputs": kept.own.outputs,
    }
    for hop, memory in enumerate(kept.hops, start=1):
        arrays[f"hop{hop}_inputs"] = memory.inputs
        arrays[f"hop{hop}_outputs"] = memory.outputs
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
                raise KeptAlignmentError(problem)
            hops = [
                Memory(arrays[f"hop{h}_inputs"], arrays[f"hop{h}_outputs"])
                for h in range(1, int(header["parties"]))
            ]
            own = Memory(arrays["own_inputs"], arrays["own_outputs"])
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
        own=own,
        hops=hops,
    )
    kept.check_fits(parties=parties, party=party, where=where)
    return kept


def check_one_federation(kept: Sequence[KeptAlignment], where: Sequence[str]) -> None:
    """Every party's kept alignment hashes under the same domain (else no id would match):
    :class:`KeptAlignmentError` naming the first that differs from party 0's."""
    for m, (one, name) in enumerate(zip(kept, where, strict=True)):
        if one.domain != kept[0].domain:
            raise KeptAlignmentError(
                f"{name} is a kept alignment of another federation (domain {one.domain[:12]}..., "
                f"party 0's is {kept[0].domain[:12]}...), so party {m}'s ids would match none "
                "of the others': realign"
            )
