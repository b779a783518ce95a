"""The group operations of the private entity alignment (docs/protocol.md, "Alignment"): a
Diffie-Hellman private set intersection over ristretto255, with libsodium's own functions
(``rbcl`` bundles libsodium and wraps its ristretto255 API; no group arithmetic here).

A node id becomes a group element by a domain-separated SHA-512 (the tag names the alignment, so
values of one alignment say nothing in another) and libsodium's hash-to-group; each party raises
elements to its secret scalar. Exponentiation commutes, so an id blinded by every party's key is
the same element whichever party holds it, and nothing less than all keys makes it comparable.

Torch-free and numpy-free: the service validates the elements it relays with
:func:`check_elements`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import rbcl

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
    """One party's secret scalar for one alignment (fresh, never stored)."""

    def __init__(self, scalar: bytes | None = None) -> None:
        if scalar is None:
            scalar = rbcl.crypto_core_ristretto255_scalar_random()
        self._scalar = scalar

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
