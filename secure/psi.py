"""The group operations of the private entity alignment (docs/protocol.md, "Alignment"): a
Diffie-Hellman private set intersection over ristretto255, with libsodium's own functions
(``rbcl`` bundles libsodium and wraps its ristretto255 API; no group arithmetic here).

A node id becomes a group element by a domain-separated SHA-512 (the tag names the alignment, so
values of one alignment say nothing in another) and libsodium's hash-to-group; each party raises
elements to its secret scalar. Exponentiation commutes, so an id blinded by every party's key is
the same element whichever party holds it, and nothing less than all keys makes it comparable.

Blinding many elements is libsodium's scalar multiplication, one core per element: it runs in
chunks over processes (``workers``). The intersection or union of the fully blinded sets and each
set's positions in it come from one integer sort in numpy (:func:`index_sets`).

Torch-free: the service validates the elements it relays with :func:`check_elements`.
"""

from __future__ import annotations

import hashlib
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import rbcl

from secure.masking.secret_material import SecretBytes

ELEMENT_BYTES = rbcl.crypto_core_ristretto255_BYTES  # 32: one encoded group element
IDENTITY = bytes(ELEMENT_BYTES)  # the neutral element's encoding: never a blinded id
DOMAIN_TAG = b"glasu/alignment/v1/ristretto255-sha512"


def length_prefixed(*fields: bytes) -> bytes:
    """The fields, each after its length as 8 big-endian bytes: no two field lists share it."""
    return b"".join(len(field).to_bytes(8, "big") + field for field in fields)


def id_digest(alignment_id: str, node_id: str) -> bytes:
    """SHA-512 of the id under a tag that names this alignment."""
    fields = length_prefixed(DOMAIN_TAG, alignment_id.encode("utf-8"), node_id.encode("utf-8"))
    return hashlib.sha512(fields).digest()


def hash_to_group(alignment_id: str, node_id: str) -> bytes:
    """The id as a ristretto255 element (libsodium's uniform hash-to-group of the digest)."""
    return bytes(rbcl.crypto_core_ristretto255_from_hash(id_digest(alignment_id, node_id)))


class BlindingKey:
    """One party's secret scalar for one alignment (fresh; kept only by a party that keeps its
    alignment for updates, ``clients/alignment_keeping.py``)."""

    def __init__(self, scalar: bytes | None = None) -> None:
        if scalar is None:
            scalar = rbcl.crypto_core_ristretto255_scalar_random()
        self._scalar = scalar

    def secret(self, *, kind: str) -> SecretBytes:
        """The scalar, for a party that keeps it (``clients/alignment_keeping.py``)."""
        return SecretBytes(self._scalar, kind=kind)

    def blind(self, element: bytes) -> bytes:
        """``element`` raised to this key; refuses an invalid or non-canonical encoding or the
        identity."""
        if not _top_bit_clear(element):
            raise ValueError("not a blindable ristretto255 element: bit 255 is set")
        try:
            return bytes(rbcl.crypto_scalarmult_ristretto255(self._scalar, element))
        except RuntimeError as exc:  # libsodium's refusal of a bad element
            raise ValueError(f"not a blindable ristretto255 element: {exc}") from None

    def blind_all(self, elements: Iterable[bytes]) -> list[bytes]:
        return [self.blind(e) for e in elements]

    def blind_ids(
        self, alignment_id: str, ids: Sequence[str], *, workers: int = 1
    ) -> Iterator[list[bytes]]:
        """Each id hashed to the group and blinded, in order, a chunk at a time (for a progress
        bar), over ``workers`` processes."""
        return _in_chunks(_blind_ids, (self._scalar, alignment_id), ids, workers)

    def blind_elements(
        self, elements: Sequence[bytes], *, workers: int = 1
    ) -> Iterator[list[bytes]]:
        """:meth:`blind` of each element, in order, a chunk at a time, over ``workers``
        processes."""
        return _in_chunks(_blind_elements, (self._scalar,), elements, workers)


PARALLEL_FROM = 8_192  # fewer elements are blinded in this process: a pool costs ~0.5 s to start
CHUNKS_PER_WORKER = 8


def _in_chunks(
    work: Callable[..., list[bytes]], fixed: tuple, items: Sequence, workers: int
) -> Iterator[list[bytes]]:
    """``work(*fixed, chunk)`` over consecutive chunks of ``items``, results in order. Processes
    are spawned, not forked: a caller may have threads (``glasu train --party`` aligns its
    parties in threads), and a fork would copy their locks held. As with any spawned pool, the
    main module must import without side effects (the ``if __name__ == "__main__"`` idiom)."""
    if workers <= 1 or len(items) < PARALLEL_FROM:
        size = max(len(items) // 16, 1024)
        for start in range(0, len(items), size):
            yield work(*fixed, items[start : start + size])
        return
    size = -(-len(items) // (workers * CHUNKS_PER_WORKER))
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield from pool.map(work, *([value] * len(chunks) for value in fixed), chunks)


def _blind_ids(scalar: bytes, alignment_id: str, ids: Sequence[str]) -> list[bytes]:
    key = BlindingKey(scalar)
    return [key.blind(hash_to_group(alignment_id, node)) for node in ids]


def _blind_elements(scalar: bytes, elements: Sequence[bytes]) -> list[bytes]:
    return BlindingKey(scalar).blind_all(elements)


def pack(elements: Sequence[bytes]) -> bytes:
    """Elements as one body: ``len(elements) * ELEMENT_BYTES`` bytes, in order."""
    return b"".join(elements)


def unpack(body: bytes) -> list[bytes]:
    if len(body) % ELEMENT_BYTES:
        raise ValueError(
            f"a set body is a whole number of {ELEMENT_BYTES}-byte elements, got {len(body)} bytes"
        )
    return [body[i : i + ELEMENT_BYTES] for i in range(0, len(body), ELEMENT_BYTES)]


def _top_bit_clear(element: bytes) -> bool:
    # The libsodium that rbcl bundles decodes an element ignoring bit 255 (later libsodium
    # refuses it), so x and x + 2^255 would be two spellings of one element.
    return not element[-1] & 0x80


def is_canonical(element: bytes) -> bool:
    """A canonical ristretto255 encoding of an element other than the identity."""
    return (
        len(element) == ELEMENT_BYTES
        and element != IDENTITY
        and _top_bit_clear(element)
        and bool(rbcl.crypto_core_ristretto255_is_valid_point(element))
    )


def check_elements(elements: Sequence[bytes]) -> None:
    """Every element a canonical ristretto255 encoding (not the identity), all distinct."""
    first: dict[bytes, int] = {}
    for index, element in enumerate(elements):
        if not is_canonical(element):
            raise ValueError(
                f"element {index} is not a valid ristretto255 group element (an invalid or "
                "non-canonical encoding, or the identity)"
            )
        if element in first:
            raise ValueError(
                f"the set holds the same element twice (elements {first[element]} and {index})"
            )
        first[element] = index


@dataclass(frozen=True)
class IndexedSets:
    """The aligned index of fully blinded sets and where each set's elements sit in it."""

    aligned_nodes: int  # N: the intersection's size, or the union's
    shared_nodes: int  # the intersection's size
    digest: bytes  # SHA-256 of the sorted aligned index (its packed elements)
    positions: list[bytes]  # per set: "<i8" per element, its index in the aligned index or -1


def index_sets(bodies: Sequence[bytes], *, union: bool = False) -> IndexedSets:
    """The fully blinded sets (packed bodies, each of distinct elements) intersected, or united,
    and sorted (byte order): the aligned index; and for each set, each element's place in it.
    Every element is four big-endian 64-bit words (words compared in order are the bytes compared
    in order): one integer sort of all sets together groups equal elements."""
    for body in bodies:
        if len(body) % ELEMENT_BYTES:
            raise ValueError(
                f"a set body is a whole number of {ELEMENT_BYTES}-byte elements, got "
                f"{len(body)} bytes"
            )
    raw = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(-1, ELEMENT_BYTES)
    words = raw.view(">u8").astype(np.uint64)  # (elements, 4)
    order = np.argsort(words[:, 0], kind="stable")  # blinded elements: word 0 all but decides
    ranked = words[order]
    tie = ranked[1:, 0] == ranked[:-1, 0]
    if (tie & (ranked[1:, 1:] != ranked[:-1, 1:]).any(axis=1)).any():  # two elements share it
        order = np.lexsort(words.T[::-1])  # by word 0, then 1, 2, 3
        ranked = words[order]
    starts = np.ones(len(ranked), dtype=bool)  # the first of each run of equal elements
    starts[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
    group = np.cumsum(starts) - 1
    holders = np.bincount(group)  # the sets holding each distinct element (they are distinct)
    shared = holders == len(bodies)
    kept = np.ones_like(shared) if union else shared
    index = np.where(kept, np.cumsum(kept) - 1, -1)
    place = np.empty(len(ranked), dtype="<i8")
    place[order] = index[group]
    firsts = order[np.flatnonzero(starts)[kept]]
    bounds = np.cumsum([len(body) // ELEMENT_BYTES for body in bodies])[:-1]
    return IndexedSets(
        aligned_nodes=int(kept.sum()),
        shared_nodes=int(shared.sum()),
        digest=hashlib.sha256(raw[firsts].tobytes()).digest(),
        positions=[part.tobytes() for part in np.split(place, bounds)],
    )
